"""The transcript writer: the one entry point the runtime streams a model's answer into.

It decides, per event (see :mod:`.stream`), what happens:

- a text or reasoning delta goes to the bus only, and into an in-memory buffer;
- a tool-input delta is dropped: neither written nor broadcast;
- a boundary becomes a row: the writer completes it (a text-end gets the text joined
  from the buffer, post-processed and trailing-trimmed), appends it to the journal when
  one is configured, upserts the row, then tells the bus the row changed.

The buffer is the only copy of a block's text until its end: if the process dies, the
text exists only on the bus, and :meth:`TranscriptStore.cleanup_unfinished` later
closes the block with what was stored. :meth:`TranscriptWriter.interrupt` is the orderly
version: it closes a session's open rows with the text the buffers confirm.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ..errors import InvalidInputError
from .bus import MessageUpdated, PartDelta, PartUpdated, TranscriptBus
from .parts import Message, Part, is_unfinished
from .projector import project, target_id
from .store.base import CleanupResult, TranscriptStore
from .stream import (
    DROPPED_EVENTS,
    MessageFinished,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningStart,
    StepFinished,
    StepStarted,
    StreamEvent,
    TextDelta,
    TextEnd,
    TextStart,
    ToolStateChanged,
)

if TYPE_CHECKING:
    from ..journal import Journal

__all__ = ["TranscriptWriter"]

# Events whose row depends on the current one (or must not replace another kind of row).
_UPDATES = (MessageFinished, TextEnd, ReasoningEnd, ToolStateChanged, StepStarted, StepFinished)


@dataclass(slots=True)
class _Block:
    message_id: str
    kind: Literal["text", "reasoning"]
    chunks: list[str] = field(default_factory=list)


class TranscriptWriter:
    """Applies the streaming persistence policy to the runtime's stream events.

    ``journal``: when given, every completed boundary event is appended to
    ``stream(session)`` (the session's name by default) before its row is written, so
    :func:`~contextfold.transcript.projector.rebuild` can recreate the rows.
    ``post_process``: applied to a finished block's text before the trailing trim.
    """

    def __init__(
        self,
        store: TranscriptStore,
        bus: TranscriptBus | None = None,
        *,
        journal: Journal | None = None,
        stream: Callable[[str], str] | None = None,
        post_process: Callable[[str], str] | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.journal = journal
        self._stream = stream or (lambda session: session)
        self._post_process = post_process
        self._blocks: dict[tuple[str, str], _Block] = {}
        # Rows still streaming, so an update never has to read its row back from the store.
        self._open: dict[tuple[str, str, str], Message | Part] = {}

    async def publish(self, event: StreamEvent) -> Message | Part | None:
        """Apply one stream event; returns the row written, or None for a delta.

        Raises InvalidInputError for a delta of a block not started here, an end or finish
        naming no row, a step boundary reusing another row's id, or a tool transition the
        part cannot make (back, or after completed or error); nothing is written, appended
        or broadcast then.
        """
        if not isinstance(event, StreamEvent):
            raise InvalidInputError(
                f"publish takes transcript stream events, got {type(event).__name__}"
            )
        if isinstance(event, DROPPED_EVENTS):
            return None
        if isinstance(event, (TextDelta, ReasoningDelta)):
            self._delta(event)
            return None
        return await self._boundary(event)

    def _delta(self, event: TextDelta | ReasoningDelta) -> None:
        kind: Literal["text", "reasoning"] = "text" if isinstance(event, TextDelta) else "reasoning"
        block = self._blocks.get((event.session, event.part_id))
        if block is None or block.kind != kind:
            raise InvalidInputError(
                f"{event.event_type}: no {kind} block {event.part_id!r} is streaming in session "
                f"{event.session!r}; send {kind}-start first"
            )
        block.chunks.append(event.delta)
        if self.bus is not None:
            self.bus.publish(
                PartDelta(
                    namespace=self.store.namespace,
                    session=event.session,
                    message_id=block.message_id,
                    part_id=event.part_id,
                    part_kind=kind,
                    delta=event.delta,
                )
            )

    async def _boundary(self, event: StreamEvent) -> Message | Part:
        kind, row_id = target_id(event)
        key = (event.session, kind, row_id)
        if isinstance(event, (TextEnd, ReasoningEnd)) and event.text is None:
            event = event.model_copy(update={"text": self._settle(event)})
        previous = self._open.get(key)
        if previous is None and isinstance(event, _UPDATES):
            if kind == "message":
                previous = await self.store.get_message(event.session, row_id)
            else:
                previous = await self.store.get_part(event.session, row_id)
        row = project(event, previous)
        if row == previous:
            return row  # a replay that changes nothing: nothing to append, write or announce
        if self.journal is not None:
            await self.journal.append(self._stream(event.session), event, channels=("transcript",))
        if isinstance(row, Message):
            await self.store.write_message(row)
        else:
            await self.store.write_part(row)
        if is_unfinished(row):
            self._open[key] = row
        else:
            self._open.pop(key, None)
        if isinstance(event, (TextStart, ReasoningStart)):
            block_kind: Literal["text", "reasoning"] = (
                "text" if isinstance(event, TextStart) else "reasoning"
            )
            self._blocks[(event.session, row_id)] = _Block(event.message_id, block_kind)
        elif isinstance(event, (TextEnd, ReasoningEnd)):
            self._blocks.pop((event.session, row_id), None)
        self._announce(row)
        return row

    def _settle(self, event: TextEnd | ReasoningEnd) -> str | None:
        block = self._blocks.get((event.session, event.part_id))
        if block is None:
            return None  # not started here: the stored text stands
        text = "".join(block.chunks)
        if self._post_process is not None:
            text = self._post_process(text)
        return text.rstrip()

    def _announce(self, row: Message | Part) -> None:
        if self.bus is None:
            return
        if isinstance(row, Message):
            self.bus.publish(
                MessageUpdated(namespace=self.store.namespace, session=row.session, message=row)
            )
        else:
            self.bus.publish(
                PartUpdated(namespace=self.store.namespace, session=row.session, part=row)
            )

    def confirmed(self, session: str) -> Mapping[str, str]:
        """Part id → text joined so far, for the text and reasoning blocks streaming in
        ``session``: what cleanup should complete them with while this process lives."""
        return {
            part_id: "".join(block.chunks)
            for (s, part_id), block in self._blocks.items()
            if s == session
        }

    async def interrupt(self, session: str, *, now: str) -> CleanupResult:
        """Close every unfinished row of ``session`` at the time ``now`` (a cancelled turn):
        blocks end with the text their deltas confirmed, running tools fail "interrupted",
        open messages finish "interrupted". The closed rows are announced on the bus."""
        result = await self.store.cleanup_unfinished(session, self.confirmed(session), now=now)
        for key in [k for k in self._blocks if k[0] == session]:
            del self._blocks[key]
        for row_key in [k for k in self._open if k[0] == session]:
            del self._open[row_key]
        for row in (*result.messages, *result.parts):
            self._announce(row)
        return result
