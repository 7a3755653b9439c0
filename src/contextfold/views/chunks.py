"""Chunks: older segments cut into runs that each fit a budget, for summarizing in parts."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..folds.segmented import Segment
from .view import check_budget

__all__ = ["chunks_of"]


def chunks_of(
    segments: Sequence[Segment[Any]], tokens: float, *, count: Callable[[Segment[Any]], float]
) -> list[list[Segment[Any]]]:
    """Consecutive runs of segments of at most ``tokens`` each (one segment at least), as
    ``count`` sizes them (pass ``view.count``): for summarizing older segments in chunks.
    Raises ValueError when ``tokens`` is not a positive number."""
    check_budget(tokens)
    chunks: list[list[Segment[Any]]] = []
    current: list[Segment[Any]] = []
    size = 0.0
    for segment in segments:
        n = count(segment)
        if current and size + n > tokens:
            chunks.append(current)
            current, size = [], 0.0
        current.append(segment)
        size += n
    if current:
        chunks.append(current)
    return chunks
