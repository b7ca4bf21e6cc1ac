"""Prompt scoring on both sides, from the same GGUF file and the same token
ids: llama.cpp (llama-cpp-python with `logits_all`, each row's log-softmax
as its `echo` with `logprobs` computes it) and tokenwire's `POST
/v1/completions` with `echo`, `logprobs: 1` and one token (what
lm-evaluation-harness sends for log-likelihoods) on a running server:

    benches/llama_cpp/score.sh FILE.gguf [INPUTS] [ROUNDS]

Prints how far each side's logprobs of each prompt token are from a
reference, tokenwire's f32 path on a second server (the largest and the
mean absolute difference, and of each prompt's sum): both sides quantize
activations to 8 bits for 4-bit weights, in their own ways, and the words
are random, so most tokens are unlikely and their logprobs far from 0;
then each side's prompt tokens per second: tokenwire one prompt a request
and every prompt in one request (a batch), llama.cpp one prompt at a time
(its Python API scores one sequence at a time), with and without the
log-softmax; and for scale each side's plain prefill of the same prompts
(no scores). The inputs are seeded sentences of 20 to 160 words, as ids
from llama.cpp's tokenizer (BOS first), sent to both sides as ids.
"""
import argparse
import json
import random
import time
import urllib.request

import numpy as np
from llama_cpp import Llama

WORDS = ("the a little girl boy dog cat park ball tree river bird sun rain house garden "
         "friend happy sad big small red blue green ran jumped saw found played sang "
         "looked under over near with and but then one day every morning after school "
         "because they she he it was were is are very quickly slowly together").split()

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--url", required=True, help="tokenwire's base URL, http://HOST:PORT")
p.add_argument("--reference", required=True, help="a tokenwire server on the f32 path")
p.add_argument("--name", required=True, help="the model's name on that server")
p.add_argument("--inputs", type=int, default=32)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()

rng = random.Random(a.seed)
texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 160))).capitalize() + "."
         for _ in range(a.inputs)]
llm = Llama(model_path=a.model, logits_all=True, n_ctx=2048, n_batch=2048, n_ubatch=512,
            n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
prompts = [llm.tokenize(t.encode(), add_bos=True, special=True) for t in texts]
tokens = sum(len(x) for x in prompts)


def post(body, url=None):
    req = urllib.request.Request((url or a.url) + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def tokenwire(batch, echo=True, url=None):
    body = {"model": a.name, "prompt": batch, "max_tokens": 1, "temperature": 0}
    if echo:
        body.update(echo=True, logprobs=1)
    reply = post(body, url)
    choices = sorted(reply["choices"], key=lambda c: c["index"])
    if not echo:
        return None
    # The prompt's tokens: all but the one generated.
    return [c["logprobs"]["token_logprobs"][1:len(ids)] for c, ids in zip(choices, batch)]


def llama_scores(ids, softmax=True):
    llm.reset()
    llm.eval(ids)
    if not softmax:
        return None
    rows = np.array(llm.scores[: len(ids) - 1], dtype=np.float64)
    rows -= rows.max(axis=1, keepdims=True)
    lse = np.log(np.exp(rows).sum(axis=1))
    return [float(rows[k, ids[k + 1]] - lse[k]) for k in range(len(ids) - 1)]


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


reference = tokenwire(prompts, url=a.reference)
sides = {"tokenwire (8-bit)": tokenwire(prompts),
         "llama.cpp (8-bit)": [llama_scores(ids) for ids in prompts]}
print(f"{a.inputs} prompts, {tokens} tokens, against tokenwire's f32 path:")
for side, got in sides.items():
    diffs = [abs(x - y) for g, r in zip(got, reference) for x, y in zip(g, r)]
    sums = [abs(sum(g) - sum(r)) for g, r in zip(got, reference)]
    print(f"  {side}: per-token |logprob difference| largest {max(diffs):.4f}, mean "
          f"{sum(diffs) / len(diffs):.4f}; per-prompt sum largest {max(sums):.3f}, mean "
          f"{sum(sums) / len(sums):.3f}")
ours, theirs = sides.values()
diffs = [abs(x - y) for o, t in zip(ours, theirs) for x, y in zip(o, t)]
print(f"  tokenwire against llama.cpp: largest {max(diffs):.4f}, mean {sum(diffs) / len(diffs):.4f}")

rows = []
for r in range(a.rounds):
    fig = {}
    _, t = timed(lambda: tokenwire(prompts))
    fig["tokenwire scoring, one request of all"] = tokens / t
    _, t = timed(lambda: [tokenwire([ids]) for ids in prompts])
    fig["tokenwire scoring, one prompt a request"] = tokens / t
    _, t = timed(lambda: [llama_scores(ids) for ids in prompts])
    fig["llama.cpp scoring (logits_all + log-softmax)"] = tokens / t
    _, t = timed(lambda: [llama_scores(ids, softmax=False) for ids in prompts])
    fig["llama.cpp logits_all eval alone"] = tokens / t
    _, t = timed(lambda: [tokenwire([ids], echo=False) for ids in prompts])
    fig["tokenwire plain prefill, one prompt a request"] = tokens / t
    rows.append(fig)
    print(f"round {r + 1}: " + "; ".join(f"{k} {v:.0f} tok/s" for k, v in fig.items()), flush=True)
print()
print("| | prompt tok/s (rounds) |")
print("|---|---|")
for k in rows[0]:
    print(f"| {k} | " + " / ".join(f"{f[k]:.0f}" for f in rows) + " |")
