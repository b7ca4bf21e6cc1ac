"""Beam-search goldens for the `batch` dialect: Hugging Face transformers
`generate(num_beams=..., length_penalty=..., early_stopping=...)` on the
stories260K model (float32, CPU), written to stories260k_beams.json.

Run from the repository root with torch and transformers installed:

    python tests/goldens/beam_goldens.py ../shared/models/stories260K

The cases are chosen so that beam search differs from greedy decoding
(longer outputs, several prompts and penalties); the script fails if too few
of them do.
"""

import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = ["Once upon a time", "Lily and Ben", "The little dog", "One day"]
CASES = [
    # (num_beams, length_penalty, early_stopping, max_new_tokens)
    (2, 1.0, False, 48),
    (3, 1.0, True, 48),
    (4, 0.5, False, 40),
    (4, 2.0, False, 40),
    (4, 1.0, "never", 32),
    (5, -1.0, True, 24),
]


def main() -> None:
    model_dir = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else "tests/goldens/stories260k_beams.json"
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    cases = []
    differ = 0
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            greedy = model.generate(ids, do_sample=False, num_beams=1, max_new_tokens=48)
        greedy_ids = greedy[0, ids.shape[1]:].tolist()
        for num_beams, length_penalty, early_stopping, max_new in CASES:
            with torch.no_grad():
                got = model.generate(
                    ids,
                    do_sample=False,
                    num_beams=num_beams,
                    length_penalty=length_penalty,
                    early_stopping=early_stopping,
                    max_new_tokens=max_new,
                )
            new_ids = got[0, ids.shape[1]:].tolist()
            if new_ids != greedy_ids[: len(new_ids)]:
                differ += 1
            cases.append(
                {
                    "prompt": prompt,
                    "prompt_ids": ids[0].tolist(),
                    "num_beams": num_beams,
                    "length_penalty": length_penalty,
                    "early_stopping": early_stopping,
                    "max_new_tokens": max_new,
                    "ids": new_ids,
                    "text": tok.decode(new_ids, skip_special_tokens=True),
                    "greedy_ids": greedy_ids[:max_new],
                }
            )
    if differ < len(cases) // 2:
        raise SystemExit(f"only {differ} of {len(cases)} cases differ from greedy")
    doc = {
        "about": "transformers generate() beam search on stories260K, float32 CPU; see beam_goldens.py",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "differ_from_greedy": differ,
        "cases": cases,
    }
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{len(cases)} cases, {differ} differ from greedy -> {out}")


if __name__ == "__main__":
    main()
