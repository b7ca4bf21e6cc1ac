"""Writes kernels/tests/fixtures/quant_blocks.gguf: for each quantized type
tokenwire reads, two rows of blocks made of seeded random bytes (with finite
f16 scales), stored raw as `q.<TYPE>`, and the same rows dequantized by the
`gguf` Python package (llama.cpp's own reference) as F32 `f.<TYPE>`.
The Rust test `quant_fixture` checks tokenwire's dequantization against it.

    python -m venv /tmp/v && /tmp/v/bin/pip install gguf==0.19.0 numpy
    /tmp/v/bin/python scripts/make-quant-fixture.py kernels/tests/fixtures/quant_blocks.gguf
"""
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize

# type: (values per block, bytes per block, offsets of f16 scale fields)
TYPES = {
    T.Q8_0: (32, 34, [0]),
    T.Q4_0: (32, 18, [0]),
    T.Q4_1: (32, 20, [0, 2]),
    T.Q5_0: (32, 22, [0]),
    T.Q5_1: (32, 24, [0, 2]),
    T.Q4_K: (256, 144, [0, 2]),
    T.Q5_K: (256, 176, [0, 2]),
    T.Q6_K: (256, 210, [208]),
    T.Q3_K: (256, 110, [108]),
    T.IQ4_NL: (32, 18, [0]),
    T.IQ4_XS: (256, 136, [0]),
    T.Q2_K: (256, 84, [80, 82]),
}

rng = np.random.default_rng(20261123)
w = gguf.GGUFWriter(sys.argv[1], "tokenwire-quant-fixture")
for qtype, (n, nbytes, scales) in TYPES.items():
    rows, blocks = 2, 3
    raw = rng.integers(0, 256, size=(rows, blocks, nbytes), dtype=np.uint8)
    for at in scales:
        vals = (rng.standard_normal(size=(rows, blocks)) * 0.05).astype(np.float16)
        raw[:, :, at:at + 2] = vals.view(np.uint8).reshape(rows, blocks, 2)
    raw = raw.reshape(rows, blocks * nbytes)
    w.add_tensor(f"q.{qtype.name}", raw, raw_dtype=qtype)
    w.add_tensor(f"f.{qtype.name}", dequantize(raw, qtype).astype(np.float32))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
