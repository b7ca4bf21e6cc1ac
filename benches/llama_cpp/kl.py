"""llama.cpp's side of BENCHMARKS.md's 8-bit accuracy comparison: the same
GGUF file and the same token windows as `quant-kl`, each evaluated from an
empty context with every position's logits kept, judged against the
reference log-probabilities `quant-kl --ref-out` wrote (tokenwire's f32
path) over the same scored positions (the last half of each window):

    /tmp/llama/bin/python benches/llama_cpp/kl.py FILE.gguf --ids IDS.json --ref REF.f32

Prints one line in `quant-kl`'s form: KL(f32 || llama.cpp) mean, standard
error, 99th percentile and largest, top-1 agreement, ln perplexity; with
`--ours KL.f64` (`quant-kl --kl-out`), also the mean of tokenwire's KL minus
llama.cpp's, position by position, with its standard error.
"""
import argparse
import json

import numpy as np
from llama_cpp import Llama, llama_print_system_info

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--ids", required=True)
p.add_argument("--ref", required=True)
p.add_argument("--ours")
p.add_argument("--threads", type=int, default=2)
a = p.parse_args()

windows = json.load(open(a.ids))
length = len(windows[0])
scored_from = length // 2
llm = Llama(model_path=a.model, n_ctx=length, n_batch=length, n_ubatch=length,
            n_threads=a.threads, n_threads_batch=a.threads, logits_all=True, verbose=False)
vocab = llm.n_vocab()
ref = np.fromfile(a.ref, dtype="<f4").reshape(-1, vocab)
expected = len(windows) * (length - 1 - scored_from)
if ref.shape[0] != expected:
    raise SystemExit(f"{a.ref}: {ref.shape[0]} rows, the windows score {expected}")

kls, same_top, nll, ref_nll, at = [], 0, 0.0, 0.0, 0
for w in windows:
    llm.reset()
    llm.eval(w)
    logits = np.array(llm.scores[:length], dtype=np.float64)
    for pos in range(scored_from, length - 1):
        row = logits[pos]
        lq = row - row.max()
        lq -= np.log(np.exp(lq).sum())
        lp = ref[at].astype(np.float64)
        kls.append(max(0.0, float((np.exp(lp) * (lp - lq)).sum())))
        same_top += int(lp.argmax() == lq.argmax())
        nll -= lq[w[pos + 1]]
        ref_nll -= lp[w[pos + 1]]
        at += 1

k = np.array(kls)
n = len(k)
tier = llama_print_system_info().decode().strip()
print(f"llama.cpp int8 vs tokenwire f32: KL mean {k.mean():.6f} ± {k.std(ddof=1) / np.sqrt(n):.6f}, "
      f"p99 {np.sort(k)[min(int(n * 0.99), n - 1)]:.6f}, max {k.max():.6f}, "
      f"top-1 agreement {100 * same_top / n:.2f}% ({same_top}/{n}), "
      f"ln PPL {nll / n:.4f} vs f32 {ref_nll / n:.4f}  [{tier}]")
if a.ours:
    ours = np.fromfile(a.ours, dtype="<f8")
    d = ours - k
    print(f"tokenwire KL - llama.cpp KL, position by position: mean {d.mean():+.6f} ± "
          f"{d.std(ddof=1) / np.sqrt(n):.6f}; tokenwire lower at {(d < 0).sum()} of {n}")
