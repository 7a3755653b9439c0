"""A framework's model calls as a timeline: turns, requests, tool calls and compactions
made from its call records (``contextfold.calls/``), whichever framework recorded them.

A turn starts at a request whose newly sent messages (sent by no earlier request, nor
given as the answer to one) include a user message; a summary a compaction sends in the
place of older messages is none. Each request's size is its body rebuilt from the
records (:func:`~contextfold.context.call_records.call_body`), its verify status that
body's SHA-256 against the recorded one, and its prefix the bytes it shares with the
previous request's body. An answer gives its request the usage, text and tool calls; a
tool call's result is the message a later request sends answering the call's id. A
compaction is an item of the turn of the request after it, with its summary. Times are
journal times: a request is sent when it is recorded, answered when its answer is.
"""

from __future__ import annotations

from dataclasses import replace

from ..canonical import sha256_hex
from ..context.call_records import CALL_TYPES, Calls, call_body
from ..context.calls import CallAnswered, CallCompacted, CallRequested, Readable
from ..errors import InvalidInputError
from ..events import Event
from ..telemetry import shared_prefix
from ..views.tokens import approx_tokens
from .traces import (
    FrameworkContext,
    LaneTokens,
    RequestTrace,
    ToolTrace,
    TraceItem,
    TurnTrace,
    preview,
)

__all__ = ["RECORD_TYPES", "CallTimeline", "first_position"]

RECORD_TYPES = frozenset(cls.event_type for cls in CALL_TYPES)
"""The event types :class:`CallTimeline` takes."""


def first_position(turn: TurnTrace) -> int:
    """Where a turn starts in its stream: its first item or request."""
    return min([i.position for i in turn.items] + [r.offset for r in turn.requests])


