"""Compaction by a view's policy: summarize a segmented fold's older segments, only when it helps.

The fold is read, measured by a :class:`~contextfold.ContextView`, and, when the view does
not fit its budget and ``view.split`` leaves older segments, a summarizer replaces those
with a new summary; the result is stored as a checkpoint of that read. The agent context
compacts another way (by cutoff, :mod:`contextfold.context.compaction`), which the error
for it names.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..errors import CheckpointError, CompactionError, InvalidInputError
from ..folds.reader import FoldReader
from ..folds.segmented import SegmentedFold, SegmentedState
from ..views.strategies import KeepFrom
from ..views.view import ContextView, check_budget
from .checkpoint import Append, publish_checkpoint

__all__ = ["CompactionResult", "Summarize", "compact"]

Summarize = Callable[..., Any]
"""``summarize(*, summary, older, kept) -> new summary`` (or an awaitable of it): the
previous summary, the segments to replace (oldest first) and those kept verbatim."""


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """What a compaction did.

    It unpacks as ``compacted, state, summarized``.
    """

    compacted: bool
    """Whether a summary was stored (False when the view fit, or nothing older was left)."""
    state: SegmentedState[Any, Any]
    """The fold's state: after the compaction, or as read when there was none."""
    summarized: int
    """How many segments the new summary replaced."""

    def __iter__(self) -> Any:
        return iter((self.compacted, self.state, self.summarized))


def _check(
    fold: object, view: object, budget: object, keep_tokens: object, summarize: object
) -> tuple[SegmentedFold, float]:
    """The fold and ``keep_tokens`` to compact with, or the error saying what is wrong."""
    if not isinstance(fold, SegmentedFold):
        name = getattr(fold, "name", repr(fold))
        instead = getattr(fold, "compacted_by", None) or (
            "to replace its state with a value of your own, call "
            "journal.checkpoint(fold, stream, next)"
        )
        raise CompactionError(
            f"fold {name} is not a SegmentedFold, and journal.compact summarizes a segmented "
            f"fold's older segments by a view: {instead}",
            reason="unsupported",
        )
    segmented: SegmentedFold = fold
    if not isinstance(view, ContextView) or view.fold is not segmented:
        raise InvalidInputError(
            f"view must be a ContextView of fold {segmented.name}, got {view!r}"
        )
    if not callable(summarize):
        raise InvalidInputError(
            f"summarize must be a function (summary=, older=, kept=) -> summary, got {summarize!r}"
        )
    total = check_budget(budget)
    keep = check_budget(
        total / 2 if keep_tokens is None else keep_tokens, name="keep_tokens", allow_zero=True
    )
    if segmented.summary_schema is None:
        raise CompactionError(
            f"fold {segmented.name} has no summary schema, so it has nowhere to keep a summary: "
            "give it summary=…, or replace its state with journal.checkpoint(fold, stream, next)",
            reason="unsupported",
        )
    if not segmented.can_checkpoint:
        raise CompactionError(
            f"fold {segmented.name} is run-scoped: only a context-scoped fold compacts",
            reason="unsupported",
        )
    return segmented, keep


async def compact(
    reader: FoldReader,
    fold: SegmentedFold,
    namespace: str,
    stream: str,
    *,
    view: ContextView[Any],
    budget: float,
    keep_tokens: float | None,
    keep_from: KeepFrom | None,
    summarize: Summarize,
    append: Append,
) -> CompactionResult:
    """Read the fold; when ``view(state, budget)`` does not fit and ``view.split`` leaves
    older segments, ``summarize(summary=, older=, kept=)`` writes the new summary and the
    state becomes ``{summary, kept}``, stored as a checkpoint of that read.

    ``keep_tokens`` defaults to half the budget. Raises ValueError for a budget that is
    not a positive number, InvalidInputError for another view or a summarize that is not
    callable, CompactionError (``unsupported``, ``summarize-failed``,
    ``invalid-state``) when it cannot compact; nothing is stored then.
    """
    fold, keep = _check(fold, view, budget, keep_tokens, summarize)
    state, cursor = await reader.read_with_cursor(fold, namespace, stream)
    if view(state, budget=budget).fits:
        return CompactionResult(False, state, 0)
    cut = view.split(state, keep_tokens=keep, keep_from=keep_from)
    if len(cut.older) == 0:
        return CompactionResult(False, state, 0)
    try:
        summary = summarize(summary=state.summary, older=cut.older, kept=cut.kept)
        if inspect.isawaitable(summary):
            summary = await summary
    except Exception as exc:
        raise CompactionError(
            f"fold {fold.name}: summarize failed: {exc!r}; nothing was stored",
            reason="summarize-failed",
        ) from exc
    new_state: SegmentedState[Any, Any] = SegmentedState(cut.kept, summary)
    try:
        after = await publish_checkpoint(reader, fold, namespace, stream, new_state, cursor, append)
    except CheckpointError as exc:
        raise CompactionError(
            f"fold {fold.name}: the summary cannot be stored: {exc}", reason=exc.reason
        ) from exc
    return CompactionResult(True, after, len(cut.older))
