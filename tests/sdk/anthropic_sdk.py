#!/usr/bin/env python3
"""End-to-end check of tokenwire's Anthropic Messages API routes with the
official Anthropic Python SDK (pinned in requirements.txt):

    python anthropic_sdk.py --base-url http://127.0.0.1:8080/v1 --model stories260K

Every message and streamed event the server sends is validated with the
SDK's own pydantic types in strict mode, with no field unknown to them (no
`model_extra`, at any depth); the SDK's own calls (`create`, `stream()` and
its accumulated message, `parse()`, `count_tokens`, errors) must work
unchanged too. Each check prints `ok: <name>` or `FAIL: <name>: <reason>`;
the exit status is 0 only when every check passed. Sampling is greedy
(`temperature` 0, sent as an extra field: this SDK no longer names it).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from typing import Any, Callable, Dict, List, Literal, Tuple

import anthropic
import pydantic
from anthropic import Anthropic
from anthropic import types as t

from sdk_strict import fail, run_checks, validate_strict as strict

GREEDY = {"temperature": 0}

# The SDK's type of each streamed event, by its name.
EVENT_TYPES: Dict[str, Any] = {
    "message_start": t.RawMessageStartEvent,
    "message_delta": t.RawMessageDeltaEvent,
    "message_stop": t.RawMessageStopEvent,
    "content_block_start": t.RawContentBlockStartEvent,
    "content_block_delta": t.RawContentBlockDeltaEvent,
    "content_block_stop": t.RawContentBlockStopEvent,
}

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


class Pick(pydantic.BaseModel):
    """A structured output a small model always finishes: closed choices."""
    model_config = pydantic.ConfigDict(extra="forbid")
    place: Literal["forest", "castle", "sea"]
    brave: bool


def sse(create: Any, **body: Any) -> List[Tuple[str, str]]:
    """The (event, data) pairs of a streamed request made with the SDK's
    `with_streaming_response.create`, as the server wrote them."""
    with create(stream=True, **body) as r:
        if r.status_code != 200:
            fail(f"status {r.status_code}", r.read().decode())
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            fail(f"content-type {r.headers.get('content-type')!r}")
        out: List[Tuple[str, str]] = []
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                if name is None:
                    fail("a data line without its event line", line)
                out.append((name, line[len("data: "):]))
                name = None
        return out


def strict_events(pairs: List[Tuple[str, str]]) -> List[Any]:
    """Each event validated strictly as the SDK's type for its name."""
    events = []
    for name, data in pairs:
        kind = EVENT_TYPES.get(name)
        if kind is None:
            fail(f"an event the SDK does not know: {name}", data)
        e = strict(kind, data, f"a {name} event")
        if e.type != name:
            fail(f"event {name} carries type {e.type}", data)
        events.append(e)
    return events


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    # Anthropic's SDK adds `/v1/messages` to its base URL.
    base = args.base_url.removesuffix("/").removesuffix("/v1")
    client = Anthropic(base_url=base, api_key="unused", max_retries=0)
    model = args.model
    msgs = [{"role": "user", "content": "Once upon a time"}]
    system = "Tell a story."
    checks: List[tuple[str, Callable[[], None]]] = []

    def check(fn: Callable[[], None]) -> Callable[[], None]:
        checks.append((fn.__name__, fn))
        return fn

    def message(**body: Any) -> t.Message:
        raw = client.messages.with_raw_response.create(
            model=model, system=system, extra_body=GREEDY, **body
        )
        m = strict(t.Message, raw.http_response.text, "the message")
        if raw.parse().content != m.content:
            fail("the SDK's parse differs from the strict one")
        return m

    @check
    def message_json() -> None:
        m = message(max_tokens=12, messages=msgs)
        if not m.id.startswith("msg_") or m.role != "assistant" or m.type != "message":
            fail("id, role or type", m.model_dump_json())
        if len(m.content) != 1 or m.content[0].type != "text" or not m.content[0].text:
            fail("not one text block", m.model_dump_json())
        if m.stop_reason != "max_tokens" or m.stop_sequence is not None:
            fail("stop reason", m.model_dump_json())
        if m.usage.output_tokens != 12 or m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) < 1:
            fail("usage", m.model_dump_json())

    @check
    def stream_events_match_the_message() -> None:
        whole = message(max_tokens=12, messages=msgs)
        events = strict_events(sse(client.messages.with_streaming_response.create, model=model,
                                   system=system, max_tokens=12, messages=msgs, extra_body=GREEDY))
        kinds = [e.type for e in events]
        if kinds[0] != "message_start" or kinds[-2:] != ["message_delta", "message_stop"]:
            fail(f"event order {kinds}")
        text = "".join(e.delta.text for e in events
                       if e.type == "content_block_delta" and e.delta.type == "text_delta")
        if text != whole.content[0].text:
            fail(f"streamed {text!r}, the message said {whole.content[0].text!r}")
        end = events[-2]
        if end.delta.stop_reason != "max_tokens" or end.usage.output_tokens != 12:
            fail("the closing message_delta", end.model_dump_json())
        # The SDK's stream helper accumulates the same message.
        with client.messages.stream(model=model, system=system, max_tokens=12, messages=msgs,
                                    extra_body=GREEDY) as s:
            streamed = "".join(s.text_stream)
            final = s.get_final_message()
        if streamed != text or final.content[0].text != text or final.stop_reason != "max_tokens":
            fail(f"the SDK's stream helper read {streamed!r}", final.model_dump_json())

    @check
    def a_stop_sequence_is_named() -> None:
        whole = message(max_tokens=16, messages=msgs).content[0].text
        stop = whole.split()[2]
        m = message(max_tokens=16, messages=msgs, stop_sequences=[stop])
        if m.stop_reason != "stop_sequence" or m.stop_sequence != stop:
            fail(f"stop {stop!r}", m.model_dump_json())
        if not whole.startswith(m.content[0].text) or stop in m.content[0].text:
            fail("the text is not cut before the stop", m.model_dump_json())

    @check
    def a_forced_tool_call_and_its_result() -> None:
        m = message(max_tokens=200, messages=msgs, tools=[WEATHER],
                    tool_choice={"type": "tool", "name": "get_weather"})
        calls = [b for b in m.content if b.type == "tool_use"]
        if m.stop_reason != "tool_use" or len(calls) != 1 or calls[0].name != "get_weather":
            fail("one get_weather call", m.model_dump_json())
        if not isinstance(calls[0].input.get("city"), str) or not calls[0].id.startswith("toolu_"):
            fail("the call's input or id", m.model_dump_json())
        follow = [
            *msgs,
            {"role": "assistant", "content": [c.model_dump(exclude_none=True) for c in m.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                          "content": "sunny"}]},
        ]
        after = message(max_tokens=8, messages=follow, tools=[WEATHER])
        if after.stop_reason not in ("max_tokens", "end_turn", "tool_use"):
            fail("the answer after the result", after.model_dump_json())
        # Streamed, the SDK accumulates the call's input from its deltas.
        with client.messages.stream(model=model, system=system, max_tokens=200, messages=msgs,
                                    tools=[WEATHER], extra_body=GREEDY,
                                    tool_choice={"type": "tool", "name": "get_weather"}) as s:
            final = s.get_final_message()
        streamed = [b for b in final.content if b.type == "tool_use"]
        if len(streamed) != 1 or streamed[0].input != calls[0].input:
            fail("the streamed call differs", final.model_dump_json())

    @check
    def parse_with_a_pydantic_model() -> None:
        r = client.messages.parse(model=model, max_tokens=300, messages=msgs, output_format=Pick,
                                  extra_body=GREEDY)
        if not isinstance(r.parsed_output, Pick):
            fail(f"parsed {r.parsed_output!r}", r.model_dump_json())
        json.loads(r.content[0].text)

    @check
    def a_prefill_is_continued() -> None:
        # A last assistant message starts the answer: the reply is what the
        # model adds, greedy, as the same prompt gives on Completions
        # (stories260K has no template: the contents joined by newlines).
        pre = "Once upon a time, there was a"
        turns = [{"role": "user", "content": "Tell me a story."},
                 {"role": "assistant", "content": pre}]
        m = message(max_tokens=10, messages=turns)
        text = m.content[0].text
        prompt = "\n".join([system, "Tell me a story.", pre])
        req = urllib.request.Request(
            base + "/v1/completions", method="POST", headers={"content-type": "application/json"},
            data=json.dumps({"model": model, "prompt": prompt, "max_tokens": 10,
                             "temperature": 0}).encode())
        with urllib.request.urlopen(req) as r:
            want = json.load(r)
        if text != want["choices"][0]["text"] or text.startswith(pre):
            fail(f"continued {text!r}, Completions gives {want['choices'][0]['text']!r}")
        if m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) != want["usage"]["prompt_tokens"]:
            fail("the prefilled prompt's length", m.model_dump_json())
        counted = client.messages.count_tokens(model=model, system=system, messages=turns)
        if counted.input_tokens != want["usage"]["prompt_tokens"]:
            fail(f"count_tokens says {counted.input_tokens}")
        try:
            client.messages.create(model=model, max_tokens=4, messages=[
                {"role": "user", "content": "x"}, {"role": "assistant", "content": "trailing "}])
            fail("a prefill ending in whitespace was accepted")
        except anthropic.BadRequestError as e:
            if "trailing whitespace" not in str(e):
                fail(f"trailing whitespace: {e}")

    @check
    def count_tokens_counts_the_message_prompt() -> None:
        m = message(max_tokens=2, messages=msgs)
        n = client.messages.count_tokens(model=model, system=system, messages=msgs)
        strict(t.MessageTokensCount, n.model_dump_json(), "the count")
        prompt = m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)
        if n.input_tokens != prompt:
            fail(f"count_tokens says {n.input_tokens}, the message's prompt was {prompt}")

    @check
    def errors_are_the_sdks_exceptions() -> None:
        try:
            client.messages.create(model="claude-elsewhere", max_tokens=4, messages=msgs)
            fail("another model was served")
        except anthropic.NotFoundError as e:
            if e.body["error"]["type"] != "not_found_error":
                fail("the 404's type", json.dumps(e.body))
        try:
            client.messages.create(model=model, max_tokens=4, messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}])
            fail("an image was taken")
        except anthropic.BadRequestError as e:
            if e.body["error"]["type"] != "invalid_request_error" or "image" not in e.message:
                fail("the 400", json.dumps(e.body))

    return run_checks(checks)


if __name__ == "__main__":
    sys.exit(main())
