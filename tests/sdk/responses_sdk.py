#!/usr/bin/env python3
"""End-to-end check of tokenwire's `responses` dialect with the official OpenAI Python SDK.

Runs against a tokenwire server that is already up, using only the `openai`
package (pinned in requirements.txt) and what it brings along (`websockets`
for WebSocket mode, `httpx2` for HTTP, `pydantic` for its types):

    python responses_sdk.py --base-url http://127.0.0.1:8080/v1 --model stories260K

Every event and Response object the server sends is validated with the SDK's
own pydantic types in strict mode, and no field may be unknown to them (no
`model_extra`, at any depth). Each check prints `ok: <name>` or
`FAIL: <name>: <reason>` (with the offending frame's text); the exit status is
0 only when every check passed.

Optional checks that need the server started with particular flags:

  --max-connections N   server started with `--max-websocket-connections N`:
                        N connections are accepted, the next gets
                        `websocket_connection_limit_reached` and close 1013.
  --lifetime-check      server started with `--responses-expiring-after 1
                        --responses-lifetime 2` (or the values given with
                        --expiring-after / --close-after): a connection is
                        warned `connection_expiring`, then closed with 1000.
                        Only this check runs then, since such a short lifetime
                        would cut the other WebSocket checks short.

The model is assumed to be greedy-deterministic at temperature 0.
stories260K rarely emits EOS within a few tokens, so most checks accept either
`response.completed` or `response.incomplete` (reason `max_output_tokens`);
the checks that need `response.completed` (the SDK's `stream()` helper
requires it for `get_final_response()`) use --complete-prompt with
--complete-max-tokens, a prompt the model finishes by itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
import zlib
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Dict, List, Optional, Tuple, Type, get_args, get_origin

import httpx2
import openai
import pydantic
from openai import OpenAI
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.responses_server_event import ResponsesServerEvent
from websockets.exceptions import ConnectionClosed

from sdk_strict import CheckFailed, Hero, fail, find_extras, validate_strict

# ---------------------------------------------------------------------------
# Strict validation with the SDK's own types
# ---------------------------------------------------------------------------


def _members_by_type(union: Any) -> Dict[str, Type[pydantic.BaseModel]]:
    """Maps each `type` literal of a union of event models to its model class.

    The SDK marks its event unions with its own `PropertyInfo(discriminator=...)`,
    which pydantic does not read, so validating against the bare union reports
    one error per member. Picking the member by `type` first gives short errors.
    """
    if get_origin(union) is Annotated:
        union = get_args(union)[0]
    members: Dict[str, Type[pydantic.BaseModel]] = {}
    for model in get_args(union):
        for literal in get_args(model.model_fields["type"].annotation):
            members[literal] = model
    return members


WS_EVENT_TYPES = _members_by_type(ResponsesServerEvent)
SSE_EVENT_TYPES = _members_by_type(ResponseStreamEvent)


def validate_event(members: Dict[str, Type[pydantic.BaseModel]], raw: str, what: str) -> Any:
    """Validates one event's JSON text against the member of an SDK event union its `type` names."""
    try:
        kind = json.loads(raw).get("type")
    except (ValueError, AttributeError):
        fail(f"{what} is not a JSON object", raw)
    if kind not in members:
        fail(f"{what} has type {kind!r}, which the SDK's event union does not know", raw)
    return validate_strict(members[kind], raw, what)


@dataclass
class Received:
    """One server event: its JSON text and its strictly validated SDK model."""

    raw: str
    model: Any

    @property
    def type(self) -> str:
        return self.model.type


# ---------------------------------------------------------------------------
# Following one response's event stream
# ---------------------------------------------------------------------------

TERMINAL_TYPES = ("response.completed", "response.incomplete", "response.failed")
TERMINAL_STATUSES = {
    "response.completed": ("completed",),
    "response.incomplete": ("incomplete", "cancelled"),
    "response.failed": ("failed",),
}


@dataclass
class PartState:
    """One output_text content part of a message item, as the events built it."""

    deltas: List[str] = field(default_factory=list)
    done_text: Optional[str] = None
    part_done: bool = False


@dataclass
class ItemState:
    """One output item, from output_item.added to output_item.done."""

    item_id: str
    parts: Dict[int, PartState] = field(default_factory=dict)
    done: bool = False
    # A function_call item: its argument deltas and final arguments.
    call: bool = False
    arg_deltas: List[str] = field(default_factory=list)
    arguments: Optional[str] = None


