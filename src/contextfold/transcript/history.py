"""Reading a session back: the full history by pages, and the compacted model view.

The full history is every message of a session, paged to the end with cursors; nothing
is ever left out of it. :func:`filter_compacted` is the model-facing view built from it
before each turn: history older than the newest completed compaction is dropped, except
the tail the compaction retained. The two must not be confused when history looks "lost":
missing from the full history is a write problem, missing from the view is a compaction
boundary.
"""

from __future__ import annotations

from collections.abc import Sequence

from .parts import CompactionPart, MessageWithParts
from .store.base import DEFAULT_PAGE_SIZE, TranscriptStore

__all__ = ["compacted_history", "filter_compacted", "is_compaction_boundary", "read_history"]


async def read_history(
    store: TranscriptStore, session: str, *, page_size: int = DEFAULT_PAGE_SIZE
) -> tuple[MessageWithParts, ...]:
    """Every message of ``session`` with its parts, oldest first, read page by page."""
    history: list[MessageWithParts] = []
    cursor: str | None = None
    while True:
        page = await store.page_messages(session, after=cursor, limit=page_size)
        parts = await store.parts_of(session, [m.id for m in page.messages])
        history.extend(MessageWithParts(message=m, parts=parts[m.id]) for m in page.messages)
        cursor = page.cursor
        if not page.more:
            return tuple(history)


def is_compaction_boundary(entry: MessageWithParts) -> bool:
    """Whether ``entry`` is a user message carrying a compaction part."""
    return entry.message.role == "user" and any(
        isinstance(part, CompactionPart) for part in entry.parts
    )


def filter_compacted(history: Sequence[MessageWithParts]) -> tuple[MessageWithParts, ...]:
    """The model-facing view of a history given oldest first; returned oldest first.

    Scans newest to oldest. An assistant message with a successful summary (``summary``
    set, finished, no error, not interrupted) marks its parent user message as compacted;
    when the scan reaches that parent and it carries a compaction part, it is the
    boundary, and everything older than it is dropped except the retained tail: when the
    compaction part names a ``tail_start_id`` older than the boundary, the messages from
    that one up to the boundary stay, placed after the summary. The view is then the
    boundary through its summary, the tail, and everything newer than the summary. Without
    a boundary the whole history is returned. A failed or unfinished summary is no
    boundary, so a failed compaction never loses history; a tail naming no older message
    retains nothing. Pure: returns a new tuple and never changes its input.
    """
    summaries: dict[str, int] = {}  # parent id -> index of its oldest successful summary
    for index in range(len(history) - 1, -1, -1):
        entry = history[index]
        message = entry.message
        summary = summaries.get(message.id)
        if summary is not None and is_compaction_boundary(entry):
            return _spliced(history, index, summary)
        if (
            message.role == "assistant"
            and message.summary
            and message.succeeded
            and message.finish is not None
            and message.parent_id is not None
        ):
            summaries[message.parent_id] = index
    return tuple(history)


def _spliced(
    history: Sequence[MessageWithParts], boundary: int, summary: int
) -> tuple[MessageWithParts, ...]:
    tail_id = next(
        (
            part.tail_start_id
            for part in history[boundary].parts
            if isinstance(part, CompactionPart) and part.tail_start_id is not None
        ),
        None,
    )
    if tail_id is None:
        return tuple(history[boundary:])
    tail = next((i for i in range(boundary - 1, -1, -1) if history[i].message.id == tail_id), None)
    if tail is None:
        return tuple(history[boundary:])
    return (
        *history[boundary : summary + 1],
        *history[tail:boundary],
        *history[summary + 1 :],
    )


async def compacted_history(
    store: TranscriptStore, session: str, *, page_size: int = DEFAULT_PAGE_SIZE
) -> tuple[MessageWithParts, ...]:
    """:func:`filter_compacted` of the full history: what the next turn is rebuilt from."""
    return filter_compacted(await read_history(store, session, page_size=page_size))
