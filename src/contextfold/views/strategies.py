"""Built-in strategies. Each works on segmented state, never splits a segment, never drops
the summary, and walks back from the newest segment only over what it keeps."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..errors import InvalidInputError, UsageError
from ..folds.segmented import Segment, SegmentedFold
from .view import Work, _index, _memo_key, remember

__all__ = ["KeepFrom", "drop_oldest", "elide", "from_newest", "newest"]

KeepFrom = Callable[[Sequence[Segment[Any]]], int]


class elide:
    """Transform the data of segments older than the newest ``keep_newest`` (that match
    ``where``), e.g. shorten old tool outputs. Never removes a segment. Memoized per
    segment: ``map`` runs once per segment, and its elided form is counted once."""

    def __init__(
        self,
        *,
        keep_newest: int,
        map: Callable[[Any], Any],
        where: Callable[[Segment[Any]], bool] | None = None,
    ) -> None:
        if not isinstance(keep_newest, int) or keep_newest < 0:
            raise InvalidInputError(f"keep_newest must be an int >= 0, got {keep_newest!r}")
        self.keep_newest = keep_newest
        self.map = map
        self.where = where
        # Keyed by what the elided form depends on, not by the strategy: an elide built per
        # request adds no memo entries.
        self._key = _memo_key("elide", map, where)

    def apply(self, segment: Segment[Any], index: int, length: int) -> Segment[Any]:
        if index >= length - self.keep_newest:
            return segment
        memo = segment._memo
        elided = memo.get(self._key)
        if elided is None:
            if self.where is not None and not self.where(segment):
                elided = segment
            else:
                data = self.map(segment.data)
                elided = segment if data is segment.data else Segment(segment.id, data)
            remember(memo, self._key, elided)
        return elided

    def apply_lazy(self, work: Work, limit: float) -> None:
        work.elisions.append(self)

    def __call__(self, state: Any, ctx: Any) -> Any:  # pragma: no cover - views call apply_lazy
        raise UsageError("elide is applied by a ContextView")


class drop_oldest:
    """Drop whole segments, oldest first, until the state fits; never those from
    ``keep_from(segments)`` on. The summary is never dropped."""

    def __init__(self, *, keep_from: KeepFrom | None = None) -> None:
        self.keep_from = keep_from

    def apply_lazy(self, work: Work, limit: float) -> None:
        length = len(work.segments)
        forced = length
        if self.keep_from is not None:
            current = work.segments if work.start == 0 else work.segments[work.start :]
            forced = work.start + _index(self.keep_from(current), length - work.start)
        total = work.summary_tokens()
        start = length
        for index in range(length - 1, work.start - 1, -1):
            tokens = work.view.count(work.segment(index))
            if index < forced and total + tokens > limit:
                break
            total += tokens
            start = index
        work.start = start

    def __call__(self, state: Any, ctx: Any) -> Any:  # pragma: no cover
        raise UsageError("drop_oldest is applied by a ContextView")


def from_newest(fold: SegmentedFold, kind: str) -> KeepFrom:
    """A ``keep_from``: the index of the newest segment of ``kind`` (0 when there is none,
    so every segment stays)."""
    if fold.tag is None:
        raise UsageError(f"from_newest needs fold {fold.name} to have a tag")

    def keep_from(segments: Sequence[Segment[Any]]) -> int:
        for index in range(len(segments) - 1, -1, -1):
            if fold.kind(segments[index]) == kind:
                return index
        return 0

    return keep_from


def newest(count: int = 1) -> KeepFrom:
    """A ``keep_from``: the newest ``count`` segments."""
    if not isinstance(count, int) or count < 0:
        raise InvalidInputError(f"newest(count) takes an int >= 0, got {count!r}")

    def keep_from(segments: Sequence[Segment[Any]]) -> int:
        return max(0, len(segments) - count)

    return keep_from
