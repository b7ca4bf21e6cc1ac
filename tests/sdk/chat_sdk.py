#!/usr/bin/env python3
"""End-to-end check of tokenwire's Chat Completions and Completions routes
with the official OpenAI Python SDK (pinned in requirements.txt):

    python chat_sdk.py --base-url http://127.0.0.1:8080/v1 --model stories260K

Every body and streamed chunk the server sends is validated with the SDK's
own pydantic types in strict mode, with no field unknown to them (no
`model_extra`, at any depth); the SDK's own calls (`create`, streaming,
errors) must work unchanged too. Each check prints `ok: <name>` or
`FAIL: <name>: <reason>`; the exit status is 0 only when every check passed.
The model is assumed greedy-deterministic at temperature 0.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any, Callable, List, Optional, Type

import openai
from openai import OpenAI
from openai.types import Completion, Model
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from sdk_strict import drop_unscored_first, Hero, fail, run_checks, validate_strict as strict



def completion_chunk(raw: str) -> Completion:
    """A streamed Completions chunk, validated strictly (an echoed prompt's
    unscored first token left out, [`drop_unscored_first`]). The SDK's
    `CompletionChoice.finish_reason` admits no null, but the API streams
    null until a choice ends (OpenAI's own stream does, and the SDK's
    stream parser accepts it), so that one field is checked here and
    everything else against the SDK's type."""
    body = json.loads(raw)
    for choice in body.get("choices", []):
        if choice.get("finish_reason", "missing") is None:
            choice["finish_reason"] = "length"
    return strict(Completion, json.dumps(drop_unscored_first(body)), "a chunk")


