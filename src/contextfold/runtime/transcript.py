"""The bridge from the agent loop to the transcript: an observer that turns what the loop
does into transcript stream events (rows at boundaries, deltas on the bus only)."""

from __future__ import annotations

from collections.abc import Callable
from typing import assert_never

from ..transcript.parts import INTERRUPTED
from ..transcript.stream import (
    CompactionRequested,
    MessageFinished,
    MessageStarted,
    StepFinished,
    StepStarted,
    TextDelta,
    TextEnd,
    TextStart,
    ToolStateChanged,
)
from ..transcript.writer import TranscriptWriter
from .events import (
    CompactionFinished,
    CompactionStarted,
    DeltaReceived,
    LoopCancelled,
    LoopEvent,
    LoopHalted,
    RequestFailed,
    RequestInterrupted,
    RequestRetried,
    RequestSent,
    ResponseRecorded,
    ToolFinished,
    ToolStarted,
)

__all__ = ["TranscriptObserver"]


class TranscriptObserver:
    """Writes one assistant message per model request: a step, its text (streamed as bus
    deltas, stored at the end) and its tool parts through pending, running and completed.
    An interrupted or failed request still closes its rows: the text keeps what its deltas
    confirmed, and the message finishes ``"interrupted"`` or ``"error"``.

    ``clock`` gives the ISO time of each boundary (inject a fixed one in tests).
    """

    def __init__(self, writer: TranscriptWriter, session: str, *, clock: Callable[[], str]) -> None:
        self.writer, self.session, self.clock = writer, session, clock
        self._open: dict[str, tuple[int, str]] = {}  # tool call id -> request offset, tool
        self._current: int | None = None  # the request whose text is streaming

    async def on_event(self, event: LoopEvent) -> None:
        match event:
            case RequestSent():
                await self._request(event)
            case DeltaReceived():
                await self._delta(event)
            case ResponseRecorded():
                await self._response(event)
            case ToolStarted():
                await self._tool_start(event)
            case ToolFinished():
                await self._tool_end(event)
            case RequestInterrupted():
                await self._close(event.offset, "interrupted", "interrupted")
            case RequestFailed():
                error = event.error
                await self._close(event.offset, "error", f"{type(error).__name__}: {error}")
            case LoopCancelled():
                await self._cancelled()
            case CompactionFinished():
                await self._compaction(event)
            case RequestRetried() | CompactionStarted() | LoopHalted():
                pass  # no row: a retry re-sends (its request event opens the rows)
            case _:
                assert_never(event)

    def _ids(self, offset: int) -> tuple[str, str, str]:
        return f"request-{offset}", f"step-{offset}", f"text-{offset}"

    def _tool_part(self, offset: int, call_id: str) -> str:
        # Per request: a provider may reuse a call id once compaction removed the first.
        return f"tool-{offset}-{call_id}"

    async def _request(self, event: RequestSent) -> None:
        message, step, text = self._ids(event.offset)
        now = self.clock()
        self._current = event.offset
        w, s = self.writer, self.session
        await w.publish(MessageStarted(session=s, message_id=message, role="assistant", time=now))
        await w.publish(StepStarted(session=s, message_id=message, part_id=step, time=now))
        await w.publish(TextStart(session=s, message_id=message, part_id=text, time=now))

    async def _delta(self, event: DeltaReceived) -> None:
        if event.channel == "text":
            message, _step, part = self._ids(event.offset)
            await self.writer.publish(
                TextDelta(session=self.session, message_id=message, part_id=part, delta=event.text)
            )

    async def _response(self, event: ResponseRecorded) -> None:
        offset, output = event.offset, event.output
        message, step, text = self._ids(offset)
        now, s, w = self.clock(), self.session, self.writer
        self._current = None
        await w.publish(
            TextEnd(session=s, message_id=message, part_id=text, time=now, text=output.text)
        )
        for call in output.tool_calls:
            self._open[call.id] = (offset, call.name)
            await w.publish(
                ToolStateChanged(
                    session=s,
                    message_id=message,
                    part_id=self._tool_part(offset, call.id),
                    call_id=call.id,
                    tool=call.name,
                    state="pending",
                    time=now,
                )
            )
        await w.publish(
            StepFinished(
                session=s,
                message_id=message,
                part_id=step,
                time=now,
                reason=output.finish_reason,
                usage=output.usage,
            )
        )
        if not output.tool_calls:
            await w.publish(
                MessageFinished(
                    session=s, message_id=message, time=now, finish=output.finish_reason
                )
            )

    async def _tool_start(self, event: ToolStarted) -> None:
        call = event.call
        offset, _tool = self._open.get(call.id, (None, None))
        if offset is not None:
            await self.writer.publish(
                ToolStateChanged(
                    session=self.session,
                    message_id=self._ids(offset)[0],
                    part_id=self._tool_part(offset, call.id),
                    call_id=call.id,
                    tool=call.name,
                    state="running",
                    time=self.clock(),
                )
            )

    async def _tool_end(self, event: ToolFinished) -> None:
        call, outcome = event.call, event.outcome
        offset, _tool = self._open.pop(call.id, (None, None))
        if offset is None:
            return
        message = self._ids(offset)[0]
        state = "error" if outcome.is_error else "completed"
        await self.writer.publish(
            ToolStateChanged(
                session=self.session,
                message_id=message,
                part_id=self._tool_part(offset, call.id),
                call_id=call.id,
                tool=call.name,
                state=state,
                time=self.clock(),
                output=None if outcome.is_error else outcome.output,
                error=outcome.output if outcome.is_error else None,
            )
        )
        if not any(o == offset for o, _ in self._open.values()):
            await self.writer.publish(
                MessageFinished(
                    session=self.session, message_id=message, time=self.clock(), finish="tool-calls"
                )
            )

    async def _close(self, offset: int, finish: str, error: str) -> None:
        """End the rows request @offset opened: the text with what its deltas confirmed (a
        text-end without text: the writer joins its buffer), the step, then the message."""
        if self._current != offset:
            return  # not streaming here (e.g. a request sealed without being sent)
        self._current = None
        message, step, text = self._ids(offset)
        now, s, w = self.clock(), self.session, self.writer
        await w.publish(TextEnd(session=s, message_id=message, part_id=text, time=now))
        await w.publish(
            StepFinished(session=s, message_id=message, part_id=step, time=now, reason=finish)
        )
        await w.publish(
            MessageFinished(session=s, message_id=message, time=now, finish=finish, error=error)
        )

    async def _cancelled(self) -> None:
        """The agent was cancelled (a shutdown), maybe between a response and its tool calls
        or during one: the tool calls still open fail "interrupted", and so do their messages
        (the results a restarted agent records later do not reopen them)."""
        open_calls, self._open = self._open, {}
        now, s, w = self.clock(), self.session, self.writer
        for call_id, (offset, tool) in open_calls.items():
            await w.publish(
                ToolStateChanged(
                    session=s,
                    message_id=self._ids(offset)[0],
                    part_id=self._tool_part(offset, call_id),
                    call_id=call_id,
                    tool=tool,
                    state="error",
                    time=now,
                    error=INTERRUPTED,
                )
            )
        for offset in dict.fromkeys(o for o, _ in open_calls.values()):
            await w.publish(
                MessageFinished(
                    session=s,
                    message_id=self._ids(offset)[0],
                    time=now,
                    finish=INTERRUPTED,
                    error=INTERRUPTED,
                )
            )

    async def _compaction(self, event: CompactionFinished) -> None:
        offset, summary = event.offset, event.summary
        # Seed 001's boundary: a user message carrying the compaction part, answered by an
        # assistant summary message whose parent it is.
        asked, answer = f"compaction-{offset}", f"summary-{offset}"
        now, s, w = self.clock(), self.session, self.writer
        await w.publish(MessageStarted(session=s, message_id=asked, role="user", time=now))
        await w.publish(
            CompactionRequested(
                session=s, message_id=asked, part_id=f"compaction-part-{offset}", auto=True
            )
        )
        await w.publish(MessageFinished(session=s, message_id=asked, time=now, finish="stop"))
        await w.publish(
            MessageStarted(
                session=s,
                message_id=answer,
                role="assistant",
                time=now,
                parent_id=asked,
                summary=True,
            )
        )
        await w.publish(
            TextStart(session=s, message_id=answer, part_id=f"summary-text-{offset}", time=now)
        )
        await w.publish(
            TextEnd(
                session=s,
                message_id=answer,
                part_id=f"summary-text-{offset}",
                time=now,
                text=summary,
            )
        )
        await w.publish(MessageFinished(session=s, message_id=answer, time=now, finish="stop"))