class ResponseTracker:
    """Checks the event stream of one response against the contract.

    Rules: the first event is response.created with sequence_number 0 and an
    empty output; sequence_number strictly increases; lifecycle events carry
    the same `resp_` id; every item (a `msg_` message) and content part that
    was added is done, with text equal to its deltas, before exactly one
    terminal event, whose Response lists the same items and whose status fits
    the event type; nothing follows the terminal event.
    """

    def __init__(self, where: str, stream_id: Optional[str] = None) -> None:
        self.where = where
        self.stream_id = stream_id
        self.events: List[Received] = []
        self.response_id: Optional[str] = None
        self.last_seq: Optional[int] = None
        self.items: Dict[int, ItemState] = {}
        self.final: Optional[Response] = None
        self.terminal_type: Optional[str] = None

    @property
    def finished(self) -> bool:
        """True once the terminal event was seen."""
        return self.final is not None

    @property
    def text(self) -> str:
        """All output_text deltas, concatenated in output and content order."""
        return "".join(
            "".join(part.deltas)
            for _, item in sorted(self.items.items())
            for _, part in sorted(item.parts.items())
        )

    @property
    def delta_count(self) -> int:
        return sum(len(part.deltas) for item in self.items.values() for part in item.parts.values())

    def _fail(self, reason: str, ev: Received) -> None:
        fail(f"{self.where}: {reason}", ev.raw)

    def feed(self, ev: Received) -> None:
        """Checks one event of this response and records what it adds."""
        m = ev.model
        if self.final is not None:
            self._fail(f"{ev.type} arrived after the terminal event {self.terminal_type}", ev)
        if ev.type == "error":
            self._fail("unexpected error event", ev)
        seq = m.sequence_number
        if self.last_seq is None:
            if ev.type != "response.created":
                self._fail("the first event of a response must be response.created", ev)
            if seq != 0:
                self._fail(f"the first sequence_number is {seq}, not 0", ev)
        elif seq <= self.last_seq:
            self._fail(f"sequence_number {seq} does not increase (previous {self.last_seq})", ev)
        self.last_seq = seq
        got_stream_id = getattr(m, "stream_id", None)
        if got_stream_id != self.stream_id:
            self._fail(f"stream_id is {got_stream_id!r}, expected {self.stream_id!r}", ev)
        self.events.append(ev)
        handler = getattr(self, "_on_" + ev.type.replace("response.", "").replace(".", "_"), None)
        if handler is None:
            self._fail(f"unexpected event type {ev.type} for a text response", ev)
        handler(ev)

    # -- lifecycle -----------------------------------------------------------

    def _check_same_response(self, ev: Received) -> None:
        if ev.model.response.id != self.response_id:
            self._fail(f"response id {ev.model.response.id!r} differs from {self.response_id!r}", ev)

    def _on_created(self, ev: Received) -> None:
        response = ev.model.response
        if not response.id.startswith("resp_"):
            self._fail(f"response id {response.id!r} lacks the resp_ prefix", ev)
        if response.output != []:
            self._fail("response.created must carry an empty output", ev)
        if response.status not in ("in_progress", "queued"):
            self._fail(f"response.created has status {response.status!r}", ev)
        self.response_id = response.id

    def _on_in_progress(self, ev: Received) -> None:
        self._check_same_response(ev)
        if ev.model.response.status != "in_progress":
            self._fail(f"response.in_progress has status {ev.model.response.status!r}", ev)

    # -- items and parts -----------------------------------------------------

    def _item(self, ev: Received, output_index: int, item_id: Optional[str] = None) -> ItemState:
        item = self.items.get(output_index)
        if item is None:
            self._fail(f"output_index {output_index} was never added", ev)
        if item.done:
            self._fail(f"output item {output_index} is already done", ev)
        if item_id is not None and item_id != item.item_id:
            self._fail(f"item_id {item_id!r} is not the id {item.item_id!r} of output {output_index}", ev)
        return item

    def _part(self, ev: Received) -> PartState:
        m = ev.model
        item = self._item(ev, m.output_index, m.item_id)
        part = item.parts.get(m.content_index)
        if part is None:
            self._fail(f"content_index {m.content_index} was never added", ev)
        if part.part_done:
            self._fail(f"content part {m.content_index} is already done", ev)
        return part

    def _on_output_item_added(self, ev: Received) -> None:
        m = ev.model
        if m.output_index in self.items:
            self._fail(f"output_index {m.output_index} added twice", ev)
        item = m.item
        if item.type == "function_call":
            if not item.id.startswith("fc_") or not item.call_id.startswith("call_"):
                self._fail(f"function_call ids {item.id!r}, {item.call_id!r}", ev)
            if item.status != "in_progress" or item.arguments != "":
                self._fail("an added function_call must be in_progress with empty arguments", ev)
            self.items[m.output_index] = ItemState(item_id=item.id, call=True)
            return
        if item.type != "message" or item.role != "assistant":
            self._fail(f"expected an assistant message item, got {item.type!r}", ev)
        if not item.id.startswith("msg_"):
            self._fail(f"message id {item.id!r} lacks the msg_ prefix", ev)
        if item.status != "in_progress" or item.content != []:
            # The SDK's stream() helper appends each content_part.added to the
            # item's content, so an item must start empty.
            self._fail("an added message must be in_progress with empty content", ev)
        self.items[m.output_index] = ItemState(item_id=item.id)

    def _on_content_part_added(self, ev: Received) -> None:
        m = ev.model
        item = self._item(ev, m.output_index, m.item_id)
        if m.content_index in item.parts:
            self._fail(f"content_index {m.content_index} added twice", ev)
        if m.part.type != "output_text" or m.part.text != "":
            # The SDK's stream() helper appends deltas to this part's text.
            self._fail("an added content part must be output_text with empty text", ev)
        item.parts[m.content_index] = PartState()

    def _on_output_text_delta(self, ev: Received) -> None:
        part = self._part(ev)
        if part.done_text is not None:
            self._fail("delta after output_text.done", ev)
        part.deltas.append(ev.model.delta)

    def _on_output_text_done(self, ev: Received) -> None:
        part = self._part(ev)
        if part.done_text is not None:
            self._fail("output_text.done twice", ev)
        joined = "".join(part.deltas)
        if ev.model.text != joined:
            self._fail(f"output_text.done text {ev.model.text!r} != concatenated deltas {joined!r}", ev)
        part.done_text = ev.model.text

    def _on_content_part_done(self, ev: Received) -> None:
        part = self._part(ev)
        if part.done_text is None:
            self._fail("content_part.done before output_text.done", ev)
        if ev.model.part.type != "output_text" or ev.model.part.text != part.done_text:
            self._fail("content_part.done text differs from output_text.done", ev)
        part.part_done = True

    def _on_function_call_arguments_delta(self, ev: Received) -> None:
        item = self._item(ev, ev.model.output_index, ev.model.item_id)
        if not item.call or item.arguments is not None:
            self._fail("arguments delta for a message, or after arguments.done", ev)
        item.arg_deltas.append(ev.model.delta)

    def _on_function_call_arguments_done(self, ev: Received) -> None:
        item = self._item(ev, ev.model.output_index, ev.model.item_id)
        if not item.call or ev.model.arguments != "".join(item.arg_deltas):
            self._fail("function_call_arguments.done differs from its deltas", ev)
        item.arguments = ev.model.arguments

    def _on_output_item_done(self, ev: Received) -> None:
        m = ev.model
        item = self._item(ev, m.output_index, m.item.id)
        if item.call:
            if m.item.type != "function_call" or m.item.arguments != item.arguments \
                    or m.item.status != "completed":
                self._fail("output_item.done differs from the streamed call", ev)
            item.done = True
            return
        if not all(part.part_done for part in item.parts.values()):
            self._fail("output_item.done before all its content parts are done", ev)
        texts = [c.text for c in m.item.content if c.type == "output_text"]
        expected = [part.done_text for _, part in sorted(item.parts.items())]
        if texts != expected:
            self._fail(f"output_item.done content {texts!r} != the streamed parts {expected!r}", ev)
        if m.item.status == "in_progress":
            self._fail("output_item.done carries status in_progress", ev)
        item.done = True

    # -- terminal ------------------------------------------------------------

    def _on_terminal(self, ev: Received) -> None:
        self._check_same_response(ev)
        response: Response = ev.model.response
        if response.status not in TERMINAL_STATUSES[ev.type]:
            self._fail(f"{ev.type} carries status {response.status!r}", ev)
        open_items = [i for i, item in self.items.items() if not item.done]
        if open_items:
            self._fail(f"output items {open_items} were added but not done before {ev.type}", ev)
        streamed = [(item.item_id, item.arguments if item.call
                     else [p.done_text for _, p in sorted(item.parts.items())])
                    for _, item in sorted(self.items.items())]
        final = [(o.id, o.arguments if o.type == "function_call"
                  else [c.text for c in o.content if c.type == "output_text"])
                 for o in response.output]
        if final != streamed or len(response.output) != len(self.items):
            self._fail(f"the final output {final!r} differs from the streamed items {streamed!r}", ev)
        if ev.type == "response.failed":
            if response.error is None or response.error.code != "server_error":
                self._fail("response.failed must carry error.code server_error", ev)
        check_usage(response, self.where, ev.raw)
        self.final = response
        self.terminal_type = ev.type

    _on_completed = _on_terminal
    _on_incomplete = _on_terminal
    _on_failed = _on_terminal


