#!/usr/bin/env python3
"""End-to-end check of `--reasoning-parser` with the official OpenAI Python
SDK (pinned in requirements.txt), against a server whose model's chat
template opens the reasoning unless `enable_thinking` is false: Chat
Completions' `reasoning_content` and the Responses API's `reasoning` items.

    python reasoning_sdk.py --base-url http://127.0.0.1:8080/v1 --model stories260K

Bodies, chunks and events are validated with the SDK's own pydantic types
in strict mode; the one field the SDK's types do not name,
`reasoning_content` (on a chat message and on a streamed delta, as vLLM and
DeepSeek's API send it), is the only extra allowed, and it is read the way clients read it, as an
attribute of the SDK's objects. Each check prints `ok: <name>` or
`FAIL: <name>: <reason>`; the exit status is 0 only when every check passed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, List

from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from openai.types.responses import Response
from responses_sdk import SSE_EVENT_TYPES, validate_event
from sdk_strict import fail, run_checks, validate_strict


def strict_with_reasoning(model: Any, raw: str, what: str) -> Any:
    """`raw` strictly valid as the SDK's `model`, with no unknown field but
    `reasoning_content`."""
    return validate_strict(model, raw, what, allowed=("reasoning_content",))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
    msgs = [{"role": "user", "content": "Once upon a time"}]
    ask = dict(model=args.model, messages=msgs, max_tokens=16, temperature=0)
    checks: List[tuple[str, Callable[[], None]]] = []
    seen: dict[str, str] = {}

    def check(fn: Callable[[], None]) -> Callable[[], None]:
        checks.append((fn.__name__, fn))
        return fn

    @check
    def thinking_is_reasoning_content() -> None:
        raw = client.chat.completions.with_raw_response.create(**ask)
        c = strict_with_reasoning(ChatCompletion, raw.http_response.text, "the completion")
        m = raw.parse().choices[0].message
        reasoning = getattr(m, "reasoning_content", None)
        if not isinstance(reasoning, str) or not reasoning:
            fail("no reasoning_content on the SDK's message", raw.http_response.text)
        if m.content != "":
            fail("the story never closes the reasoning, so the answer is empty", raw.http_response.text)
        details = c.usage.completion_tokens_details
        if details is None or details.reasoning_tokens != 16:
            fail("usage.completion_tokens_details.reasoning_tokens is not 16", raw.http_response.text)
        seen["reasoning"] = reasoning

    @check
    def enable_thinking_false_answers_in_content() -> None:
        raw = client.chat.completions.with_raw_response.create(
            **ask, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
        )
        strict_with_reasoning(ChatCompletion, raw.http_response.text, "the completion")
        m = raw.parse().choices[0].message
        if getattr(m, "reasoning_content", "missing") is not None:
            fail("reasoning_content should be null", raw.http_response.text)
        if not m.content:
            fail("no content", raw.http_response.text)

    @check
    def streamed_reasoning_deltas() -> None:
        parts: List[str] = []
        with client.chat.completions.with_streaming_response.create(stream=True, **ask) as r:
            for line in r.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                strict_with_reasoning(ChatCompletionChunk, line[len("data: "):], "a chunk")
        for chunk in client.chat.completions.create(stream=True, **ask):
            delta = chunk.choices[0].delta
            if delta.content:
                fail(f"content in a chunk of an answer that is all reasoning: {delta.content!r}")
            parts.append(getattr(delta, "reasoning_content", None) or "")
        if "".join(parts) != seen.get("reasoning"):
            fail(f"the deltas {''.join(parts)!r} differ from the reasoning {seen.get('reasoning')!r}")

    @check
    def responses_reasoning_item() -> None:
        raw = client.responses.with_raw_response.create(
            model=args.model, input="Once upon a time", max_output_tokens=16, temperature=0
        )
        r = validate_strict(Response, raw.http_response.text, "the response")
        if [o.type for o in r.output] != ["reasoning"]:
            fail("one reasoning item and no message: the story never closes the reasoning", raw.http_response.text)
        item = r.output[0]
        text = "".join(c.text for c in item.content or [])
        if text != seen.get("reasoning") or item.status != "incomplete":
            fail("the reasoning item's text or status", raw.http_response.text)
        if r.usage.output_tokens_details.reasoning_tokens != 16 or r.output_text != "":
            fail("usage.output_tokens_details.reasoning_tokens or output_text", raw.http_response.text)
        # A client sends the turn's output back, reasoning item included.
        back = [item.model_dump(exclude_none=True), {"role": "user", "content": "And then?"}]
        again = client.responses.with_raw_response.create(
            model=args.model, input=back, max_output_tokens=4, temperature=0
        )
        validate_strict(Response, again.http_response.text, "the next response")

    @check
    def responses_streamed_reasoning() -> None:
        deltas: List[str] = []
        types: List[str] = []
        with client.responses.with_streaming_response.create(
            model=args.model, input="Once upon a time", max_output_tokens=16, temperature=0, stream=True
        ) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = validate_event(SSE_EVENT_TYPES, line[len("data: "):], "an event")
                types.append(event.type)
                if event.type == "response.reasoning_text.delta":
                    deltas.append(event.delta)
                if event.type == "response.reasoning_text.done" and event.text != "".join(deltas):
                    fail("reasoning_text.done differs from its deltas", line)
        if "".join(deltas) != seen.get("reasoning"):
            fail(f"the deltas {''.join(deltas)!r} differ from the reasoning")
        if "response.output_text.delta" in types or types[-1] != "response.incomplete":
            fail(f"events: {types}")

    return run_checks(checks)


if __name__ == "__main__":
    sys.exit(main())
