"""Compaction with a view: compact a segmented fold only when it helps."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import FoldCompactionError
from ..events import RawEvent
from ..folds.reader import FoldReader
from ..folds.segmented import Segment, SegmentedFold, SegmentedState
from .strategies import KeepFrom
from .view import ContextView, check_budget

__all__ = ["CompactResult", "chunks_of", "compact_with_view"]


@dataclass(frozen=True, slots=True)
class CompactResult:
    """Whether it compacted, the fold's state (after, or as read), and how many segments the
    summary replaced."""

    compacted: bool
    state: SegmentedState[Any, Any]
    summarized: int

    def __iter__(self) -> Any:
        return iter((self.compacted, self.state, self.summarized))


Summarize = Callable[..., Any]


async def compact_with_view(
    reader: FoldReader,
    fold: SegmentedFold,
    namespace: str,
    stream: str,
    *,
    view: ContextView[Any],
    budget: float,
    keep_tokens: float,
    keep_from: KeepFrom | None,
    summarize: Summarize,
    append: Callable[[RawEvent], Awaitable[Any]],
) -> CompactResult:
    """Read the fold; when ``view(state, budget)`` does not fit and ``view.split`` leaves
    older segments, ``summarize(summary=, older=, kept=)`` writes the new summary and the
    state becomes ``{summary, kept}``, stored as a checkpoint of that read."""
    if not isinstance(view, ContextView) or view.fold is not fold:
        raise TypeError(f"view must be a ContextView of fold {fold.name}")
    if not callable(summarize):
        raise TypeError("summarize must be a function (summary=, older=, kept=) -> summary")
    check_budget(budget)
    check_budget(keep_tokens, name="keep_tokens", allow_zero=True)
    if fold.summary_schema is None:
        raise FoldCompactionError(
            f"fold {fold.name} has no summary schema: compact it with compact(next) only",
            reason="unsupported",
        )
    if not fold.can_compact:
        raise FoldCompactionError(
            f"fold {fold.name} is run-scoped and cannot compact", reason="unsupported"
        )
    state, cursor = await reader.read_with_cursor(fold, namespace, stream)
    if view(state, budget=budget).fits:
        return CompactResult(False, state, 0)
    cut = view.split(state, keep_tokens=keep_tokens, keep_from=keep_from)
    if len(cut.older) == 0:
        return CompactResult(False, state, 0)
    try:
        summary = summarize(summary=state.summary, older=cut.older, kept=cut.kept)
        if inspect.isawaitable(summary):
            summary = await summary
    except Exception as exc:
        raise FoldCompactionError(
            f"fold {fold.name}: summarize failed: {exc!r}; nothing was published",
            reason="summarize-failed",
        ) from exc
    new_state: SegmentedState[Any, Any] = SegmentedState(cut.kept, summary)
    after = await reader.publish_checkpoint(
        fold, namespace, stream, new_state, cursor, append=append
    )
    return CompactResult(True, after, len(cut.older))


def chunks_of(
    segments: Sequence[Segment[Any]], tokens: float, *, count: Callable[[Segment[Any]], float]
) -> list[list[Segment[Any]]]:
    """Consecutive runs of segments of at most ``tokens`` each (one segment at least), as
    ``count`` sizes them (pass ``view.count``): for summarizing older segments in chunks."""
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