def sse_data(create: Any, **body: Any) -> List[str]:
    """The `data:` payloads of a streamed request made with the SDK's
    `with_streaming_response.create`, as the server wrote them."""
    with create(stream=True, **body) as r:
        if r.status_code != 200:
            fail(f"status {r.status_code}", r.read().decode())
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            fail(f"content-type {r.headers.get('content-type')!r}")
        return [line[len("data: "):] for line in r.iter_lines() if line.startswith("data: ")]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--only", action="append", default=[],
                    help="run only this check (repeatable)")
    ap.add_argument("--fim", action="store_true",
                    help="the model has fill-in-the-middle tokens (<|fim_prefix|>, ...)")
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
    model = args.model
    msgs = [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": "Once upon a time"}]
    checks: List[tuple[str, Callable[[], None]]] = []

    def check(fn: Callable[[], None]) -> Callable[[], None]:
        checks.append((fn.__name__, fn))
        return fn

    @check
    def chat_json() -> None:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=msgs, max_tokens=12, temperature=0
        )
        c = strict(ChatCompletion, raw.http_response.text, "the completion")
        sdk = raw.parse()
        if sdk.choices[0].message.content != c.choices[0].message.content:
            fail("the SDK's parse differs from the strict one")
        if c.object != "chat.completion" or not c.id.startswith("chatcmpl-"):
            fail("object or id", raw.http_response.text)
        if not c.choices[0].message.content or c.choices[0].finish_reason not in ("stop", "length"):
            fail("no text or no finish reason", raw.http_response.text)
        u = c.usage
        if u is None or u.completion_tokens < 1 or u.total_tokens != u.prompt_tokens + u.completion_tokens:
            fail("usage does not add up", raw.http_response.text)

    @check
    def chat_stream_with_usage_matches_json() -> None:
        whole = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0)
        data = sse_data(client.chat.completions.with_streaming_response.create, model=model,
                        messages=msgs, max_tokens=12, temperature=0,
                        stream_options={"include_usage": True})
        if data[-1] != "[DONE]":
            fail(f"the stream ends with {data[-1]!r}, not [DONE]")
        chunks = [strict(ChatCompletionChunk, d, "a chunk") for d in data[:-1]]
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        if text != whole.choices[0].message.content:
            fail(f"streamed {text!r}, JSON said {whole.choices[0].message.content!r}")
        if chunks[0].choices[0].delta.role != "assistant":
            fail("the first chunk does not name the role", data[0])
        finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
        if finish != [whole.choices[0].finish_reason]:
            fail(f"finish reasons {finish}")
        last = chunks[-1]
        if last.choices or last.usage is None or last.usage.completion_tokens != whole.usage.completion_tokens:
            fail("the last chunk is not the usage", data[-2])
        # The SDK's own stream iterator reads the same stream.
        sdk_text = "".join(
            ch.choices[0].delta.content or ""
            for ch in client.chat.completions.create(model=model, messages=msgs, max_tokens=12,
                                                     temperature=0, stream=True)
            if ch.choices
        )
        if sdk_text != text:
            fail(f"the SDK's iterator read {sdk_text!r}")

    @check
    def two_choices_with_logprobs() -> None:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=msgs, max_tokens=6, temperature=1, seed=7, n=2,
            logprobs=True, top_logprobs=2,
        )
        c = strict(ChatCompletion, raw.http_response.text, "the completion")
        if [ch.index for ch in c.choices] != [0, 1]:
            fail("choice indices", raw.http_response.text)
        for ch in c.choices:
            lp = ch.logprobs
            if lp is None or not lp.content:
                fail("no logprobs", raw.http_response.text)
            if "".join(t.token for t in lp.content) != ch.message.content:
                fail("the logprob tokens do not spell the text", raw.http_response.text)
            if any(len(t.top_logprobs) != 2 or t.logprob > 0 for t in lp.content):
                fail("top_logprobs", raw.http_response.text)
        again = client.chat.completions.create(
            model=model, messages=msgs, max_tokens=6, temperature=1, seed=7, n=2,
        )
        if [ch.message.content for ch in again.choices] != [ch.message.content for ch in c.choices]:
            fail("the same seed gave other choices")

    @check
    def models_list_and_retrieve() -> None:
        listed = [m.id for m in client.models.list()]
        if listed != [model]:
            fail(f"models.list gave {listed}")
        raw = client.models.with_raw_response.retrieve(model)
        m = strict(Model, raw.http_response.text, "the model")
        if m.id != model or m.object != "model":
            fail("models.retrieve", raw.http_response.text)
        try:
            client.models.retrieve("no-such/model")
            fail("an unknown model was found")
        except openai.NotFoundError as e:
            if e.body.get("code") != "model_not_found":
                fail(f"code {e.body!r}")

    @check
    def logit_bias_forces_a_token() -> None:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=msgs, max_tokens=4, temperature=0, logprobs=True,
            logit_bias={"300": 100},
        )
        c = strict(ChatCompletion, raw.http_response.text, "the completion")
        tokens = [t.token for t in c.choices[0].logprobs.content]
        if len(tokens) != 4 or len(set(tokens)) != 1:
            fail("a forced token was not every token", raw.http_response.text)
        try:
            client.chat.completions.create(model=model, messages=msgs, logit_bias={"1000000000": 5})
            fail("a token id past the vocabulary was accepted")
        except openai.BadRequestError as e:
            if e.body.get("param") != "logit_bias.1000000000":
                fail(f"param {e.body!r}")

    @check
    def stop_strings_end_the_text() -> None:
        c = client.chat.completions.create(model=model, messages=msgs, max_tokens=24,
                                           temperature=0, stop=["."])
        if "." in (c.choices[0].message.content or "") or c.choices[0].finish_reason != "stop":
            fail(f"got {c.choices[0].message.content!r}, {c.choices[0].finish_reason}")

    @check
    def completions_fill_in_the_middle() -> None:
        before, after = "Once upon a time, Lily", " and they were happy."
        if not args.fim:
            # A model without the markers refuses a suffix, naming it.
            try:
                client.completions.create(model=model, prompt=before, suffix=after, max_tokens=4)
                fail("a suffix was taken by a model without fill-in-the-middle tokens")
            except openai.BadRequestError as e:
                if e.body.get("param") != "suffix":
                    fail(f"suffix refused without naming it: {e.body!r}")
            return
        raw = client.completions.with_raw_response.create(
            model=model, prompt=before, suffix=after, max_tokens=8, temperature=0)
        c = strict(Completion, raw.http_response.text, "the completion")
        # The same greedy text as the prompt written out by hand.
        by_hand = client.completions.create(
            model=model, prompt=f"<|fim_prefix|>{before}<|fim_suffix|>{after}<|fim_middle|>",
            max_tokens=8, temperature=0)
        if c.choices[0].text != by_hand.choices[0].text or c.usage != by_hand.usage:
            fail(f"{c.choices[0].text!r} vs {by_hand.choices[0].text!r}", raw.http_response.text)

    @check
    def completions_json_and_stream() -> None:
        raw = client.completions.with_raw_response.create(
            model=model, prompt="Once upon a time", max_tokens=8, temperature=0, logprobs=2,
        )
        c = strict(Completion, raw.http_response.text, "the completion")
        if c.object != "text_completion" or not c.choices[0].text:
            fail("object or text", raw.http_response.text)
        lp = c.choices[0].logprobs
        if lp is None or "".join(lp.tokens or []) != c.choices[0].text:
            fail("logprob tokens", raw.http_response.text)
        data = sse_data(client.completions.with_streaming_response.create, model=model,
                        prompt="Once upon a time", max_tokens=8, temperature=0)
        if data[-1] != "[DONE]":
            fail("no [DONE]")
        text = "".join(completion_chunk(d).choices[0].text for d in data[:-1])
        if text != c.choices[0].text:
            fail(f"streamed {text!r}, JSON said {c.choices[0].text!r}")
        prompt = "Once upon a time"
        raw = client.completions.with_raw_response.create(model=model, prompt=prompt, max_tokens=8,
                                                          temperature=0, echo=True, logprobs=1)
        body = json.loads(raw.http_response.text)
        first = body["choices"][0]["logprobs"]
        if first["token_logprobs"][0] is not None or first["text_offset"][0] != 0:
            fail("the echoed prompt's first token is scored or not at 0", raw.http_response.text)
        echoed = strict(Completion, json.dumps(drop_unscored_first(body)), "the echoed completion")
        data = sse_data(client.completions.with_streaming_response.create, model=model,
                        prompt=prompt, max_tokens=8, temperature=0, echo=True, logprobs=1)
        chunks = [completion_chunk(d) for d in data[:-1]]
        text = "".join(ch.choices[0].text for ch in chunks)
        if text != echoed.choices[0].text or not text.startswith(prompt):
            fail(f"streamed echo {text!r}, JSON said {echoed.choices[0].text!r}")
        # The first chunk carries the prompt's scores with its first token;
        # the stream's logprobs, stitched, are the reply's: the prompt's
        # tokens (spelling it), then the 8 generated.
        want = echoed.choices[0].logprobs
        got: dict = {"tokens": [], "token_logprobs": [], "text_offset": []}
        for ch in chunks:
            lp = ch.choices[0].logprobs
            for key in got:
                got[key] += getattr(lp, key) if lp else []
        for key, values in got.items():
            if values != getattr(want, key):
                fail(f"streamed {key} {values}, JSON said {getattr(want, key)}")
        # The same answer's tokens without echo: what follows the prompt's.
        generated = len(c.choices[0].logprobs.tokens or [])
        prompt_part = "".join(want.tokens[:-generated])
        if not prompt.endswith(prompt_part) or len(prompt_part) < len(prompt) - 1:
            fail(f"the scored prompt's tokens {want.tokens[:-generated]} do not spell {prompt!r}")

    hero_schema = Hero.model_json_schema()

    @check
    def json_schema_output_parses_and_validates() -> None:
        for seed in range(5):
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=msgs, max_tokens=120, temperature=1, seed=seed,
                response_format={"type": "json_schema",
                                 "json_schema": {"name": "hero", "schema": hero_schema, "strict": True}},
            )
            c = strict(ChatCompletion, raw.http_response.text, "the completion")
            if c.choices[0].finish_reason != "stop":
                fail("the output did not end", raw.http_response.text)
            Hero.model_validate_json(c.choices[0].message.content or "")
        # A free-form object: stories260K may not close it within the
        # budget, but what it wrote is the start of an object, and if it
        # ended, the whole of one.
        whole = client.chat.completions.create(
            model=model, messages=msgs, max_tokens=60, temperature=0,
            response_format={"type": "json_object"})
        text = whole.choices[0].message.content or ""
        if whole.choices[0].finish_reason == "stop":
            if not isinstance(json.loads(text), dict):
                fail("json_object gave no object", text)
        elif not text.startswith("{"):
            fail("json_object did not start an object", text)

    @check
    def parse_with_a_pydantic_model() -> None:
        raw = client.chat.completions.with_raw_response.parse(
            model=model, messages=msgs, max_tokens=120, temperature=1, seed=11, response_format=Hero)
        strict(ChatCompletion, raw.http_response.text, "the completion")
        parsed = raw.parse().choices[0].message.parsed
        if not isinstance(parsed, Hero):
            fail(f"parsed is {parsed!r}", raw.http_response.text)
        # The SDK's streaming helper reads the same format chunk by chunk.
        with client.chat.completions.stream(model=model, messages=msgs, max_tokens=120,
                                            temperature=1, seed=11, response_format=Hero) as stream:
            for _ in stream:
                pass
            final = stream.get_final_completion()
        if final.choices[0].message.parsed != parsed:
            fail(f"stream() parsed {final.choices[0].message.parsed!r}, parse() {parsed!r}")

    @check
    def vllm_structured_outputs_through_extra_body() -> None:
        # What clients written for vLLM send: its fields in `extra_body`.
        places = ["forest", "castle", "sea"]
        for seed in range(4):
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=msgs, max_tokens=20, temperature=1, seed=seed,
                extra_body={"structured_outputs": {"choice": places}})
            c = strict(ChatCompletion, raw.http_response.text, "the completion")
            if c.choices[0].message.content not in places or c.choices[0].finish_reason != "stop":
                fail("the answer is not one of the choices", raw.http_response.text)
        text = ""
        for chunk in client.completions.create(
                model=model, prompt="Once upon a time", max_tokens=20, temperature=1, seed=5,
                stream=True, extra_body={"guided_regex": "[A-Z][a-z]{1,6} [0-9]{2}"}):
            text += "".join(ch.text for ch in chunk.choices)
        if not re.fullmatch(r"[A-Z][a-z]{1,6} [0-9]{2}", text):
            fail(f"the streamed text {text!r} does not match the regex")
        try:
            client.chat.completions.create(model=model, messages=msgs, max_tokens=5,
                                           extra_body={"guided_regex": "[a-z"})
            fail("a broken regex was accepted")
        except openai.BadRequestError as e:
            if e.body.get("param") != "guided_regex":
                fail(f"a broken regex: {e.body!r}")

    @check
    def vllm_token_limits_through_extra_body() -> None:
        # vLLM's `bad_words`, `allowed_token_ids` and
        # `include_stop_str_in_output`, as its clients send them.
        plain = client.completions.create(model=model, prompt="Once upon a time",
                                          max_tokens=24, temperature=0)
        words = [w for w in plain.choices[0].text.split(" ") if len(w) > 3 and w.isalpha()]
        if len(words) < 2:
            fail(f"no word to ban in {plain.choices[0].text!r}")
        word = words[1]
        raw = client.completions.with_raw_response.create(
            model=model, prompt="Once upon a time", max_tokens=24, temperature=0,
            extra_body={"bad_words": [word]})
        banned = strict(Completion, raw.http_response.text, "the completion")
        if f" {word}" in banned.choices[0].text:
            fail(f"the banned word {word!r} is in {banned.choices[0].text!r}")
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=msgs, max_tokens=6, temperature=1, seed=2, logprobs=True,
            extra_body={"allowed_token_ids": [300]})
        c = strict(ChatCompletion, raw.http_response.text, "the completion")
        got = {t.token for t in c.choices[0].logprobs.content}
        if len(got) != 1 or c.choices[0].finish_reason != "length":
            fail("one allowed token is not every token", raw.http_response.text)
        stop = f" {word}"
        kept = client.completions.create(
            model=model, prompt="Once upon a time", max_tokens=24, temperature=0, stop=[stop],
            extra_body={"include_stop_str_in_output": True})
        if not kept.choices[0].text.endswith(stop) or kept.choices[0].finish_reason != "stop":
            fail(f"the stop string is not kept: {kept.choices[0].text!r}")

    weather_tool = {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city.",
        "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                       "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20}}}}}

    @check
    def a_forced_tool_call_parses_json_and_stream() -> None:
        ask = [{"role": "user", "content": "What is the weather in Paris?"}]
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=ask, tools=[weather_tool], tool_choice="required",
            max_tokens=80, temperature=1, seed=3)
        c = strict(ChatCompletion, raw.http_response.text, "the completion")
        calls = c.choices[0].message.tool_calls or []
        if c.choices[0].finish_reason != "tool_calls" or not calls:
            fail("no tool call", raw.http_response.text)
        for call in calls:
            if call.function.name != "get_weather" or not call.id.startswith("call_"):
                fail("the call", raw.http_response.text)
            if not isinstance(json.loads(call.function.arguments).get("city"), str):
                fail("the arguments", raw.http_response.text)
        # Streamed: strict chunks, and the SDK's accumulator rebuilds the call.
        data = sse_data(client.chat.completions.with_streaming_response.create, model=model,
                        messages=ask, tools=[weather_tool], parallel_tool_calls=False,
                        tool_choice={"type": "function", "function": {"name": "get_weather"}},
                        max_tokens=80, temperature=1, seed=3)
        chunks = [strict(ChatCompletionChunk, d, "a chunk") for d in data[:-1]]
        if any(ch.choices and ch.choices[0].delta.content for ch in chunks):
            fail("a forced call streamed text", "\n".join(data))
        with client.chat.completions.stream(
                model=model, messages=ask, tools=[weather_tool], parallel_tool_calls=False,
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
                max_tokens=80, temperature=1, seed=3) as stream:
            for _ in stream:
                pass
            final = stream.get_final_completion()
        streamed = final.choices[0].message.tool_calls or []
        if len(streamed) != 1 or streamed[0].function.arguments != calls[0].function.arguments:
            fail(f"the stream's call {streamed!r} differs from the JSON's {calls[0]!r}")
        # The call and its result go back: the next turn sees them.
        follow = ask + [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": calls[0].id, "type": "function",
                 "function": {"name": "get_weather", "arguments": calls[0].function.arguments}}]},
            {"role": "tool", "tool_call_id": calls[0].id, "content": "Sunny, 21 C."},
        ]
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=follow, tools=[weather_tool], tool_choice="none",
            max_tokens=12, temperature=0)
        nxt = strict(ChatCompletion, raw.http_response.text, "the completion")
        if nxt.choices[0].message.tool_calls or not nxt.choices[0].message.content:
            fail("tool_choice none gave no text", raw.http_response.text)

    @check
    def errors_are_the_sdks_exceptions() -> None:
        try:
            client.chat.completions.create(model=model, messages=msgs, temperature=5)
            fail("temperature 5 was accepted")
        except openai.BadRequestError as e:
            if e.body.get("param") != "temperature":
                fail(f"param {e.body!r}")
        try:
            client.chat.completions.create(model="no-such-model", messages=msgs)
            fail("an unknown model was accepted")
        except openai.NotFoundError as e:
            if e.body.get("code") != "model_not_found":
                fail(f"code {e.body!r}")
        try:
            client.chat.completions.create(
                model=model, messages=msgs,
                response_format={"type": "json_schema", "json_schema": {
                    "name": "n", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}})
            fail("an unsatisfiable schema was accepted")
        except openai.BadRequestError as e:
            if e.body.get("param") != "response_format":
                fail(f"param {e.body!r}")

    if args.only:
        unknown = set(args.only) - {name for name, _ in checks}
        if unknown:
            print(f"FAIL: no such checks: {sorted(unknown)}")
            return 1
        checks = [(name, fn) for name, fn in checks if name in args.only]
    return run_checks(checks)


if __name__ == "__main__":
    sys.exit(main())
