"""Architectures against Hugging Face transformers, end to end: for each
architecture tokenwire runs, a small checkpoint with seeded random weights
is written by transformers itself (`save_pretrained`, f32 safetensors, its
own config.json), served by `tokenwire serve`, and the prompt's logprobs
that `POST /v1/completions` with `echo`, `logprobs: 1` and `max_tokens: 0`
returns are compared with transformers' own forward pass (f64) on the same
ids: the largest absolute difference over every prompt token.

    benches/transformers/run.sh [--backend wgpu]   # PY: torch + transformers

The cases cover what differs from a llama: Qwen2's biases and tied head,
Qwen3's head norms, Mistral's sliding window (served as a context of the
window), Phi-3's stacked projections and LongRoPE (short factors within the
pre-trained context, long ones past it, each with its attention factor).
"""
import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

VOCAB = 300
SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
             rms_norm_eps=1e-5, initializer_range=0.15, bos_token_id=1, eos_token_id=2,
             pad_token_id=0, tie_word_embeddings=False)


def factors(gen, n):
    return [round(1.0 + 3.0 * torch.rand(1, generator=gen).item(), 4) for _ in range(n)]


def cases(gen):
    """(name, config, [(max_context or None, prompt length)])."""
    hd = SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    yield "llama", transformers.LlamaConfig(**SHAPE, max_position_embeddings=256), [(None, 100)]
    yield "qwen2", transformers.Qwen2Config(
        **{**SHAPE, "tie_word_embeddings": True}, max_position_embeddings=256), [(None, 100)]
    yield "qwen3", transformers.Qwen3Config(
        **SHAPE, head_dim=2 * hd, max_position_embeddings=256), [(None, 100)]
    # A window of 96 in a context of 256: served as a context of 96.
    yield "mistral", transformers.MistralConfig(
        **SHAPE, max_position_embeddings=256, sliding_window=96), [(None, 90)]
    scaling = {"type": "longrope", "short_factor": factors(gen, hd // 2),
               "long_factor": factors(gen, hd // 2)}
    # Pre-trained on 64, stretched to 256: a prompt of 100 takes the long
    # factors in both; served at 64, a prompt of 50 the short ones.
    yield "phi3", transformers.Phi3Config(
        **SHAPE, max_position_embeddings=256, original_max_position_embeddings=64,
        rope_scaling=scaling, sliding_window=None), [(None, 100), (64, 50)]


def write_tokenizer(path):
    vocab = {f"t{i}": i for i in range(VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(os.path.join(path, "tokenizer.json"))


def serve(binary, path, port, max_context, backend):
    cmd = [binary, "serve", "--model", path, "--listen", f"127.0.0.1:{port}", "--backend", backend]
    if max_context:
        cmd += ["--max-context", str(max_context)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            return proc
        except Exception:
            if proc.poll() is not None:
                sys.exit(f"tokenwire serve {path} exited with {proc.returncode}")
            time.sleep(0.1)
    proc.kill()
    sys.exit("the server did not come up")


def post(port, route, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{route}",
                                 data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def served_context(port, name):
    return post(port, "/tokenize", {"model": name, "prompt": "t1"})["max_model_len"]


def served_logprobs(port, name, ids):
    body = {"model": name, "prompt": ids, "echo": True, "logprobs": 1, "max_tokens": 0}
    lp = post(port, "/v1/completions", body)["choices"][0]["logprobs"]["token_logprobs"]
    return lp[1:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default="target/release/tokenwire")
    p.add_argument("--dir", default="target/transformers-parity")
    p.add_argument("--port", type=int, default=18130)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--backend", default="cpu", help="cpu or wgpu")
    a = p.parse_args()
    gen = torch.Generator().manual_seed(a.seed)
    rows = []
    for name, cfg, runs in cases(gen):
        torch.manual_seed(a.seed)
        cfg._attn_implementation = "eager"
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        path = os.path.abspath(os.path.join(a.dir, name))
        os.makedirs(path, exist_ok=True)
        model.save_pretrained(path, safe_serialization=True)
        write_tokenizer(path)
        model = model.double().eval()
        for max_context, length in runs:
            ids = torch.randint(3, VOCAB, (length,), generator=gen).tolist()
            with torch.no_grad():
                logits = model(torch.tensor([ids])).logits[0]
            want = torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
            proc = serve(a.binary, path, a.port, max_context, a.backend)
            try:
                got = torch.tensor(served_logprobs(a.port, name, ids), dtype=torch.float64)
                context = served_context(a.port, name)
            finally:
                proc.kill()
                proc.wait()
            diff = (got - want).abs()
            rows.append((name, context, length,
                         diff.max().item(), diff.mean().item(), want.mean().item()))
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"tokenwire --backend {a.backend}")
    print("| architecture | context served | prompt | max abs diff | mean abs diff | mean logprob |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.2e} | {r[4]:.2e} | {r[5]:.3f} |")


main()
