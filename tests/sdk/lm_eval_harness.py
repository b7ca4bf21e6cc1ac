#!/usr/bin/env python3
"""lm-evaluation-harness (pinned in requirements.txt) evaluating a tokenwire
server through `POST /v1/completions`, as its users run it:

    python lm_eval_harness.py --base-url http://127.0.0.1:8080/v1 --model stories260K

Its `local-completions` model finds the server's remote tokenizer (`GET
/tokenizer_info`, `POST /tokenize` without special tokens), then sends
batches of token-id prompts: with `echo`, `logprobs` and one token for
log-likelihoods (a multiple-choice task), and with `stop` and a length for
generations (a generate-until task). The tasks are written here over local
JSON files, from the model's own greedy continuations of a few openings
(fetched first with the official OpenAI SDK), so the answers are known: the
greedy continuation must be the one lm-eval finds greedy and most likely,
and the one it generates.

Checks: the SDK's echoed scores are strictly valid as its `Completion`;
lm-eval's accuracy is 1 with each right choice greedy and no other; each
log-likelihood lm-eval reports is the sum the SDK's echo gives for the same
ids; lm-eval's batched generations match exactly; with a model that has a
chat template, lm-eval's remote tokenizer renders it (read from
`/tokenizer_info`, as `--apply_chat_template` does) into the very ids the
server's own rendering gives. Each check prints `ok:
<name>` or `FAIL: <name>: <reason>`; exit status 0 only when all passed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from typing import Any, Callable, Dict, List

# No network: the tasks' data is local, and nothing is fetched from a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import requests  # noqa: E402 - after the offline switches
from openai import OpenAI  # noqa: E402
from openai.types import Completion  # noqa: E402

from sdk_strict import drop_unscored_first, fail, run_checks, validate_strict as strict  # noqa: E402

OPENINGS = [
    "Once upon a time, there was a little",
    "One day, a boy named Tim went to the",
    "The sun was shining and the birds",
    "Lily had a big red ball. She",
    "The cat sat on the mat and",
    "Mom said it was time for",
    "There was a tree in the park. It",
    "Ben and his dog liked to",
]
CONTINUATION_TOKENS = 4


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    base = args.base_url.rstrip("/")
    server = base.removesuffix("/v1")
    sdk = OpenAI(base_url=base, api_key="unused", max_retries=0)

    def ids(text: str) -> List[int]:
        # As lm-eval's remote tokenizer asks: no special tokens.
        r = requests.post(f"{server}/tokenize", json={"prompt": text, "add_special_tokens": False}, timeout=30)
        r.raise_for_status()
        return r.json()["tokens"]

    # The model's greedy continuation of each opening, from the ids lm-eval
    # will send.
    contexts = [ids(t) for t in OPENINGS]
    first = sdk.completions.create(model=args.model, prompt=contexts, max_tokens=CONTINUATION_TOKENS,
                                   temperature=0)
    greedy = [c.text for c in sorted(first.choices, key=lambda c: c.index)]
    if len(greedy) != len(OPENINGS) or not all(greedy):
        print(f"FAIL: setup: greedy continuations {greedy!r}", flush=True)
        return 1

    checks: List[tuple[str, Callable[[], None]]] = []

    def check(fn: Callable[[], None]) -> Callable[[], None]:
        checks.append((fn.__name__, fn))
        return fn

    def echoed(prompts: List[List[int]]) -> Completion:
        raw = sdk.completions.with_raw_response.create(model=args.model, prompt=prompts, echo=True,
                                                       logprobs=1, max_tokens=1, temperature=0)
        strict_echo(raw.http_response.text)
        # As an SDK user reads it.
        return raw.parse()

    @check
    def the_sdk_reads_echoed_scores_strictly() -> None:
        reply = echoed(contexts[:2])
        if [c.index for c in reply.choices] != [0, 1]:
            fail(f"choices {[c.index for c in reply.choices]}")
        for c, ctx in zip(reply.choices, contexts):
            lp = c.logprobs
            if lp is None or lp.token_logprobs is None or lp.top_logprobs is None:
                fail("no logprobs")
            if len(lp.token_logprobs) != len(ctx) + 1:
                fail(f"{len(lp.token_logprobs)} logprobs for {len(ctx)} prompt tokens")
            if not all(isinstance(x, float) and x <= 0 for x in lp.token_logprobs[1:]):
                fail(f"logprobs {lp.token_logprobs}")
            if not c.text.startswith(OPENINGS[c.index]):
                fail(f"the echo {c.text!r}")

    results = evaluate(args, server, greedy)

    @check
    def lm_eval_picks_each_greedy_continuation_and_finds_it_greedy() -> None:
        mc = results["results"]["tokenwire_mc"]
        if mc.get("acc,none") != 1.0:
            fail(f"accuracy {mc}")
        for s in results["samples"]["tokenwire_mc"]:
            label = s["doc"]["label"]
            flags = [r[0][1] for r in s["resps"]]
            want = [i == label for i in range(len(flags))]
            if flags != want:
                fail(f"doc {s['doc_id']}: greedy flags {flags}, right choice {label}")

    @check
    def lm_eval_log_likelihoods_are_the_echoed_sums() -> None:
        for s in results["samples"]["tokenwire_mc"]:
            ctx = contexts[s["doc"]["index"]]
            # As lm-eval encodes a pair: the whole text, cut where the
            # context's own ids end.
            opening = OPENINGS[s["doc"]["index"]]
            prompts = [ctx + ids(opening + choice)[len(ctx):] for choice in s["doc"]["choices"]]
            reply = echoed(prompts)
            for c, r, p in zip(reply.choices, s["resps"], prompts):
                got = r[0][0]
                want = sum(c.logprobs.token_logprobs[len(ctx):len(p)])
                if not math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-4):
                    fail(f"doc {s['doc_id']}: lm-eval {got}, the echo {want}")

    @check
    def lm_eval_renders_the_servers_chat_template() -> None:
        from lm_eval.utils import RemoteTokenizer

        info = requests.get(f"{server}/tokenizer_info", timeout=30).json()
        if not info.get("chat_template"):
            fail(f"no chat template in /tokenizer_info: {info}")
        chat = [{"role": "user", "content": OPENINGS[0]}]
        text = RemoteTokenizer(server).apply_chat_template(chat)
        if OPENINGS[0] not in text or text == OPENINGS[0]:
            fail(f"rendered {text!r}")
        r = requests.post(f"{server}/tokenize", json={"messages": chat}, timeout=30)
        r.raise_for_status()
        served = r.json()["tokens"]
        # The server adds the BOS the template did not write; lm-eval
        # tokenizes without special tokens.
        rendered = ids(text)
        if served[len(served) - len(rendered):] != rendered or len(served) - len(rendered) not in (0, 1):
            fail(f"lm-eval's rendering {rendered} vs the server's {served}")

    @check
    def lm_eval_generates_the_greedy_continuations_in_batches() -> None:
        gen = results["results"]["tokenwire_gen"]
        if gen.get("exact_match,none") != 1.0:
            texts = [s["resps"] for s in results["samples"]["tokenwire_gen"]]
            fail(f"exact match {gen}: {texts} vs {greedy}")

    return run_checks(checks)


def strict_echo(raw: str) -> None:
    """Validates an echoed scoring reply strictly as the SDK's `Completion`:
    each prompt's first token unscored (`null`), the rest as the SDK's type
    says ([`drop_unscored_first`])."""
    body = json.loads(raw)
    for c in body.get("choices", []):
        lp = c.get("logprobs") or {}
        if lp.get("token_logprobs", [0])[0] is not None or lp.get("top_logprobs", [0])[0] is not None:
            fail(f"choice {c.get('index')}: the first token is scored", raw)
    strict(Completion, json.dumps(drop_unscored_first(body)), "an echoed scoring reply")


def evaluate(args: argparse.Namespace, server: str, greedy: List[str]) -> Dict[str, Any]:
    """Runs lm-eval's `local-completions` on two tasks over local files:
    multiple choice (each opening's greedy continuation among three
    others') and generate-until (the greedy continuation)."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    n = len(OPENINGS)
    work = tempfile.mkdtemp(prefix="tokenwire-lm-eval-")
    with open(os.path.join(work, "mc.jsonl"), "w", encoding="utf-8") as f:
        for i in range(n):
            others = [greedy[(i + k) % n] for k in range(1, 4)]
            label = i % 4
            choices = others[:label] + [greedy[i]] + others[label:]
            f.write(json.dumps({"index": i, "context": OPENINGS[i], "choices": choices, "label": label}) + "\n")
    with open(os.path.join(work, "gen.jsonl"), "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"context": OPENINGS[i], "target": greedy[i]}) + "\n")
    tasks = {
        "tokenwire_mc": f"""task: tokenwire_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {work}/mc.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
""",
        "tokenwire_gen": f"""task: tokenwire_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: {work}/gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{{{context}}}}"
doc_to_target: "{{{{target}}}}"
target_delimiter: ""
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: {CONTINUATION_TOKENS}
  temperature: 0
metric_list:
  - metric: exact_match
""",
    }
    for name, text in tasks.items():
        with open(os.path.join(work, f"{name}.yaml"), "w", encoding="utf-8") as f:
            f.write(text)
    model_args = ",".join([
        f"base_url={server}/v1/completions",
        f"model={args.model}",
        "tokenizer_backend=remote",
        "tokenized_requests=True",
        "batch_size=4",
        "num_concurrent=1",
        "max_retries=1",
        "max_length=512",
    ])
    return lm_eval.simple_evaluate(
        model="local-completions",
        model_args=model_args,
        tasks=list(tasks),
        task_manager=TaskManager(include_path=work),
        log_samples=True,
    )


if __name__ == "__main__":
    sys.exit(main())
