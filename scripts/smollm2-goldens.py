"""Goldens for the SmolLM2-135M-Instruct Q4_1 GGUF file, from transformers
(which dequantizes every tensor to f32): token ids of sample texts, the
chat template's rendering, and greedy continuations of chat prompts.
Writes kernels/tests/fixtures/smollm2_q4_1_goldens.json.

    python -m venv /tmp/v && /tmp/v/bin/pip install torch transformers gguf accelerate
    /tmp/v/bin/python scripts/smollm2-goldens.py target/models kernels/tests/fixtures/smollm2_q4_1_goldens.json
"""
import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

DIR, OUT = sys.argv[1], sys.argv[2]
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NEW_TOKENS = 40

tok = AutoTokenizer.from_pretrained(DIR, gguf_file=NAME)
model = AutoModelForCausalLM.from_pretrained(DIR, gguf_file=NAME, torch_dtype=torch.float32)
model.eval()

texts = [
    "Hello, world!",
    "The year 2024 had 366 days; 12345 + 678 = 13023.",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "naïve café — 東京 🚀 <|im_start|>user",
    "def f(x):\n    return x ** 2  # square",
]
chats = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "What color is the sky?"}],
    [{"role": "user", "content": "List three fruits."}],
]

out = {
    "transformers": transformers.__version__,
    "torch": torch.__version__,
    "encode": [{"text": t, "ids": tok(t, add_special_tokens=True)["input_ids"]} for t in texts],
    "chats": [],
}
for msgs in chats:
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                             eos_token_id=None, pad_token_id=tok.eos_token_id)
        logits = model(gen).logits[0]
    new = gen[0, ids.shape[1]:].tolist()
    # Teacher-forced over prompt + greedy: the top 5 ids at every position,
    # to judge tokenwire position by position on the same prefix.
    best = torch.topk(logits[ids.shape[1] - 1:], 5, dim=-1)
    top5 = best.indices.tolist()[:len(new)]
    # How far the best logit is ahead of the second at each position: where
    # it is tiny, f32 rounding order alone may pick either.
    margin = (best.values[:, 0] - best.values[:, 1]).tolist()[:len(new)]
    out["chats"].append({"messages": msgs, "rendered": text, "prompt_ids": ids[0].tolist(),
                         "greedy": new, "top5": top5, "margin": margin,
                         "text": tok.decode(new)})
with open(OUT, "w") as f:
    json.dump(out, f, ensure_ascii=False, indent=1)
    f.write("\n")
print(json.dumps([c["text"] for c in out["chats"]], ensure_ascii=False))
