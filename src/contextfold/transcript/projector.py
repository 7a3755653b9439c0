"""Projection of boundary events into rows: the one place a stream event becomes a row.

:func:`project` is pure: a boundary event and the row it updates give the new row. The
writer uses it live; :func:`rebuild` uses it to fold a journal's transcript events back
into the store, so rows can always be rebuilt from the journal. Projecting an event
twice writes the same row twice, and an upsert overwrites, so replays are harmless.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypeVar

from pydantic import ValidationError

from ..errors import ContextfoldError, InvalidInputError
from ..events import StoredEvent
from .parts import (
    CompactionPart,
    Message,
    Part,
    PatchPart,
    ReasoningPart,
    StepFinishPart,
    StepStartPart,
    TextPart,
    ToolPart,
)
from .stream import (
    BOUNDARY_EVENTS,
    CompactionRequested,
    MessageFinished,
    MessageStarted,
    PartAdded,
    PatchRecorded,
    ReasoningEnd,
    ReasoningStart,
    StepFinished,
    StepStarted,
    StreamEvent,
    TextEnd,
    TextStart,
    ToolStateChanged,
)

if TYPE_CHECKING:
    from ..journal import Journal
    from .store.base import TranscriptStore

__all__ = ["BOUNDARY_TYPES", "LEGACY_FINISH_SUFFIX", "project", "rebuild", "target_id"]

log = logging.getLogger("contextfold.transcript")

BOUNDARY_TYPES: tuple[str, ...] = tuple(cls.event_type for cls in BOUNDARY_EVENTS)
"""Journal type names of the events :func:`rebuild` folds."""

LEGACY_FINISH_SUFFIX = "/finish"
"""What :func:`rebuild` appends to the id of a step-finish that shares its step-start's id
(journals written before the two were separate rows), so both rows are rebuilt."""

_BATCH = 500
_RANK = {"pending": 0, "running": 1, "completed": 2, "error": 2}
_FINAL = ("completed", "error")

R = TypeVar("R", Message, TextPart, ReasoningPart)
B = TypeVar("B", TextPart, ReasoningPart)


def target_id(event: StreamEvent) -> tuple[str, str]:
    """``("message", id)`` or ``("part", id)``: the row an event writes."""
    if isinstance(event, (MessageStarted, MessageFinished)):
        return ("message", event.message_id)
    if isinstance(event, PartAdded):
        return ("part", event.part.id)
    part_id: str = getattr(event, "part_id", "")
    if not part_id:
        raise InvalidInputError(f"{event.event_type} writes no row (it is a delta)")
    return ("part", part_id)


def project(event: StreamEvent, previous: Message | Part | None) -> Message | Part:
    """The row ``event`` writes, given the current row it names (None when there is none).

    Tool parts move only forward, pending → running → completed | error, and completed and
    error are final: the same transition replayed returns the row unchanged.

    Raises InvalidInputError for a delta, for an end or finish whose row was never
    started, for an event naming a row of another kind (a step-finish needs a part id of
    its own, apart from its step-start), and for a tool transition back or after a final
    state (the row keeps its state and output).
    """
    ids = {"session": event.session, "message_id": event.message_id}
    if isinstance(event, MessageStarted):
        return Message(
            id=event.message_id,
            session=event.session,
            role=event.role,
            created=event.time,
            parent_id=event.parent_id,
            model=event.model,
            summary=event.summary,
        )
    if isinstance(event, MessageFinished):
        message = _expect(previous, Message, event, "message-started")
        return message.model_copy(
            update={"completed": event.time, "finish": event.finish, "error": event.error}
        )
    if isinstance(event, TextStart):
        return TextPart(id=event.part_id, **ids, synthetic=event.synthetic, start=event.time)
    if isinstance(event, ReasoningStart):
        return ReasoningPart(id=event.part_id, **ids, start=event.time)
    if isinstance(event, TextEnd):
        text_part = _expect(previous, TextPart, event, "text-start")
        return _ended(text_part, event.text, event.time)
    if isinstance(event, ReasoningEnd):
        reasoning = _expect(previous, ReasoningPart, event, "reasoning-start")
        return _ended(reasoning, event.text, event.time)
    if isinstance(event, ToolStateChanged):
        before = previous if isinstance(previous, ToolPart) else None
        if previous is not None and before is None:
            raise _wrong_kind(event, previous)
        moved = _moved_tool(event, before)
        if before is not None and before.state in _FINAL:
            if moved == before:
                return before  # the same transition replayed: nothing changes
            raise InvalidInputError(
                f"tool-state: tool part {event.part_id!r} of session {event.session!r} is "
                f"already {before.state}; the late move to {event.state} is refused and the "
                "part keeps its state and output (completed and error are final)"
            )
        if before is not None and _RANK[event.state] < _RANK[before.state]:
            raise InvalidInputError(
                f"tool-state: tool part {event.part_id!r} of session {event.session!r} is "
                f"{before.state}; it cannot move back to {event.state} (tool parts move "
                "pending -> running -> completed | error)"
            )
        return moved
    if isinstance(event, StepStarted):
        if previous is not None and not isinstance(previous, StepStartPart):
            raise _wrong_kind(event, previous)
        return StepStartPart(id=event.part_id, **ids, time=event.time, snapshot=event.snapshot)
    if isinstance(event, StepFinished):
        if previous is not None and not isinstance(previous, StepFinishPart):
            raise _wrong_kind(event, previous)
        return StepFinishPart(
            id=event.part_id,
            **ids,
            time=event.time,
            reason=event.reason,
            usage=event.usage,
            cost=event.cost,
            snapshot=event.snapshot,
        )
    if isinstance(event, PatchRecorded):
        return PatchPart(id=event.part_id, **ids, hash=event.hash, files=event.files)
    if isinstance(event, CompactionRequested):
        return CompactionPart(
            id=event.part_id, **ids, auto=event.auto, tail_start_id=event.tail_start_id
        )
    if isinstance(event, PartAdded):
        part = event.part
        if (part.session, part.message_id) != (event.session, event.message_id):
            raise InvalidInputError(
                f"part-added: part {part.id!r} belongs to message {part.message_id!r} of session "
                f"{part.session!r}, but the event names message {event.message_id!r} of "
                f"session {event.session!r}"
            )
        return part
    raise InvalidInputError(
        f"{event.event_type or type(event).__name__} is not a boundary event and writes no row"
    )


def _moved_tool(event: ToolStateChanged, before: ToolPart | None) -> ToolPart:
    started = before.start if before is not None else None
    if started is None and event.state != "pending":
        started = event.time
    ids = {"session": event.session, "message_id": event.message_id}
    return ToolPart(
        id=event.part_id,
        **ids,
        call_id=event.call_id,
        tool=event.tool,
        state=event.state,
        # The arguments are sent once complete; later transitions may leave them out.
        input=event.input or (before.input if before is not None else {}),
        output=event.output,
        error=event.error,
        title=event.title or (before.title if before is not None else None),
        start=started,
        end=event.time if event.state in _FINAL else None,
    )


def _expect(previous: Message | Part | None, kind: type[R], event: StreamEvent, start: str) -> R:
    if previous is None:
        name = target_id(event)
        raise InvalidInputError(
            f"{event.event_type}: {name[0]} {name[1]!r} of session {event.session!r} was never "
            f"started; send {start} first"
        )
    if not isinstance(previous, kind):
        raise _wrong_kind(event, previous)
    return previous


def _ended(block: B, text: str | None, time: str) -> B:
    final = block.text if text is None else text
    return block.model_copy(update={"text": final.rstrip(), "end": time})


def _wrong_kind(event: StreamEvent, previous: Message | Part) -> InvalidInputError:
    what = "a message" if isinstance(previous, Message) else f"a {previous.kind} part"
    name = target_id(event)
    return InvalidInputError(
        f"{event.event_type}: {name[0]} {name[1]!r} of session {event.session!r} is {what}; "
        "ids of different rows must differ"
    )


async def rebuild(journal: Journal, stream: str, store: TranscriptStore) -> int:
    """Fold the transcript events of a journal stream into ``store``; returns rows written.

    Rows are written in the order they first appear, so the message order is the journal's.
    An event that no longer decodes or cannot apply is skipped and logged once, never fatal.
    A block the journal never ended stays unfinished: run cleanup afterwards if its writer
    is gone.
    """
    rows: dict[tuple[str, str, str], Message | Part] = {}
    cursor: str | None = None
    while True:
        page = await journal.read(stream, after=cursor, types=BOUNDARY_TYPES, limit=1000)
        for stored in page.events:
            event = _decode(stored)
            if event is None:
                continue
            kind, row_id = target_id(event)
            key = (event.session, kind, row_id)
            if isinstance(event, StepFinished) and isinstance(rows.get(key), StepStartPart):
                # Written when a step's start and finish shared one id: both rows are kept.
                event = event.model_copy(update={"part_id": row_id + LEGACY_FINISH_SUFFIX})
                key = (event.session, kind, event.part_id)
            try:
                rows[key] = project(event, rows.get(key))
            except (ContextfoldError, ValidationError) as exc:
                log.warning(
                    "transcript rebuild skipped %s at %s#%s: %s",
                    stored.type,
                    stream,
                    stored.position,
                    exc,
                )
        cursor = page.cursor
        if not page.more:
            break
    ordered = list(rows.values())
    for start in range(0, len(ordered), _BATCH):
        chunk = ordered[start : start + _BATCH]
        await store.write(
            messages=[r for r in chunk if isinstance(r, Message)],
            parts=[r for r in chunk if not isinstance(r, Message)],
        )
    return len(ordered)


def _decode(stored: StoredEvent) -> StreamEvent | None:
    try:
        event = stored.decode()
    except (ContextfoldError, ValidationError) as exc:
        log.warning(
            "transcript rebuild skipped an undecodable %s at %s#%s: %s",
            stored.type,
            stored.stream,
            stored.position,
            exc,
        )
        return None
    return event if isinstance(event, StreamEvent) else None
