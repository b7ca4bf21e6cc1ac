"""llama.cpp's side of BENCHMARKS.md's CPU comparison: the same GGUF file,
prompt length, decode steps and thread count as `engine-bench --gguf`,
through llama-cpp-python built from source with native flags:

    python -m venv /tmp/llama && \
      CMAKE_ARGS="-DGGML_NATIVE=ON" /tmp/llama/bin/pip install --no-binary llama-cpp-python llama-cpp-python
    /tmp/llama/bin/python benches/llama_cpp/bench.py FILE.gguf --threads 1,2 --prompt 128 --steps 64

Prefill: one `eval` of a prompt of seeded random token ids (after an
untimed warm-up); decode: `steps` single-token `eval`s, each fed the
greedy choice of the last. Prints one line per thread count.
"""
import argparse
import random
import time

import numpy as np
from llama_cpp import Llama

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--threads", default="1,2")
p.add_argument("--prompt", type=int, default=128)
p.add_argument("--steps", type=int, default=64)
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()

for threads in [int(t) for t in a.threads.split(",")]:
    llm = Llama(model_path=a.model, n_ctx=a.prompt + a.steps + 16, n_batch=max(a.prompt, 32),
                n_threads=threads, n_threads_batch=threads, verbose=False, logits_all=False)
    vocab = llm.n_vocab()
    rng = random.Random(a.seed)
    prompt = [rng.randrange(3, vocab) for _ in range(a.prompt)]
    # Warm-up: a short chunk and a one-token step, then start over.
    llm.eval(prompt[:9])
    llm.eval(prompt[9:10])
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    t1 = time.perf_counter()
    for _ in range(a.steps):
        logits = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab,))
        llm.eval([int(logits.argmax())])
    t2 = time.perf_counter()
    print(f"llama.cpp threads {threads}: prefill {a.prompt / (t1 - t0):.1f} tok/s, "
          f"decode {a.steps / (t2 - t1):.2f} tok/s ({(t2 - t1) / a.steps * 1e3:.2f} ms/step)",
          flush=True)
    del llm