def check_usage(response: Response, where: str, raw: str) -> None:
    """Checks a finished Response's usage block for internal consistency."""
    usage = response.usage
    if usage is None:
        fail(f"{where}: a finished response must carry usage", raw)
    if usage.total_tokens != usage.input_tokens + usage.output_tokens:
        fail(f"{where}: usage total_tokens != input_tokens + output_tokens", raw)
    if usage.output_tokens_details.reasoning_tokens != 0:
        fail(f"{where}: reasoning_tokens must be 0", raw)
    if not 0 <= usage.input_tokens_details.cached_tokens <= usage.input_tokens:
        fail(f"{where}: cached_tokens out of range", raw)


def check_finished_normally(tracker: ResponseTracker, budget: int) -> Response:
    """Requires a finish by EOS within the budget (completed) or by the budget (incomplete)."""
    final = tracker.final
    assert final is not None and final.usage is not None
    raw = tracker.events[-1].raw
    if final.status == "completed":
        if final.incomplete_details is not None or final.usage.output_tokens > budget:
            fail(f"{tracker.where}: a completed response has incomplete_details or exceeds the budget", raw)
    elif final.status == "incomplete":
        if final.incomplete_details is None or final.incomplete_details.reason != "max_output_tokens":
            fail(f"{tracker.where}: an incomplete response must say reason max_output_tokens", raw)
        if final.usage.output_tokens != budget:
            fail(f"{tracker.where}: incomplete by max_output_tokens after "
                 f"{final.usage.output_tokens} of {budget} tokens", raw)
    else:
        fail(f"{tracker.where}: expected completed or incomplete, got {final.status!r}", raw)
    if final.output_text != tracker.text:
        fail(f"{tracker.where}: final output_text {final.output_text!r} != deltas {tracker.text!r}", raw)
    if final.usage.output_tokens > 0 and not 1 <= tracker.delta_count <= final.usage.output_tokens:
        fail(f"{tracker.where}: {tracker.delta_count} deltas for {final.usage.output_tokens} tokens", raw)
    return final


def check_completed(tracker: ResponseTracker, budget: int) -> Response:
    """Requires response.completed (the model stopped by itself within the budget)."""
    final = check_finished_normally(tracker, budget)
    if tracker.terminal_type != "response.completed":
        fail(f"{tracker.where}: expected response.completed; the model did not stop within "
             f"{budget} tokens (try another --complete-prompt)", tracker.events[-1].raw)
    return final


# ---------------------------------------------------------------------------
# WebSocket mode through client.responses.connect()
# ---------------------------------------------------------------------------


def ws_recv(conn: Any) -> Received:
    """Receives one event through the SDK, parses it as the SDK does, and validates it strictly."""
    raw_bytes = conn.recv_bytes()
    raw = raw_bytes.decode("utf-8")
    conn.parse_event(raw_bytes)  # the SDK's own (lenient) parse must not raise
    return Received(raw, validate_event(WS_EVENT_TYPES, raw, "WebSocket event"))


def expect_ws_error(ev: Received, code: str, status: Optional[int]) -> None:
    """Requires an `error` event with this code (and HTTP-like status, when given)."""
    if ev.type != "error":
        fail(f"expected an error event {code!r}, got {ev.type}", ev.raw)
    error = ev.model.error
    if error.code != code:
        fail(f"expected error code {code!r}, got {error.code!r}", ev.raw)
    if status is not None and ev.model.status != status:
        fail(f"error {code} has status {ev.model.status!r}, expected {status}", ev.raw)
    if ev.model.status is not None:
        want_type = "server_error" if ev.model.status >= 500 else "invalid_request_error"
        if error.type != want_type:
            fail(f"error {code} has type {error.type!r}, expected {want_type!r}", ev.raw)
    if not error.message:
        fail(f"error {code} has an empty message", ev.raw)


