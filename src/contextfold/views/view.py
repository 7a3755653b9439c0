"""Views: a fold's state trimmed to a token budget.

A view is a pure function of a state and a budget. Built-in strategies work lazily from
the newest segment back and stop once the budget is met, so a call costs what the view
keeps, not the length of the history: segments' counts and elided forms are memoized on
the (immutable) segments themselves.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

from pyrsistent import pvector

from ..errors import InvalidInputError, UsageError
from ..folds.fold import FoldBase
from ..folds.segmented import Segment, SegmentedFold, SegmentedState
from .tokens import approx_tokens

__all__ = ["ContextView", "SplitResult", "StrategyContext", "ViewResult", "check_budget"]

S = TypeVar("S")
T = TypeVar("T")


def check_budget(budget: object, *, name: str = "budget", allow_zero: bool = False) -> float:
    """Return the budget, or raise InvalidInputError: a positive number (or zero) or infinity."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or math.isnan(budget):
        raise InvalidInputError(
            f"{name} must be a positive number of tokens or math.inf, got {budget!r}"
        )
    if budget < 0 or (budget == 0 and not allow_zero):
        raise InvalidInputError(
            f"{name} must be {'non-negative' if allow_zero else 'positive'}, got {budget!r}"
        )
    return float(budget)


class _Same:
    """An unhashable memo key part, compared by identity."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value


def _memo_key(*parts: object) -> tuple[object, ...]:
    """A key of the per-segment memo for what ``parts`` (pure functions) compute from a
    segment. The memo holds the parts, so an id in a key is never reused while it lives."""
    key: list[object] = []
    for part in parts:
        try:
            hash(part)
        except TypeError:
            part = _Same(part)
        key.append(part)
    return tuple(key)


# Entries one segment's memo keeps: a few views and elides share it. A counter or map made
# per request (a closure, a TiktokenCounter) is a new key each time; without a bound a
# long-lived segment would keep one entry, and that function, per request.
MEMO_LIMIT = 16


def remember(memo: dict[Any, Any], key: object, value: T) -> T:
    """Store ``value`` in a segment's memo, forgetting its oldest entry past MEMO_LIMIT."""
    if len(memo) >= MEMO_LIMIT:
        del memo[next(iter(memo))]
    memo[key] = value
    return value


@dataclass(frozen=True, slots=True)
class ViewResult(Generic[S]):
    """What a view returns. ``fits``: within budget and nothing dropped."""

    state: S
    tokens: float
    budget: float
    over_budget: bool
    dropped: Sequence[str]
    """Ids of the segments the view dropped, oldest first."""

    @property
    def fits(self) -> bool:
        return not self.over_budget and len(self.dropped) == 0


@dataclass(frozen=True, slots=True)
class SplitResult:
    """A state cut for a compaction: ``older`` to summarize, ``kept`` verbatim (newest)."""

    older: Sequence[Segment[Any]]
    kept: Sequence[Segment[Any]]


@dataclass(frozen=True, slots=True)
class StrategyContext:
    """What a custom strategy gets besides the state."""

    budget: float
    tokens: float
    count: Callable[[Any], float]


class _Ids(Sequence[str]):
    """The ids of ``segments[:end]``, computed only when looked at."""

    __slots__ = ("_end", "_segments")

    def __init__(self, segments: Sequence[Segment[Any]], end: int) -> None:
        self._segments, self._end = segments, end

    def __len__(self) -> int:
        return self._end

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._end))]
        if index < 0:
            index += self._end
        if not 0 <= index < self._end:
            raise IndexError(index)
        return self._segments[index].id

    def __iter__(self) -> Iterator[str]:
        return (self._segments[i].id for i in range(self._end))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"{list(self)!r}"


class Work:
    """A segmented state being trimmed, lazily: the original segments, the first kept index,
    and the elisions that apply to old segments. Built-in strategies transform it."""

    __slots__ = ("elisions", "segments", "start", "summary", "view")

    def __init__(self, view: ContextView[Any], state: SegmentedState[Any, Any]) -> None:
        self.view = view
        self.summary = state.summary
        self.segments = state.segments
        self.start = 0
        self.elisions: list[Any] = []

    def segment(self, index: int) -> Segment[Any]:
        segment = self.segments[index]
        for elision in self.elisions:
            segment = elision.apply(segment, index, len(self.segments))
        return segment

    def summary_tokens(self) -> float:
        return self.view.count_summary(self.summary) if self.summary is not None else 0.0

    def tokens_upto(self, limit: float) -> tuple[float, bool]:
        """Tokens from the newest segment back; stops past ``limit``. (tokens, exact)."""
        total = self.summary_tokens()
        for index in range(len(self.segments) - 1, self.start - 1, -1):
            if total > limit:
                return total, False
            total += self.view.count(self.segment(index))
        return total, True

    def state(self) -> SegmentedState[Any, Any]:
        if not self.elisions and self.start == 0:
            return SegmentedState(self.segments, self.summary)
        kept = [self.segment(i) for i in range(self.start, len(self.segments))]
        return SegmentedState(pvector(kept), self.summary)


