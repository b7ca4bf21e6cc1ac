"""Beam-search goldens for the `batch` dialect: Hugging Face transformers
`generate(num_beams=..., length_penalty=..., early_stopping=...)` on the
stories260K model (float32, CPU), written to stories260k_beams.json.

Run from the repository root with torch and transformers installed:

    python tests/goldens/beam_goldens.py models/stories260K

The cases are chosen so that beam search differs from greedy decoding
(longer outputs, several prompts and penalties); the script fails if too few
of them do.
"""

import json
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS = ["Once upon a time", "Lily and Ben", "The little dog", "One day", "Tom had a", "She was sad"]
CASES = [
    # (num_beams, length_penalty, early_stopping, max_new_tokens, eos): the
    # model's own EOS ids, or "." as well (stories260K rarely ends a story
    # within a few dozen tokens, so with "." ending a hypothesis, hypotheses
    # of different lengths compete and the length penalty decides).
    (2, 1.0, False, 48, "model"),
    (3, 1.0, True, 48, "model"),
    (3, 1.0, False, 40, "period"),
    (4, 0.5, False, 40, "period"),
    (4, 2.0, False, 40, "period"),
    (4, 1.0, "never", 40, "period"),
    (4, 1.0, True, 40, "period"),
    (5, -1.0, True, 32, "period"),
    (3, 0.0, "never", 32, "period"),
    (2, 1.0, True, 40, "period"),
    (3, 2.0, True, 40, "period"),
    (2, 3.0, "never", 40, "period"),
    (4, 0.5, "never", 40, "period"),
    (6, 1.0, True, 30, "period"),
]


def tok_eos(model) -> list:
    eos = model.generation_config.eos_token_id
    return eos if isinstance(eos, list) else [eos]


def main() -> None:
    model_dir = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else "tests/goldens/stories260k_beams.json"
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    period = tok.convert_tokens_to_ids(".")
    cases = []
    differ = 0
    for prompt in PROMPTS:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            greedy = model.generate(ids, do_sample=False, num_beams=1, max_new_tokens=48)
        greedy_ids = greedy[0, ids.shape[1]:].tolist()
        for num_beams, length_penalty, early_stopping, max_new, eos in CASES:
            eos_ids = tok_eos(model) + ([period] if eos == "period" else [])
            with torch.no_grad():
                got = model.generate(
                    ids,
                    do_sample=False,
                    num_beams=num_beams,
                    length_penalty=length_penalty,
                    early_stopping=early_stopping,
                    max_new_tokens=max_new,
                    eos_token_id=eos_ids,
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
                    "eos_ids": eos_ids,
                    "ids": new_ids,
                    "text": tok.decode(new_ids, skip_special_tokens=True),
                    "greedy_ids": greedy_ids[:max_new],
                }
            )
    if differ < len(cases) // 2:
        raise SystemExit(f"only {differ} of {len(cases)} cases differ from greedy")
    eos_ended = sum(1 for c in cases if c["ids"] and c["ids"][-1] in c["eos_ids"])
    # The same prompt and beams under different length penalties must not
    # all agree, or the penalty was never exercised.
    by_prompt = {}
    for c in cases:
        if c["num_beams"] == 4 and c["early_stopping"] is False:
            by_prompt.setdefault(c["prompt"], set()).add(tuple(c["ids"]))
    penalty_matters = sum(1 for v in by_prompt.values() if len(v) > 1)
    if eos_ended < len(cases) // 3 or penalty_matters < 2:
        raise SystemExit(f"{eos_ended} cases end with EOS, penalty matters for {penalty_matters} prompts")
    print(f"{eos_ended} end with EOS; the length penalty changes the result for {penalty_matters} prompts")
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