def ws_collect(conn: Any, tracker: ResponseTracker,
               on_event: Optional[Callable[[Received], None]] = None,
               allowed_errors: Tuple[str, ...] = ()) -> List[Received]:
    """Feeds events to the tracker until its terminal event; returns the allowed errors seen.

    `on_event` runs for each response event before the next is read (to send
    a cancel or a second create at the right moment).
    """
    errors: List[Received] = []
    while not tracker.finished:
        ev = ws_recv(conn)
        if ev.type == "error" and ev.model.error.code in allowed_errors:
            errors.append(ev)
            continue
        tracker.feed(ev)
        if on_event is not None:
            on_event(ev)
    return errors


def ws_respond(conn: Any, where: str, stream_id: Optional[str] = None, **create: Any) -> ResponseTracker:
    """Sends one response.create through the SDK and follows the response to its end."""
    if stream_id is not None:
        create["stream_id"] = stream_id
    conn.response.create(**create)
    tracker = ResponseTracker(where, stream_id=stream_id)
    ws_collect(conn, tracker)
    return tracker



class Checks:
    """The checks, one method each; `run` prints one line per check."""

    FIRST_INPUT = "Once upon a time"
    NEXT_INPUT = "Then they went home."

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.model = args.model
        self.small = args.max_tokens
        transport = RecordingTransport()
        self.recorder = transport
        self.client = OpenAI(
            base_url=args.base_url,
            api_key=args.api_key,
            max_retries=0,
            timeout=args.timeout,
            http_client=openai.DefaultHttpxClient(transport=transport),
        )

    # -- helpers -------------------------------------------------------------

    def create_args(self, budget: Optional[int] = None, **more: Any) -> Dict[str, Any]:
        """The common create parameters: the model, greedy sampling, a token budget."""
        return {"model": self.model, "temperature": 0,
                "max_output_tokens": self.small if budget is None else budget, **more}

    def history(self, *turns: Tuple[str, str]) -> List[Dict[str, str]]:
        """Explicit input items for a conversation given as (role, text) turns."""
        return [{"type": "message", "role": role, "content": text} for role, text in turns]

    def ws_reference(self, conn: Any, where: str, input_items: List[Dict[str, str]]) -> Response:
        """A fresh response over an explicit conversation, to compare a continuation with."""
        tracker = ws_respond(conn, where, **self.create_args(input=input_items))
        return check_finished_normally(tracker, self.small)

    def same_generation(self, got: Response, want: Response, what: str) -> None:
        """Requires the same prompt length and greedy output as the reference response."""
        assert got.usage is not None and want.usage is not None
        if got.usage.input_tokens != want.usage.input_tokens or got.output_text != want.output_text:
            fail(f"{what}: the continuation saw a different prompt than the explicit conversation "
                 f"(input_tokens {got.usage.input_tokens} vs {want.usage.input_tokens}, "
                 f"text {got.output_text!r} vs {want.output_text!r})")

    # -- WebSocket checks ----------------------------------------------------

    def ws_create_completed(self) -> None:
        """A create streams deltas and ends with response.completed; echoes what was sent."""
        budget = self.args.complete_max_tokens
        metadata = {"check": "ws_create_completed"}
        with self.client.responses.connect() as conn:
            tracker = ws_respond(conn, "ws create", **self.create_args(
                budget, input=self.args.complete_prompt, metadata=metadata))
        final = check_completed(tracker, budget)
        raw = tracker.events[-1].raw
        echoed = json.loads(raw)["response"]
        for key, want in (("model", self.model), ("temperature", 0), ("max_output_tokens", budget),
                          ("metadata", metadata), ("previous_response_id", None),
                          ("parallel_tool_calls", False), ("tool_choice", "auto"), ("tools", [])):
            if key not in echoed or echoed[key] != want or type(echoed[key]) is not type(want):
                fail(f"Response.{key} is {echoed.get(key, '<missing>')!r}, expected {want!r} as sent", raw)
        if final.usage is None or final.usage.input_tokens <= 0:
            fail("usage.input_tokens must count the prompt", raw)

    def ws_create_budget(self) -> None:
        """A small-budget create ends by max_output_tokens (or EOS); stream_id is echoed."""
        with self.client.responses.connect() as conn:
            tracker = ws_respond(conn, "ws create (small budget)", stream_id="lane-1",
                                 **self.create_args(input=self.FIRST_INPUT))
        check_finished_normally(tracker, self.small)

    def ws_continuation(self) -> None:
        """previous_response_id continues from the cached response: old conversation + new input."""
        with self.client.responses.connect() as conn:
            first = check_finished_normally(
                ws_respond(conn, "ws first", **self.create_args(input=self.FIRST_INPUT)), self.small)
            second_tracker = ws_respond(conn, "ws continuation", **self.create_args(
                input=self.NEXT_INPUT, previous_response_id=first.id))
            second = check_finished_normally(second_tracker, self.small)
            if second.previous_response_id != first.id:
                fail(f"previous_response_id echoed as {second.previous_response_id!r}",
                     second_tracker.events[-1].raw)
            reference = self.ws_reference(conn, "ws explicit conversation", self.history(
                ("user", self.FIRST_INPUT), ("assistant", first.output_text), ("user", self.NEXT_INPUT)))
        self.same_generation(second, reference, "ws continuation")

    def ws_unknown_previous(self) -> None:
        """An unknown previous_response_id is error 404 previous_response_not_found; the socket stays."""
        with self.client.responses.connect() as conn:
            conn.response.create(**self.create_args(
                input=self.NEXT_INPUT, previous_response_id="resp_00000000-0000-7000-8000-000000000000"))
            expect_ws_error(ws_recv(conn), "previous_response_not_found", 404)
            tracker = ws_respond(conn, "ws create after the error", **self.create_args(input=self.FIRST_INPUT))
        check_finished_normally(tracker, self.small)

    def ws_cancel(self) -> None:
        """response.cancel mid-stream ends the response with status cancelled, incomplete_details null."""
        budget = self.args.cancel_max_tokens
        with self.client.responses.connect() as conn:
            sent = []

            def cancel_on_first_delta(ev: Received) -> None:
                if ev.type == "response.output_text.delta" and not sent:
                    # The SDK has no typed helper for this tokenwire extension.
                    conn.send_raw(json.dumps({"type": "response.cancel"}))
                    sent.append(True)

            conn.response.create(**self.create_args(budget, input=self.FIRST_INPUT))
            tracker = ResponseTracker("ws cancel")
            ws_collect(conn, tracker, on_event=cancel_on_first_delta)
            final, raw = tracker.final, tracker.events[-1].raw
            assert final is not None and final.usage is not None
            if final.status != "cancelled":
                fail(f"after response.cancel the status is {final.status!r}, not 'cancelled' "
                     f"({final.usage.output_tokens} of {budget} tokens generated)", raw)
            if final.incomplete_details is not None:
                fail("a cancelled response must have incomplete_details null", raw)
            if final.usage.output_tokens >= budget:
                fail("the cancelled response ran to its full budget", raw)
            if final.output_text != tracker.text:
                fail("the cancelled response's output differs from its deltas", raw)
            after = ws_respond(conn, "ws create after cancel", **self.create_args(input=self.NEXT_INPUT))
        check_finished_normally(after, self.small)

    def ws_concurrent(self) -> None:
        """A second create while one streams gets error 409 concurrent_request; the first finishes."""
        budget = self.args.concurrent_max_tokens
        with self.client.responses.connect() as conn:
            # Both frames go out back to back, so the second reaches the
            # server while the first response is in flight.
            conn.response.create(**self.create_args(budget, input=self.FIRST_INPUT))
            conn.response.create(**self.create_args(input=self.NEXT_INPUT))
            tracker = ResponseTracker("ws in-flight response")
            errors = ws_collect(conn, tracker, allowed_errors=("concurrent_request",))
            if not errors:
                ev = ws_recv(conn)
                if ev.type != "error":
                    fail("the second response.create was not rejected while the first was in flight", ev.raw)
                errors.append(ev)
            for ev in errors:
                expect_ws_error(ev, "concurrent_request", 409)
            if len(errors) != 1:
                fail(f"{len(errors)} concurrent_request errors for one rejected create")
            check_finished_normally(tracker, budget)
            after = ws_respond(conn, "ws create after the rejection", **self.create_args(input=self.NEXT_INPUT))
        check_finished_normally(after, self.small)

    def ws_warmup(self) -> None:
        """generate:false: created then completed, empty output, input-only usage; then a continuation."""
        with self.client.responses.connect() as conn:
            warm = ws_respond(conn, "ws warm-up", **self.create_args(input=self.FIRST_INPUT, generate=False))
            raw = warm.events[-1].raw
            if [ev.type for ev in warm.events] != ["response.created", "response.completed"]:
                fail(f"warm-up events are {[ev.type for ev in warm.events]}, "
                     "expected response.created then response.completed", raw)
            final = warm.final
            assert final is not None and final.usage is not None
            if final.output != [] or final.usage.output_tokens != 0 or final.usage.input_tokens <= 0:
                fail("a warm-up must have empty output and usage counting input only", raw)
            cont = check_finished_normally(ws_respond(conn, "ws continuation of a warm-up", **self.create_args(
                input=self.NEXT_INPUT, previous_response_id=final.id)), self.small)
            reference = self.ws_reference(conn, "ws explicit conversation", self.history(
                ("user", self.FIRST_INPUT), ("user", self.NEXT_INPUT)))
        self.same_generation(cont, reference, "ws continuation of a warm-up")

    def ws_unknown_event(self) -> None:
        """response.steer (sent by the SDK) and an invented type get unknown_event_type 400; the socket stays."""
        with self.client.responses.connect() as conn:
            first = check_finished_normally(
                ws_respond(conn, "ws first", **self.create_args(input=self.FIRST_INPUT)), self.small)
            conn.response.steer(input="Make it short.", previous_response_id=first.id)
            expect_ws_error(ws_recv(conn), "unknown_event_type", 400)
            conn.send_raw(json.dumps({"type": "response.bogus"}))
            expect_ws_error(ws_recv(conn), "unknown_event_type", 400)
            # The cache is untouched by the rejected events.
            cont = ws_respond(conn, "ws continuation after unknown events", **self.create_args(
                input=self.NEXT_INPUT, previous_response_id=first.id))
        check_finished_normally(cont, self.small)

    # -- HTTP checks ---------------------------------------------------------

    def http_create_json(self) -> None:
        """create() without streaming returns a strictly valid, completed Response."""
        budget = self.args.complete_max_tokens
        response = self.client.responses.create(**self.create_args(budget, input=self.args.complete_prompt))
        exchange = self.recorder.last("POST")
        raw = exchange.text()
        wire = validate_strict(Response, raw, "HTTP create body")
        if response.id != wire.id or response.output_text != wire.output_text:
            fail("the SDK's Response differs from the body on the wire", raw)
        check_static_response(wire, raw)
        if wire.status != "completed":
            fail(f"expected status completed, got {wire.status!r} (try another --complete-prompt)", raw)

    def http_output_text_logprobs(self) -> None:
        """include=["message.output_text.logprobs"], top_logprobs: every output token's entry, strictly
        typed, in the message's text part and in the stream's text deltas."""
        args = self.create_args(self.small, input=self.FIRST_INPUT)
        response = self.client.responses.create(
            **args, include=["message.output_text.logprobs"], top_logprobs=2)
        raw = self.recorder.last("POST").text()
        wire = validate_strict(Response, raw, "HTTP create body")
        part = wire.output[0].content[0]
        logprobs = part.logprobs or []
        if not logprobs or "".join(lp.token for lp in logprobs) != part.text:
            fail("the logprobs' tokens do not spell the text", raw)
        if any(len(lp.top_logprobs) != 2 or lp.logprob > 0 for lp in logprobs):
            fail("each entry has 2 alternatives and a logprob of at most 0", raw)
        if wire.top_logprobs != 2 or response.output_text != part.text:
            fail("top_logprobs is not echoed", raw)
        stream = self.client.responses.create(
            **args, include=["message.output_text.logprobs"], top_logprobs=2, stream=True)
        streamed = [lp for event in stream if event.type == "response.output_text.delta"
                    for lp in event.logprobs]
        sse_track(self.recorder.last("POST"), "HTTP stream with logprobs")
        if [(lp.token, lp.logprob) for lp in streamed] != [(lp.token, lp.logprob) for lp in logprobs]:
            fail("the streamed deltas' logprobs differ from the JSON response's")

    def http_create_stream(self) -> None:
        """create(stream=True) yields valid SSE events (with event: lines) ending in a terminal event."""
        stream = self.client.responses.create(**self.create_args(input=self.FIRST_INPUT), stream=True)
        sdk_types = [event.type for event in stream]
        tracker = sse_track(self.recorder.last("POST"), "HTTP stream")
        check_finished_normally(tracker, self.small)
        if sdk_types != [ev.type for ev in tracker.events]:
            fail(f"the SDK yielded {sdk_types}, the wire carried {[ev.type for ev in tracker.events]}")

    def http_stream_helper(self) -> None:
        """client.responses.stream(): events, then get_final_response() (needs response.completed)."""
        budget = self.args.complete_max_tokens
        with self.client.responses.stream(**self.create_args(budget, input=self.args.complete_prompt)) as stream:
            sdk_types = [event.type for event in stream]
            final = stream.get_final_response()
        tracker = sse_track(self.recorder.last("POST"), "HTTP stream()")
        check_completed(tracker, budget)
        if final.id != tracker.response_id or final.output_text != tracker.text or final.status != "completed":
            fail("get_final_response() differs from the streamed response")
        if sdk_types != [ev.type for ev in tracker.events]:
            fail(f"stream() yielded {sdk_types}, the wire carried {[ev.type for ev in tracker.events]}")

    def http_parse_with_pydantic(self) -> None:
        """responses.parse(text_format=Model): the output follows the model's schema, and
        the Response echoes the format."""
        parsed = self.client.responses.parse(model=self.model, input=self.FIRST_INPUT,
                                             temperature=1, max_output_tokens=120,
                                             text_format=Hero)
        raw = self.recorder.last("POST").text()
        wire = validate_strict(Response, raw, "HTTP parse body")
        if wire.status != "completed":
            fail(f"status {wire.status!r}", raw)
        if not isinstance(parsed.output_parsed, Hero):
            fail(f"output_parsed is {parsed.output_parsed!r}", raw)
        fmt = wire.text.format if wire.text else None
        if fmt is None or fmt.type != "json_schema" or fmt.name != "Hero":
            fail(f"text.format echoed as {fmt!r}", raw)

    def http_tool_call_and_its_output(self) -> None:
        """A forced function call streams as a function_call item; its output, sent back as a
        function_call_output item with the call echoed, continues the conversation."""
        tool = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
                "parameters": {"type": "object", "additionalProperties": False, "required": ["city"],
                               "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 10}}}}
        ask = [{"role": "user", "content": "Weather in Paris?"}]
        stream = self.client.responses.create(model=self.model, input=ask, tools=[tool],
                                              tool_choice="required", parallel_tool_calls=False,
                                              temperature=1, max_output_tokens=90, stream=True)
        for _ in stream:
            pass
        tracker = sse_track(self.recorder.last("POST"), "HTTP tool call")
        final = tracker.final
        calls = [o for o in final.output if o.type == "function_call"]
        if final.status != "completed" or len(calls) != 1 or calls[0].name != "get_weather":
            fail(f"expected one completed get_weather call, got {final.output!r}")
        if not isinstance(json.loads(calls[0].arguments).get("city"), str):
            fail(f"arguments {calls[0].arguments!r}")
        if final.tool_choice != "required" or [t.name for t in final.tools] != ["get_weather"]:
            fail(f"tools echoed as {final.tools!r}, tool_choice {final.tool_choice!r}")
        nxt = self.client.responses.create(
            model=self.model, tools=[tool], temperature=0, max_output_tokens=8,
            input=ask + [{"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                          "arguments": calls[0].arguments},
                         {"type": "function_call_output", "call_id": calls[0].call_id,
                          "output": "Sunny."}])
        wire = validate_strict(Response, self.recorder.last("POST").text(), "HTTP create body")
        if nxt.id != wire.id or wire.usage.input_tokens <= final.usage.input_tokens:
            fail("the call and its output did not reach the next prompt", self.recorder.last("POST").text())

    def http_continuation_and_retrieve(self) -> None:
        """A stored response continues by previous_response_id and is returned by retrieve(id)."""
        first = self.client.responses.create(**self.create_args(input=self.FIRST_INPUT))
        first_wire = validate_strict(Response, self.recorder.last("POST").text(), "HTTP create body")
        got = self.client.responses.retrieve(first.id)
        raw = self.recorder.last("GET").text()
        retrieved = validate_strict(Response, raw, "HTTP retrieve body")
        if (got.id, got.output_text) != (first.id, first.output_text) or retrieved.id != first_wire.id:
            fail(f"retrieve({first.id}) returned {got.id} {got.output_text!r}, "
                 f"create returned {first.output_text!r}", raw)
        second = self.client.responses.create(**self.create_args(
            input=self.NEXT_INPUT, previous_response_id=first.id))
        raw = self.recorder.last("POST").text()
        validate_strict(Response, raw, "HTTP continuation body")
        if second.previous_response_id != first.id or second.status not in ("completed", "incomplete"):
            fail("the HTTP continuation did not finish or did not echo previous_response_id", raw)
        reference = self.client.responses.create(**self.create_args(store=False, input=self.history(
            ("user", self.FIRST_INPUT), ("assistant", first.output_text), ("user", self.NEXT_INPUT))))
        self.same_generation(second, reference, "HTTP continuation")

    def http_unknown_previous(self) -> None:
        """An unknown previous_response_id over HTTP raises openai.NotFoundError (404)."""
        try:
            self.client.responses.create(**self.create_args(
                input=self.NEXT_INPUT, previous_response_id="resp_00000000-0000-7000-8000-000000000000"))
        except openai.NotFoundError as err:
            raw = self.recorder.last("POST").text()
            if err.status_code != 404 or err.code != "previous_response_not_found":
                fail(f"NotFoundError with code {err.code!r}", raw)
            if err.type != "invalid_request_error" or not isinstance(err.body, dict) or not err.body.get("message"):
                fail("the error object lacks type invalid_request_error or a message", raw)
            return
        fail("the create succeeded")

    # -- optional checks -----------------------------------------------------

    def ws_connection_limit(self) -> None:
        """N connections are served; the next gets websocket_connection_limit_reached and close 1013."""
        managers = [self.client.responses.connect() for _ in range(self.args.max_connections)]
        conns = []
        try:
            for index, manager in enumerate(managers):
                conn = manager.enter()
                conns.append(conn)
                ws_respond(conn, f"ws warm-up on connection {index + 1}",
                           **self.create_args(input=self.FIRST_INPUT, generate=False))
            # No on_reconnecting handler: the SDK must not try to reconnect after 1013.
            with self.client.responses.connect() as extra:
                try:
                    # Were this connection served, its reply would be
                    # response.created, failing at once instead of waiting.
                    extra.response.create(**self.create_args(input=self.FIRST_INPUT, generate=False))
                except ConnectionClosed:
                    pass  # the server already closed it; its error frame is still to be read
                ev = ws_recv(extra)
                if ev.type != "error":
                    fail(f"connection {len(conns) + 1} was served beyond the limit", ev.raw)
                expect_ws_error(ev, "websocket_connection_limit_reached", None)
                expect_close(extra, 1013)
        finally:
            for conn in conns:
                conn.close()

    def ws_lifetime(self) -> None:
        """A connection is warned connection_expiring, still works, then is closed with 1000."""
        start = time.monotonic()
        with self.client.responses.connect() as conn:
            ev = ws_recv(conn)
            warned = time.monotonic() - start
            expect_ws_error(ev, "connection_expiring", None)
            if not 0.5 * self.args.expiring_after <= warned < self.args.close_after:
                fail(f"connection_expiring came after {warned:.2f} s", ev.raw)
            ws_respond(conn, "ws warm-up after the warning",
                       **self.create_args(input=self.FIRST_INPUT, generate=False))
            expect_close(conn, 1000)
            closed = time.monotonic() - start
        if closed < 0.5 * self.args.close_after:
            fail(f"closed after {closed:.2f} s, expected about {self.args.close_after:g} s")

    # -- running -------------------------------------------------------------

    def selected(self) -> List[Tuple[str, Callable[[], None]]]:
        """The checks to run, in order, for the given flags."""
        if self.args.lifetime_check:
            return [("ws lifetime: connection_expiring then close 1000", self.ws_lifetime)]
        checks = [
            ("ws create streams deltas to response.completed", self.ws_create_completed),
            ("ws create with a small budget, stream_id echoed", self.ws_create_budget),
            ("ws continuation by previous_response_id", self.ws_continuation),
            ("ws unknown previous_response_id -> 404, socket stays", self.ws_unknown_previous),
            ("ws response.cancel -> status cancelled", self.ws_cancel),
            ("ws concurrent create -> 409, in-flight one finishes", self.ws_concurrent),
            ("ws generate:false warm-up and its continuation", self.ws_warmup),
            ("ws response.steer and unknown types -> 400, socket stays", self.ws_unknown_event),
            ("http create (JSON) completed", self.http_create_json),
            ("http create(stream=True) SSE events", self.http_create_stream),
            ("http output text logprobs (include, top_logprobs)", self.http_output_text_logprobs),
            ("http responses.stream() and get_final_response()", self.http_stream_helper),
            ("http responses.parse(text_format=pydantic model)", self.http_parse_with_pydantic),
            ("http forced function call and function_call_output", self.http_tool_call_and_its_output),
            ("http continuation and retrieve(id)", self.http_continuation_and_retrieve),
            ("http unknown previous_response_id -> NotFoundError", self.http_unknown_previous),
        ]
        if self.args.max_connections is not None:
            checks.append((f"ws connection limit {self.args.max_connections} -> 1013",
                           self.ws_connection_limit))
        return checks

    def run(self) -> int:
        """Runs the selected checks, one line each; returns the process exit status."""
        failures = 0
        for name, check in self.selected():
            limit = self.args.timeout
            if check == self.ws_lifetime:
                limit = min(limit, self.args.close_after + 10)
            with Watchdog(limit, name):
                try:
                    check()
                except CheckFailed as err:
                    failures += 1
                    print(f"FAIL: {name}: {err}", flush=True)
                    continue
                except Exception:  # an SDK exception is a failure too, with its traceback
                    failures += 1
                    print(f"FAIL: {name}: unexpected exception\n{traceback.format_exc()}", flush=True)
                    continue
            print(f"ok: {name}", flush=True)
        if failures:
            print(f"{failures} check(s) failed", flush=True)
            return 1
        return 0


def expect_close(conn: Any, code: int) -> None:
    """Requires the server to close the SDK connection with this code, with no further event."""
    try:
        ev = ws_recv(conn)
    except ConnectionClosed as closed:
        got = closed.rcvd.code if closed.rcvd is not None else None
        if got != code:
            fail(f"the connection closed with {got}, expected {code}")
        return
    fail(f"expected close {code}, got an event", ev.raw)


def check_static_response(response: Response, raw: str) -> None:
    """The fixed fields every tokenwire Response carries."""
    if not response.id.startswith("resp_") or response.object != "response":
        fail("bad Response id or object", raw)
    if response.parallel_tool_calls is not False or response.tool_choice != "auto" or response.tools != []:
        fail("parallel_tool_calls false, tool_choice auto and tools [] are expected", raw)
    for item in response.output:
        if item.type != "message" or not item.id.startswith("msg_"):
            fail("output items must be msg_ messages", raw)
    check_usage(response, "Response", raw)


# ---------------------------------------------------------------------------
# HTTP: recording what went over the wire
# ---------------------------------------------------------------------------


@dataclass
class Exchange:
    """One HTTP request and the response body as it came off the wire."""

    method: str
    url: str
    status: int
    headers: httpx2.Headers
    body: bytearray = field(default_factory=bytearray)

    def text(self) -> str:
        """The body, decompressed if the server used a content-encoding."""
        data = bytes(self.body)
        encoding = self.headers.get("content-encoding", "identity").lower()
        if encoding in ("gzip", "deflate"):
            data = zlib.decompress(data, 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
        elif encoding != "identity":
            fail(f"unexpected content-encoding {encoding}")
        return data.decode("utf-8")


class _TeeStream(httpx2.SyncByteStream):
    """Passes a response body through while keeping a copy."""

    def __init__(self, inner: httpx2.SyncByteStream, sink: bytearray) -> None:
        self._inner = inner
        self._sink = sink

    def __iter__(self):  # type: ignore[override]
        for chunk in self._inner:
            self._sink += chunk
            yield chunk

    def close(self) -> None:
        self._inner.close()


class RecordingTransport(httpx2.BaseTransport):
    """The SDK's HTTP transport, keeping each response body for strict validation."""

    def __init__(self) -> None:
        self._inner = httpx2.HTTPTransport()
        self.exchanges: List[Exchange] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = self._inner.handle_request(request)
        exchange = Exchange(request.method, str(request.url), response.status_code, response.headers)
        self.exchanges.append(exchange)
        response.stream = _TeeStream(response.stream, exchange.body)  # type: ignore[arg-type]
        return response

    def close(self) -> None:
        self._inner.close()

    def last(self, method: str) -> Exchange:
        """The most recent exchange with this method."""
        for exchange in reversed(self.exchanges):
            if exchange.method == method:
                return exchange
        raise CheckFailed(f"no {method} request was made")


def sse_track(exchange: Exchange, where: str) -> ResponseTracker:
    """Parses an SSE body, validates each event strictly and follows the response."""
    content_type = exchange.headers.get("content-type", "")
    if not content_type.startswith("text/event-stream"):
        fail(f"{where}: content-type is {content_type!r}, not text/event-stream")
    tracker = ResponseTracker(where)
    text = exchange.text().replace("\r\n", "\n").replace("\r", "\n")
    for block in text.split("\n\n"):
        event_name, data = None, []
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event_name = value
            elif name == "data":
                data.append(value)
        if not data:
            continue
        raw = "\n".join(data)
        if raw == "[DONE]":
            fail(f"{where}: the Responses API does not end with [DONE]", raw)
        ev = Received(raw, validate_event(SSE_EVENT_TYPES, raw, "SSE event"))
        if event_name != ev.type:
            fail(f"{where}: the SSE event line says {event_name!r}, the data says {ev.type!r}", raw)
        tracker.feed(ev)
    if not tracker.finished:
        fail(f"{where}: the stream ended without a terminal event")
    return tracker


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


class Watchdog:
    """Ends the process with a FAIL line if a check does not finish in time (a wait hung)."""

    def __init__(self, seconds: float, name: str) -> None:
        self._timer = threading.Timer(seconds, self._expire, args=(seconds, name))
        self._timer.daemon = True

    @staticmethod
    def _expire(seconds: float, name: str) -> None:
        print(f"FAIL: {name}: no result within {seconds:g} s (waiting for an event that never came)",
              flush=True)
        os._exit(1)

    def __enter__(self) -> "Watchdog":
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Check tokenwire's `responses` dialect (WebSocket mode and HTTP) with the official OpenAI SDK.")
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8080/v1")
    parser.add_argument("--model", required=True, help="the served model's name, e.g. stories260K")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "sk-tokenwire-test"),
                        help="sent as the bearer token (default: $OPENAI_API_KEY or a dummy)")
    parser.add_argument("--max-tokens", type=int, default=16,
                        help="max_output_tokens of the ordinary checks (default 16)")
    parser.add_argument("--complete-prompt", default="Lily was happy.",
                        help="a prompt the model finishes (EOS) by itself, for the checks that need "
                             "response.completed (default: %(default)r, which stories260K ends after ~290 tokens)")
    parser.add_argument("--complete-max-tokens", type=int, default=400,
                        help="max_output_tokens for --complete-prompt (default 400)")
    parser.add_argument("--cancel-max-tokens", type=int, default=400,
                        help="max_output_tokens of the response that gets cancelled (default 400)")
    parser.add_argument("--concurrent-max-tokens", type=int, default=64,
                        help="max_output_tokens of the in-flight response in the concurrency check (default 64)")
    parser.add_argument("--max-connections", type=int, metavar="N",
                        help="also check the connection limit (server started with --max-websocket-connections N)")
    parser.add_argument("--lifetime-check", action="store_true",
                        help="only check the connection lifetime (server started with short lifetimes)")
    parser.add_argument("--expiring-after", type=float, default=1.0,
                        help="seconds until connection_expiring, as the server was started (default 1)")
    parser.add_argument("--close-after", type=float, default=2.0,
                        help="seconds until the close with 1000, as the server was started (default 2)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds each check may take before it fails (default 60)")
    return parser.parse_args(argv)


def main(argv: Optional[List[str]] = None) -> int:
    return Checks(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
