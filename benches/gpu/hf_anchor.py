"""The anchor of the GPU benchmarks: Hugging Face transformers, eager
attention, bf16, on the shapes engine-bench builds (random weights), on the
same card. Prints prefill tokens/s for 8 x 128 tokens and decode tokens/s at
batch 1, 8 and 32 (128-token prompts, 32 greedy steps through the KV cache),
timed with CUDA synchronisation after a warm-up.

    python3 benches/gpu/hf_anchor.py [SHAPE ...]   # default: both shapes
"""

import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

SHAPES = {
    "tinyllama-1.1b": dict(hidden_size=2048, num_hidden_layers=22, num_attention_heads=32,
                           num_key_value_heads=4, intermediate_size=5632, vocab_size=32000,
                           tie_word_embeddings=False, rope_theta=10000.0),
    "llama-3.2-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
                         tie_word_embeddings=True, rope_theta=500000.0),
}
PROMPT, STEPS = 128, 32


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


@torch.inference_mode()
def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    names = sys.argv[1:] or list(SHAPES)
    for name in names:
        dims = SHAPES[name]
        cfg = LlamaConfig(max_position_embeddings=4096, attn_implementation="eager", **dims)
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
        gen = torch.Generator(device="cuda").manual_seed(1)
        ids = torch.randint(0, cfg.vocab_size, (8, PROMPT), device="cuda", generator=gen)
        model(ids[:, :16])  # warm-up
        _, t = timed(lambda: model(ids))
        print(f"{name}: prefill 8 x {PROMPT}: {8 * PROMPT / t:.1f} tok/s")
        for batch in (1, 8, 32):
            prompt = torch.randint(0, cfg.vocab_size, (batch, PROMPT), device="cuda", generator=gen)

            def decode():
                out = model(prompt, use_cache=True)
                cache = out.past_key_values
                nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(STEPS):
                    out = model(nxt, past_key_values=cache, use_cache=True)
                    cache = out.past_key_values
                    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
                torch.cuda.synchronize()
                return time.perf_counter() - t

            decode()  # warm-up
            t = decode()
            print(f"{name}: decode batch {batch}: {batch * STEPS / t:.1f} tok/s "
                  f"({1e3 * t / STEPS:.2f} ms/step)")
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
