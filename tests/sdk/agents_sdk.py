#!/usr/bin/env python3
"""The OpenAI Agents SDK (`openai-agents`, pinned in requirements.txt)
running an agent with one function tool against tokenwire's Responses API:

    python agents_sdk.py --base-url http://127.0.0.1:8080/v1 --model stories260K

Over HTTP (`OpenAIResponsesModel` on an `AsyncOpenAI` client) and over the
Responses WebSocket mode (the pinned version's
`responses_websocket_session`). The agent's first turn must call the tool
(`tool_choice="required"`, which tokenwire forces with its grammar, so even
stories260K calls it with arguments that parse); the SDK runs the tool and
sends its output back as a `function_call_output` item; the next turn ends
the run with a message. The tool is offered only until its first call
(`is_enabled`): offered again (the SDK resets `tool_choice` to auto after a
call), SmolLM2-135M, sampled, called it turn after turn or rambled past
`max_tokens`, whichever the last bits of the arithmetic picked, so the
checks passed or failed by the luck of the sampled tokens.

Each check prints `ok: <name>` or `FAIL: <name>: <reason>`; exit status 0
only when every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Annotated, Any, Awaitable, Callable, List

import pydantic
from agents import (Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool,
                    responses_websocket_session, set_tracing_disabled)
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
from openai import AsyncOpenAI

from sdk_strict import fail, run_checks


def make_agent(model: Any, calls: List[str]) -> Agent:
    # Offered until it has been called once: the next turn can only answer.
    @function_tool(is_enabled=lambda _ctx, _agent: not calls)
    def get_weather(city: Annotated[str, pydantic.Field(min_length=1, max_length=20)]) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"It is sunny in {city}."

    return Agent(
        name="weather",
        instructions="You answer questions about the weather. Call get_weather first.",
        model=model,
        tools=[get_weather],
        model_settings=ModelSettings(tool_choice="required", temperature=1, max_tokens=160),
    )


def check_run(result: Any, calls: List[str]) -> None:
    kinds = [type(i).__name__ for i in result.new_items]
    called = [i for i in result.new_items if isinstance(i, ToolCallItem)]
    outputs = [i for i in result.new_items if isinstance(i, ToolCallOutputItem)]
    messages = [i for i in result.new_items if isinstance(i, MessageOutputItem)]
    if not called or not calls:
        fail(f"the tool was not called: {kinds}")
    for item in called:
        args = json.loads(item.raw_item.arguments)
        if not isinstance(args.get("city"), str):
            fail(f"arguments {item.raw_item.arguments!r}")
    if len(outputs) != len(called):
        fail(f"{len(called)} calls but {len(outputs)} outputs: {kinds}")
    if not messages or not isinstance(result.final_output, str) or not result.final_output:
        fail(f"no final message: {kinds}, final_output {result.final_output!r}")
    if kinds.index("MessageOutputItem") < kinds.index("ToolCallOutputItem"):
        fail(f"the final message came before the tool's output: {kinds}")
    print(f"  items {kinds}, tool called with {calls}, final output {result.final_output[:60]!r}")


def agent_checks(args: argparse.Namespace) -> List[tuple[str, Callable[[], Awaitable[None]]]]:
    """The checks, each a coroutine function."""
    set_tracing_disabled(True)
    checks: List[tuple[str, Callable[[], Awaitable[None]]]] = []

    def check(fn: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
        checks.append((fn.__name__, fn))
        return fn

    @check
    async def http_agent_calls_its_tool_and_answers() -> None:
        client = AsyncOpenAI(base_url=args.base_url, api_key="unused", max_retries=0)
        calls: List[str] = []
        agent = make_agent(OpenAIResponsesModel(model=args.model, openai_client=client), calls)
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=4)
        check_run(result, calls)

    @check
    async def websocket_agent_calls_its_tool_and_answers() -> None:
        ws_base = args.base_url.replace("http://", "ws://").replace("https://", "wss://")
        calls: List[str] = []
        async with responses_websocket_session(api_key="unused", base_url=args.base_url,
                                               websocket_base_url=ws_base) as session:
            agent = make_agent(args.model, calls)
            result = await session.run(agent, "What is the weather in Paris?", max_turns=4)
        check_run(result, calls)

    return checks


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    args = ap.parse_args()
    checks = agent_checks(args)
    # Each check on an event loop of its own, with a time limit.
    return run_checks([(name, lambda fn=fn: asyncio.run(asyncio.wait_for(fn(), timeout=120)))
                       for name, fn in checks])


if __name__ == "__main__":
    sys.exit(main())