class ContextView(Generic[S]):
    """A view of ``fold``: ``view(state, budget=…)`` -> :class:`ViewResult`.

    For a segmented fold, ``count`` sizes one segment (default :func:`approx_tokens`; it
    must be pure: counts are cached per segment) and ``count_summary`` the summary. For a
    plain fold, pass ``measure`` (tokens of the whole state). ``strategies`` run in order,
    each at most once, only while the state is over budget.
    """

    def __init__(
        self,
        fold: FoldBase[S],
        *,
        count: Callable[[Any], float] | None = None,
        count_summary: Callable[[Any], float] | None = None,
        measure: Callable[[S], float] | None = None,
        strategies: Sequence[Callable[..., Any]] = (),
    ) -> None:
        if not isinstance(fold, FoldBase):
            raise UsageError(f"ContextView takes a fold, got {fold!r}")
        self.fold = fold
        self.segmented = isinstance(fold, SegmentedFold)
        if not self.segmented and measure is None:
            raise UsageError(
                f"a view of the plain fold {fold.name} needs measure=(state -> tokens): "
                "it has no segments to count"
            )
        if self.segmented and measure is not None:
            raise UsageError(
                "measure= is for plain folds; a segmented view counts segments (count=)"
            )
        self._count = count or approx_tokens
        self.count_summary = count_summary or approx_tokens
        self.measure = measure
        self.strategies = tuple(strategies)
        # Keyed by the counter, not by the view: a view built per request adds no memo entries.
        self._key = _memo_key("count", self._count)
        self.__name__ = f"{fold.name}View"

    def count(self, segment: Segment[Any]) -> float:
        """Tokens of one segment, with this view's counter (cached on the segment)."""
        memo = segment._memo
        tokens = memo.get(self._key)
        if tokens is None:
            tokens = remember(memo, self._key, self._count(segment))
        return tokens

    def __call__(self, state: S, *, budget: float) -> ViewResult[S]:
        limit = check_budget(budget)
        if not self.segmented:
            return self._plain(state, limit)
        assert isinstance(state, SegmentedState)
        work = Work(self, state)
        tokens, exact = work.tokens_upto(limit)
        for strategy in self.strategies:
            if tokens <= limit:
                break
            lazy = getattr(strategy, "apply_lazy", None)
            if lazy is not None:
                lazy(work, limit)
            else:
                current = work.state()
                ctx = StrategyContext(
                    limit, tokens if exact else work.tokens_upto(math.inf)[0], self.count
                )
                changed = strategy(current, ctx)
                if changed is not current:
                    if not isinstance(changed, SegmentedState):
                        raise UsageError(f"strategy {strategy!r} returned {type(changed).__name__}")
                    work = _rebased(self, work, changed)
            tokens, exact = work.tokens_upto(limit)
        if not exact:
            tokens = work.tokens_upto(math.inf)[0]
        result_state = work.state()
        dropped: Sequence[str] = _Ids(work.segments, work.start) if work.start else ()
        if isinstance(work, _Custom):
            dropped = (*work.dropped, *dropped)
        return ViewResult(result_state, tokens, limit, tokens > limit, dropped)  # type: ignore[arg-type]

    def _plain(self, state: S, limit: float) -> ViewResult[S]:
        assert self.measure is not None
        tokens = self.measure(state)
        for strategy in self.strategies:
            if tokens <= limit:
                break
            state = strategy(state, StrategyContext(limit, tokens, self.measure))
            tokens = self.measure(state)
        return ViewResult(state, tokens, limit, tokens > limit, ())

    def split(
        self,
        state: SegmentedState[Any, Any],
        *,
        keep_tokens: float,
        keep_from: Callable[[Sequence[Segment[Any]]], int] | None = None,
    ) -> SplitResult:
        """Cut ``state`` for a compaction: ``kept`` are the newest whole segments whose tokens
        fit ``keep_tokens`` (and always those from ``keep_from(segments)`` on), stopping at the
        first that does not fit; ``older`` the rest. No strategy runs; the summary does not
        count."""
        if not self.segmented:
            raise UsageError("split needs a view of a segmented fold")
        limit = check_budget(keep_tokens, name="keep_tokens", allow_zero=True)
        segments = state.segments
        forced = len(segments) if keep_from is None else _index(keep_from(segments), len(segments))
        total = 0.0
        start = len(segments)
        for index in range(len(segments) - 1, -1, -1):
            tokens = self.count(segments[index])
            if index < forced and total + tokens > limit:
                break
            total += tokens
            start = index
        return SplitResult(older=segments[:start], kept=segments[start:])


def _index(value: int, length: int) -> int:
    if not isinstance(value, int) or not 0 <= value <= length:
        raise InvalidInputError(f"keep_from must return an index from 0 to {length}, got {value!r}")
    return value


class _Custom(Work):
    """Work after a custom strategy replaced the state: dropped ids are computed eagerly."""

    __slots__ = ("dropped",)
    dropped: tuple[str, ...]


def _rebased(view: ContextView[Any], work: Work, changed: SegmentedState[Any, Any]) -> Work:
    before = [work.segments[i].id for i in range(len(work.segments))]
    dropped = list(getattr(work, "dropped", [])) + [sid for sid in before[: work.start]]
    remaining = {s.id for s in changed.segments}
    dropped += [sid for sid in before[work.start :] if sid not in remaining]
    new = _Custom(view, changed)
    new.dropped = tuple(dropped)
    return new
