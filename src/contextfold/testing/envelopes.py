"""Envelopes for pure use of folds in tests (``fold.apply_all(state, envelopes)``), without
a journal: the coordinates and meta a journal would have given."""

from __future__ import annotations

from collections.abc import Iterable

from ..events import E, Envelope, EventMeta
from .clock import EPOCH

__all__ = ["envelope", "envelopes"]


def envelope(
    payload: E,
    position: int = 1,
    *,
    stream: str = "test",
    meta: EventMeta | None = None,
    global_position: int | None = None,
) -> Envelope[E]:
    """``payload`` at ``position`` of ``stream``: event id ``ev-{position}``, the time
    :data:`~contextfold.testing.clock.EPOCH` (unless ``meta`` says otherwise), and the
    global position equal to the position unless given."""
    return Envelope(
        payload,
        meta if meta is not None else EventMeta(f"ev-{position}", EPOCH.isoformat()),
        stream,
        position,
        global_position if global_position is not None else position,
        type(payload).event_type,
    )


def envelopes(payloads: Iterable[E], *, start: int = 1, stream: str = "test") -> list[Envelope[E]]:
    """One :func:`envelope` per payload, at consecutive positions from ``start``."""
    return [envelope(p, position, stream=stream) for position, p in enumerate(payloads, start)]
