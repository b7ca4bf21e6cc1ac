"""Writes a GGUF file of TinyLlama-1.1B's shape (hidden 2048, 22 layers, 32
heads / 4 KV heads, FFN 5632, vocab 32000, untied head) with seeded random
weights (normal, std 1/sqrt(fan-in)) in F16 or Q8_0, and a synthetic
SentencePiece-style vocabulary, for BENCHMARKS.md's CPU comparison (its
text is meaningless; the benchmarks feed token ids).

    python -m venv /tmp/v && /tmp/v/bin/pip install gguf==0.19.0 numpy
    /tmp/v/bin/python scripts/make-bench-gguf.py OUT.gguf f16|q8_0 [SEED]
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T

out, kind = sys.argv[1], sys.argv[2]
seed = int(sys.argv[3]) if len(sys.argv) > 3 else 1
H, L, NH, NKV, FFN, V, CTX = 2048, 22, 32, 4, 5632, 32000, 2048
HD = H // NH
rng = np.random.default_rng(seed)

w = gguf.GGUFWriter(out, "llama")
w.add_name(f"tinyllama-shape-random-{kind}")
w.add_context_length(CTX)
w.add_embedding_length(H)
w.add_block_count(L)
w.add_feed_forward_length(FFN)
w.add_head_count(NH)
w.add_head_count_kv(NKV)
w.add_rope_dimension_count(HD)
w.add_rope_freq_base(10000.0)
w.add_layer_norm_rms_eps(1e-5)
w.add_file_type(1 if kind == "f16" else 7)

tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
tokens += [f"\u2581t{i}" for i in range(V - len(tokens))]
w.add_tokenizer_model("llama")
w.add_token_list(tokens)
w.add_token_scores([0.0] * 3 + [0.0] * 256 + [-float(i) for i in range(V - 259)])
w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (V - 259))
w.add_bos_token_id(1)
w.add_eos_token_id(2)
w.add_unk_token_id(0)


def matrix(name, rows, cols):
    m = (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(np.float32)
    if kind == "f16":
        w.add_tensor(name, m.astype(np.float16))
    else:
        w.add_tensor(name, gguf.quants.quantize(m, T.Q8_0), raw_dtype=T.Q8_0)


def ones(name, n):
    w.add_tensor(name, np.ones(n, dtype=np.float32))


matrix("token_embd.weight", V, H)
for i in range(L):
    p = f"blk.{i}"
    ones(f"{p}.attn_norm.weight", H)
    matrix(f"{p}.attn_q.weight", NH * HD, H)
    matrix(f"{p}.attn_k.weight", NKV * HD, H)
    matrix(f"{p}.attn_v.weight", NKV * HD, H)
    matrix(f"{p}.attn_output.weight", H, NH * HD)
    ones(f"{p}.ffn_norm.weight", H)
    matrix(f"{p}.ffn_gate.weight", FFN, H)
    matrix(f"{p}.ffn_up.weight", FFN, H)
    matrix(f"{p}.ffn_down.weight", H, FFN)
ones("output_norm.weight", H)
matrix("output.weight", V, H)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
