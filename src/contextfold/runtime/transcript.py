"""The bridge from the agent loop to the transcript: an observer that turns what the loop
does into transcript stream events (rows at boundaries, deltas on the bus only)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, assert_never

import orjson

from ..context.projection import AgentContext
from ..context.state import ContextItem
from ..errors import InvalidInputError
from ..journal import Journal
from ..transcript.parts import INTERRUPTED, FilePart, TextPart
from ..transcript.stream import (
    CompactionRequested,
    MessageFinished,
    MessageStarted,
    PartAdded,
    StepFinished,
    StepStarted,
    TextDelta,
    TextEnd,
    TextStart,
    ToolStateChanged,
)
from ..transcript.writer import TranscriptWriter
from ..wire import ToolCall
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

log = logging.getLogger("contextfold.runtime")

_UNKNOWN_MIME = "application/octet-stream"


def _answers(item: ContextItem) -> bool:
    """Whether a history item is something a turn answers (a user message in the
    transcript): not the model's own answer, a tool result or a compaction summary."""
    return item.role != "assistant" and item.tool_call_id is None and item.compaction is None


def _from_a_person(item: ContextItem) -> bool:
    return item.role == "user" and (item.actor is None or item.actor.type == "user")


def _item_message(offset: int) -> str:
    return f"item-{offset}"


def _input(call: ToolCall) -> Mapping[str, Any]:
    """The call's arguments as the tool part's ``input``: the JSON object the model sent
    ("" is no arguments). Arguments that are no JSON object (the agent records no such
    call: it cannot run) leave it empty."""
    if not call.arguments.strip():
        return {}
    try:
        parsed = orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