class CallTimeline:
    """The turns of a stream's call records, added in order (see the module docstring).
    Holds the records (a request's body is rebuilt from them), the previous request's body
    and the small records of each request."""

    def __init__(self) -> None:
        self.calls = Calls()
        self._sent: set[str] = set()  # digests an earlier request sent or an answer gave
        self._previous: tuple[int, bytes] | None = None
        self._requests: dict[int, RequestTrace] = {}
        self._tools: dict[str, tuple[int, int]] = {}  # call id -> (request, index)
        self._turns: list[tuple[list[TraceItem], list[int]]] = []
        self._pending: list[TraceItem] = []  # compactions waiting for their request
        self._latest: int | None = None

    def add(self, position: int, time: str, event: Event) -> None:
        """Take the next record of the stream (other events are ignored)."""
        if type(event) not in CALL_TYPES:
            return
        self.calls.add(position, time, event)
        if isinstance(event, CallRequested):
            self._request(position, time, self.calls.requests[position])  # made whole
        elif isinstance(event, CallAnswered):
            self._answer(position, time, event)
        elif isinstance(event, CallCompacted):
            self._compacted(position, time, event)

    def _message(self, digest: str) -> tuple[int, str, Readable] | None:
        """Where message ``digest`` is recorded, when, and its readable form."""
        found = self.calls.messages.get(digest)
        if found is None:
            return None
        position, recorded = found
        return position, self.calls.times[position], recorded.readable

    def _request(self, position: int, time: str, sent: CallRequested) -> None:
        summary = sent.view.summary if sent.view is not None else None
        fresh = [d for d in dict.fromkeys(sent.messages) if d not in self._sent and d != summary]
        self._sent.update(sent.messages)
        trace = RequestTrace(
            offset=position,
            requested_at=time,
            sent_at=time,
            sends=1,
            model=sent.model,
            framework=sent.framework,
            recorded_sha256=(sent.sha256,),
        )
        try:
            body = call_body(self.calls, position)
        except InvalidInputError as exc:
            trace = replace(trace, rebuild_error=str(exc))
        else:
            previous = self._previous
            trace = replace(
                trace,
                rebuilt_sha256=sha256_hex(body),
                size=len(body),
                previous_offset=previous[0] if previous else None,
                prefix_bytes=shared_prefix(previous[1], body) if previous else None,
            )
            self._previous = (position, body)
        items: list[TraceItem] = []
        for digest in fresh:
            found = self._message(digest)
            if found is None:
                continue
            at, when, message = found
            if message.role == "tool" or message.answered():
                self._result(message, at, when)
            elif message.role == "assistant":
                self._made(message)
            else:
                items.append(
                    TraceItem(
                        kind="trigger" if message.role == "user" else "context",
                        position=at,
                        time=when,
                        role=message.role,
                        actor=message.actor,
                        text=preview(message.text),
                        chars=len(message.text),
                    )
                )
        if not self._turns or any(item.kind == "trigger" for item in items):
            self._turns.append(([], []))
        listed, offsets = self._turns[-1]
        listed += [*self._pending, *items]
        self._pending.clear()
        offsets.append(position)
        self._requests[position] = trace
        self._latest = position

    def _answer(self, position: int, time: str, answered: CallAnswered) -> None:
        self._sent.add(answered.message)
        request = self._requests.get(answered.request)
        if request is None:
            return
        found = self._message(answered.message)
        message = found[2] if found is not None else Readable(role="assistant")
        calls = tuple(
            ToolTrace(call_id=c.id, name=c.name, arguments=c.arguments, started_at=time)
            for c in message.tool_calls
        )
        for index, call in enumerate(calls):
            self._tools[call.call_id] = (answered.request, index)
        self._requests[answered.request] = replace(
            request,
            answered_at=time,
            response_position=position,
            response_model=answered.model,
            usage=answered.usage,
            finish_reason=answered.finish_reason,
            text=preview(message.text),
            text_chars=len(message.text),
            tool_calls=calls,
        )

    def _made(self, message: Readable) -> None:
        """Tool calls of an assistant message no recorded answer gave: the latest request's
        (an integration that records no answers still shows its calls)."""
        if self._latest is None:
            return
        request = self._requests[self._latest]
        calls = list(request.tool_calls)
        for call in message.tool_calls:
            if call.id not in self._tools:
                self._tools[call.id] = (self._latest, len(calls))
                calls.append(ToolTrace(call_id=call.id, name=call.name, arguments=call.arguments))
        self._requests[self._latest] = replace(request, tool_calls=tuple(calls))

    def _result(self, message: Readable, position: int, time: str) -> None:
        """A message answering tool calls (one holding several results answers each with
        its whole text)."""
        for call_id in message.answered():
            where = self._tools.get(call_id)
            if where is None:
                continue
            offset, index = where
            request = self._requests[offset]
            calls = list(request.tool_calls)
            calls[index] = replace(
                calls[index],
                finished_at=time,
                result_position=position,
                output=preview(message.text),
                output_chars=len(message.text),
            )
            self._requests[offset] = replace(request, tool_calls=tuple(calls))

    def _compacted(self, position: int, time: str, done: CallCompacted) -> None:
        model = done.model
        if model is None and self._latest is not None:
            model = self._requests[self._latest].model
        item = TraceItem(
            kind="compaction",
            position=position,
            time=time,
            role="user",
            text=preview(done.summary),
            chars=len(done.summary),
            summarized=len(done.summarized),
            usage=done.usage,
            model=model,
        )
        self._pending.append(item)

    def turns(self) -> list[TurnTrace]:
        """The turns so far (indexed from 0); a compaction no request followed yet is in
        the latest turn."""
        found = [
            TurnTrace(
                index=n,
                items=tuple(items),
                requests=tuple(self._requests[o] for o in offsets),
            )
            for n, (items, offsets) in enumerate(self._turns)
        ]
        if self._pending and found:
            found[-1] = replace(found[-1], items=(*found[-1].items, *self._pending))
        elif self._pending:
            found.append(TurnTrace(index=0, items=tuple(self._pending), requests=()))
        return found

    def context(self) -> FrameworkContext | None:
        """What the newest request held (None before any): its model, and its system
        messages, summary, other messages and options as lanes of approximate tokens."""
        if self._latest is None:
            return None
        sent = self.calls.requests[self._latest]
        summary = sent.view.summary if sent.view is not None else None
        lanes: dict[str, list[int]] = {"system": [], "summary": [], "history": []}
        for digest in sent.messages:
            found = self.calls.messages.get(digest)
            if found is None:
                continue
            recorded = found[1]
            lane = "history"
            if digest == summary:
                lane = "summary"
            elif recorded.readable.role in ("system", "developer"):
                lane = "system"
            lanes[lane].append(approx_tokens(recorded.message))
        options = approx_tokens(sent.options) if sent.options else 0
        return FrameworkContext(
            frameworks=tuple(sorted({r.framework for r in self.calls.requests.values()})),
            model=sent.model,
            lanes=(
                *(LaneTokens(name, len(counts), sum(counts)) for name, counts in lanes.items()),
                LaneTokens("request options", len(sent.options), options),
            ),
        )
