#!/usr/bin/env python3
"""LangChain's `ChatOpenAI` (langchain-openai, pinned in requirements.txt)
against tokenwire's Chat Completions route, a second widely used client of
it beside the official SDK:

    python langchain_chat.py --base-url http://127.0.0.1:8080/v1 --model stories260K

Checks: `invoke` gives the text the route gives the official SDK,
`stream` spells the same text with usage metadata at the end, `batch`
answers each conversation, `n=2` through `generate` gives two
generations, `with_structured_output` with a pydantic model gives that
model, and `bind_tools` with a forced choice gives `tool_calls` whose
arguments parse into the tool's types. Each check prints
`ok: <name>` or `FAIL: <name>: <reason>`; exit status 0 only when all passed.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, List

import openai
import pydantic
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from openai import OpenAI

from sdk_strict import Hero, fail, run_checks



def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    common = dict(base_url=args.base_url, api_key="unused", model=args.model, max_retries=0)
    llm = ChatOpenAI(temperature=0, max_tokens=12, **common)
    sdk = OpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
    convo = [SystemMessage("Tell a story."), HumanMessage("Once upon a time")]
    wire = [{"role": "system", "content": "Tell a story."}, {"role": "user", "content": "Once upon a time"}]
    checks: List[tuple[str, Callable[[], None]]] = []

    def check(fn: Callable[[], None]) -> Callable[[], None]:
        checks.append((fn.__name__, fn))
        return fn

    @check
    def invoke_matches_the_sdk() -> None:
        reply = llm.invoke(convo)
        want = sdk.chat.completions.create(model=args.model, messages=wire, max_tokens=12,
                                           temperature=0).choices[0].message.content
        if reply.content != want:
            fail(f"LangChain read {reply.content!r}, the SDK {want!r}")
        usage = reply.usage_metadata
        if not usage or usage["output_tokens"] < 1:
            fail(f"usage metadata {usage!r}")
        if reply.response_metadata.get("finish_reason") not in ("stop", "length"):
            fail(f"finish reason {reply.response_metadata!r}")

    @check
    def stream_spells_the_same_text_and_ends_with_usage() -> None:
        whole = llm.invoke(convo).content
        chunks = list(ChatOpenAI(temperature=0, max_tokens=12, stream_usage=True, **common).stream(convo))
        text = "".join(c.content for c in chunks)
        if text != whole:
            fail(f"streamed {text!r}, invoked {whole!r}")
        total = None
        for c in chunks:
            total = c if total is None else total + c
        if total is None or not total.usage_metadata or total.usage_metadata["output_tokens"] < 1:
            fail(f"no usage at the end of the stream: {getattr(total, 'usage_metadata', None)!r}")

    @check
    def batch_answers_each_conversation() -> None:
        replies = llm.batch([[HumanMessage("Once upon a time")], [HumanMessage("Lily and Ben")]])
        if len(replies) != 2 or not all(r.content for r in replies) or replies[0].content == replies[1].content:
            fail(f"batch gave {[r.content for r in replies]!r}")

    @check
    def n_two_gives_two_generations() -> None:
        result = ChatOpenAI(temperature=1, max_tokens=6, n=2, seed=3, **common).generate([convo])
        gens = result.generations[0]
        if len(gens) != 2 or not all(g.text for g in gens):
            fail(f"generations {[g.text for g in gens]!r}")

    @check
    def with_structured_output_gives_the_pydantic_model() -> None:
        # LangChain's own path for OpenAI-compatible servers: `response_format`
        # with the model's JSON Schema, parsed back into the model.
        structured = ChatOpenAI(temperature=1, max_tokens=120, seed=5, **common) \
            .with_structured_output(Hero, method="json_schema", strict=True, include_raw=True)
        out = structured.invoke(convo)
        if out.get("parsing_error") is not None or not isinstance(out.get("parsed"), Hero):
            fail(f"parsed {out.get('parsed')!r}, error {out.get('parsing_error')!r}")
        if out["raw"].response_metadata.get("finish_reason") != "stop":
            fail(f"the output did not end: {out['raw']!r}")

    @check
    def bind_tools_gives_tool_calls_with_parsed_args() -> None:
        class AddArgs(pydantic.BaseModel):
            # Bounded, so a small model always finishes the numbers.
            a: int = pydantic.Field(ge=0, le=100)
            b: int = pydantic.Field(ge=0, le=100)

        @tool(args_schema=AddArgs)
        def add(a: int, b: int) -> int:
            """Adds two numbers."""
            return a + b

        caller = ChatOpenAI(temperature=1, max_tokens=80, seed=2, **common)
        ask = [HumanMessage("What is 2 plus 3?")]
        for choice in ("add", "any"):
            msg = caller.bind_tools([add], tool_choice=choice, strict=True).invoke(ask)
            calls = msg.tool_calls
            if not calls or calls[0]["name"] != "add" or msg.invalid_tool_calls:
                fail(f"tool_choice={choice}: {msg!r}")
            args = calls[0]["args"]
            if not isinstance(args.get("a"), int) or not isinstance(args.get("b"), int):
                fail(f"tool_choice={choice}: args {args!r}")
            # The tool runs on what the model asked for.
            add.invoke(args)

    return run_checks(checks)


if __name__ == "__main__":
    sys.exit(main())
