"""Embeddings on both sides, from the same GGUF file and the same inputs:
llama.cpp (llama-cpp-python, mean pooling, unit length) and tokenwire's
`POST /v1/embeddings` on a running server (`--pooling mean`), one request
of every input each:

    benches/llama_cpp/embed.sh FILE.gguf [INPUTS] [ROUNDS]

Prints how far apart the two vectors of each input are (cosine: the
lowest and the mean over inputs; both sides quantize activations to 8
bits for the 4-bit weights, in their own ways), then each side's inputs
and tokens per second, every input in one request (one `embed` call:
llama-cpp-python then decodes them as one batch) and one input at a time.
The inputs are seeded sentences of 8 to 120 words.
"""
import argparse
import json
import math
import random
import time
import urllib.request

from llama_cpp import Llama

WORDS = ("the a little girl boy dog cat park ball tree river bird sun rain house garden "
         "friend happy sad big small red blue green ran jumped saw found played sang "
         "looked under over near with and but then one day every morning after school "
         "because they she he it was were is are very quickly slowly together").split()

p = argparse.ArgumentParser()
p.add_argument("model")
p.add_argument("--url", required=True, help="tokenwire's base URL, http://HOST:PORT")
p.add_argument("--name", required=True, help="the model's name on that server")
p.add_argument("--inputs", type=int, default=64)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()

rng = random.Random(a.seed)
texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 120))).capitalize() + "."
         for _ in range(a.inputs)]


def tokenwire(texts):
    body = json.dumps({"model": a.name, "input": texts, "encoding_format": "float"}).encode()
    req = urllib.request.Request(a.url + "/v1/embeddings", data=body,
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        reply = json.load(r)
    return [d["embedding"] for d in reply["data"]], reply["usage"]["prompt_tokens"]


llm = Llama(model_path=a.model, embedding=True, pooling_type=1, n_ctx=4096, n_batch=4096,
            n_ubatch=4096, n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
tokens = sum(len(llm.tokenize(t.encode(), add_bos=False, special=True)) for t in texts)
# For scale: llama.cpp's prefill of the same inputs as a generator (no
# pooling), one at a time, as `bench.py` times prefill.
gen = Llama(model_path=a.model, n_ctx=4096, n_batch=4096, n_threads=a.threads,
            n_threads_batch=a.threads, verbose=False)
ids = [gen.tokenize(t.encode(), add_bos=False, special=True) for t in texts]

# Warm-up, then agreement.
ours, our_tokens = tokenwire(texts)
theirs = llm.embed(texts, normalize=True)
cos = [sum(x * y for x, y in zip(u, v)) / (math.sqrt(sum(x * x for x in u)) * math.sqrt(sum(y * y for y in v)))
       for u, v in zip(ours, theirs)]
print(f"{len(texts)} inputs, {our_tokens} tokens (llama.cpp: {tokens}), {len(ours[0])} values each")
print(f"cosine(tokenwire, llama.cpp): lowest {min(cos):.5f}, mean {sum(cos) / len(cos):.5f}")
for r in range(a.rounds):
    t0 = time.perf_counter()
    tokenwire(texts)
    t1 = time.perf_counter()
    for t in texts:
        tokenwire([t])
    t2 = time.perf_counter()
    llm.embed(texts, normalize=True)
    t3 = time.perf_counter()
    for t in texts:
        llm.embed(t, normalize=True)
    t4 = time.perf_counter()
    for i in ids:
        gen.reset()
        gen.eval(i)
    t5 = time.perf_counter()
    rate = lambda secs: f"{len(texts) / secs:.1f} inputs/s ({our_tokens / secs:.0f} tok/s)"
    print(f"round {r + 1}: tokenwire one request {rate(t1 - t0)}, one input a request {rate(t2 - t1)}; "
          f"llama.cpp one call {rate(t3 - t2)}, one input a call {rate(t4 - t3)}; "
          f"llama.cpp prefill alone (no pooling), one input a call {rate(t5 - t4)}", flush=True)