class TranscriptObserver:
    """Writes one assistant message per model request, in stream order: its step-start, its
    text (streamed as bus deltas, stored at the end), its tool parts (pending, running,
    completed or error) and its step-finish, each its own row. An interrupted or failed
    request still closes its rows: the text keeps what its deltas confirmed, and the
    message finishes ``"interrupted"`` or ``"error"``. A tool transition the part can no
    longer make (it was closed meanwhile, e.g. by ``writer.interrupt``) is refused by the
    writer and logged; the part keeps what it holds.

    With ``journal`` (and the agent's ``stream``, by default the session's name), the
    context items each request answers are written first, one user message each (its
    text, its files), and the request's message names the newest message from a person
    (else the newest item) as its parent; the message also names the model it went to.
    A compaction is a user message with a compaction part retaining the measured answer
    (``tail_start_id``) and a summary message answering it, so ``filter_compacted`` shows
    what the model sees next: the summary, the measured answer and everything after the
    cutoff (an item that arrived while the measured request ran follows the answer, in the
    order things happened).

    ``clock`` gives the ISO time of each boundary (inject a fixed one in tests).
    """

    def __init__(
        self,
        writer: TranscriptWriter,
        session: str,
        *,
        clock: Callable[[], str],
        journal: Journal | None = None,
        stream: str | None = None,
    ) -> None:
        self.writer, self.session, self.clock = writer, session, clock
        self.journal = journal
        self.stream = session if stream is None else stream
        # tool call id -> request offset, tool, arguments
        self._open: dict[str, tuple[int, str, Mapping[str, Any]]] = {}
        self._current: int | None = None  # the request whose text is streaming
        self._through: int | None = None  # items below this offset are written
        self._parent: str | None = None  # the user message the latest request answered
        self._model: str | None = None  # the model of the latest request
        self._refused: set[int] = set()  # requests a tool transition of was refused

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

    def _ids(self, offset: int) -> tuple[str, str, str, str]:
        """The message, step-start, step-finish and text ids of request @offset."""
        return (
            f"request-{offset}",
            f"step-start-{offset}",
            f"step-finish-{offset}",
            f"text-{offset}",
        )

    def _tool_part(self, offset: int, call_id: str) -> str:
        # Per request: a provider may reuse a call id once compaction removed the first.
        return f"tool-{offset}-{call_id}"

    async def _request(self, event: RequestSent) -> None:
        parent = await self._answered(event.offset)
        message, step, _finish, text = self._ids(event.offset)
        now = self.clock()
        self._current = event.offset
        self._model = event.neutral.model
        w, s = self.writer, self.session
        await w.publish(
            MessageStarted(
                session=s,
                message_id=message,
                role="assistant",
                time=now,
                parent_id=parent,
                model=event.neutral.model,
            )
        )
        await w.publish(StepStarted(session=s, message_id=message, part_id=step, time=now))
        await w.publish(TextStart(session=s, message_id=message, part_id=text, time=now))

    async def _answered(self, offset: int) -> str | None:
        """Write the items request @offset answers that are not written yet (those after
        the previous request, or after the last one this observer saw); return the
        request's parent: the newest message from a person before it (else the newest
        item), or the previous request's when it is compacted away."""
        if self.journal is None:
            return self._parent
        context = await self.journal.fold(AgentContext, self.stream)
        since = self._through
        if since is None:
            since = max((o for o in context.request_offsets if o < offset), default=0)
        answered = [i for i in context.history if _answers(i) and i.offset < offset]
        for item in answered:
            if item.offset > since:
                await self._user_message(item)
        self._through = max(since, offset)
        # A person's message, when there is one: a webhook arriving while tools run does
        # not take the user's question's place.
        chosen = [i for i in answered if _from_a_person(i)] or answered
        if chosen:
            self._parent = _item_message(max(i.offset for i in chosen))
        return self._parent

    async def _user_message(self, item: ContextItem) -> None:
        message = _item_message(item.offset)
        s, w = self.session, self.writer
        if await w.store.get_message(s, message) is not None:
            return  # written for an earlier send of the same request
        now = self.clock()
        parts: list[TextPart | FilePart] = []
        if item.content:
            parts.append(
                TextPart(
                    id=f"{message}-text",
                    session=s,
                    message_id=message,
                    text=item.content,
                    synthetic=item.role != "user",
                )
            )
        parts.extend(
            FilePart(
                id=f"{message}-file-{n}",
                session=s,
                message_id=message,
                mime=file.media_type or _UNKNOWN_MIME,
                url=file.uri,
                filename=file.name,
            )
            for n, file in enumerate(item.files)
        )
        await w.publish(MessageStarted(session=s, message_id=message, role="user", time=now))
        for part in parts:
            await w.publish(PartAdded(session=s, message_id=message, part=part))
        await w.publish(MessageFinished(session=s, message_id=message, time=now))

    async def _tool_state(self, event: ToolStateChanged, offset: int) -> bool:
        """Publish a tool transition; False (logged) when the part can no longer make it."""
        try:
            await self.writer.publish(event)
        except InvalidInputError as exc:
            self._refused.add(offset)
            log.warning("transcript of %r: %s", self.session, exc)
            return False
        return True

    async def _delta(self, event: DeltaReceived) -> None:
        if event.channel == "text":
            message, _start, _finish, part = self._ids(event.offset)
            await self.writer.publish(
                TextDelta(session=self.session, message_id=message, part_id=part, delta=event.text)
            )

    async def _response(self, event: ResponseRecorded) -> None:
        offset, output = event.offset, event.output
        message, _start, step, text = self._ids(offset)
        now, s, w = self.clock(), self.session, self.writer
        self._current = None
        await w.publish(
            TextEnd(session=s, message_id=message, part_id=text, time=now, text=output.text)
        )
        for call in output.tool_calls:
            arguments = _input(call)
            self._open[call.id] = (offset, call.name, arguments)
            await self._tool_state(
                ToolStateChanged(
                    session=s,
                    message_id=message,
                    part_id=self._tool_part(offset, call.id),
                    call_id=call.id,
                    tool=call.name,
                    state="pending",
                    time=now,
                    input=arguments,
                ),
                offset,
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
        opened = self._open.get(call.id)
        if opened is not None:
            offset = opened[0]
            await self._tool_state(
                ToolStateChanged(
                    session=self.session,
                    message_id=self._ids(offset)[0],
                    part_id=self._tool_part(offset, call.id),
                    call_id=call.id,
                    tool=call.name,
                    state="running",
                    time=self.clock(),
                    input=opened[2],
                ),
                offset,
            )

    async def _tool_end(self, event: ToolFinished) -> None:
        call, outcome = event.call, event.outcome
        opened = self._open.pop(call.id, None)
        if opened is None:
            return
        offset = opened[0]
        message = self._ids(offset)[0]
        state = "error" if outcome.is_error else "completed"
        await self._tool_state(
            ToolStateChanged(
                session=self.session,
                message_id=message,
                part_id=self._tool_part(offset, call.id),
                call_id=call.id,
                tool=call.name,
                state=state,
                time=self.clock(),
                input=opened[2],
                output=None if outcome.is_error else outcome.output,
                error=outcome.output if outcome.is_error else None,
            ),
            offset,
        )
        if any(o[0] == offset for o in self._open.values()) or await self._closed(offset):
            return
        await self.writer.publish(
            MessageFinished(
                session=self.session, message_id=message, time=self.clock(), finish="tool-calls"
            )
        )

    async def _closed(self, offset: int) -> bool:
        """Whether a tool transition of request @offset was refused and its message was
        closed meanwhile too (with its parts): it then stays as it was closed."""
        if offset not in self._refused:
            return False
        self._refused.discard(offset)
        row = await self.writer.store.get_message(self.session, self._ids(offset)[0])
        return row is not None and row.completed is not None

    async def _close(self, offset: int, finish: str, error: str) -> None:
        """End the rows request @offset opened: the text with what its deltas confirmed (a
        text-end without text: the writer joins its buffer), the step, then the message."""
        if self._current != offset:
            return  # not streaming here (e.g. a request sealed without being sent)
        self._current = None
        message, _start, step, text = self._ids(offset)
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
        for call_id, (offset, tool, arguments) in open_calls.items():
            await self._tool_state(
                ToolStateChanged(
                    session=s,
                    message_id=self._ids(offset)[0],
                    part_id=self._tool_part(offset, call_id),
                    call_id=call_id,
                    tool=tool,
                    state="error",
                    time=now,
                    input=arguments,
                    error=INTERRUPTED,
                ),
                offset,
            )
        for offset in dict.fromkeys(o[0] for o in open_calls.values()):
            if await self._closed(offset):
                continue
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
                session=s,
                message_id=asked,
                part_id=f"compaction-part-{offset}",
                auto=True,
                # The measured answer (and all after it) stays in view behind the summary.
                tail_start_id=self._ids(offset)[0],
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
                model=self._model,
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
