"""Writes kernels/tests/fixtures/stories260k_tokenizer.gguf: the SentencePiece
tokenizer of stories260K (models/stories260K/raw/tok512.model) as
llama.cpp's converter stores a `llama` vocabulary in GGUF metadata (pieces,
scores, token types, BOS/EOS/UNK, add_bos_token), with no tensors. The test
`gguf_sentencepiece` checks the tokenizer tokenwire builds from it against
the model directory's own tokenizer.json.

    python -m venv /tmp/v && /tmp/v/bin/pip install gguf==0.19.0 sentencepiece
    /tmp/v/bin/python scripts/make-spm-fixture.py ../models/stories260K/raw/tok512.model \
        kernels/tests/fixtures/stories260k_tokenizer.gguf
"""
import sys

import gguf
import sentencepiece as spm

sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
tokens, scores, types = [], [], []
for i in range(sp.vocab_size()):
    tokens.append(sp.id_to_piece(i))
    scores.append(sp.get_score(i))
    if sp.is_unknown(i):
        types.append(gguf.TokenType.UNKNOWN)
    elif sp.is_control(i):
        types.append(gguf.TokenType.CONTROL)
    elif sp.is_unused(i):
        types.append(gguf.TokenType.UNUSED)
    elif sp.is_byte(i):
        types.append(gguf.TokenType.BYTE)
    else:
        types.append(gguf.TokenType.NORMAL)

w = gguf.GGUFWriter(sys.argv[2], "llama")
w.add_tokenizer_model("llama")
w.add_token_list(tokens)
w.add_token_scores(scores)
w.add_token_types(types)
w.add_bos_token_id(sp.bos_id())
w.add_eos_token_id(sp.eos_id())
w.add_unk_token_id(sp.unk_id())
w.add_add_bos_token(True)
w.add_add_space_prefix(True)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
