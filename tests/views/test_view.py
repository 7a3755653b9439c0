"""Views: budgets, ViewResult, counting, the built-in strategies, custom strategies, split."""

from __future__ import annotations

import dataclasses
import gc
import math
from typing import Any, cast

import pytest
from pyrsistent import PVector

import contextfold as cf
from contextfold.views.view import Work


class Opened(cf.Event, type="view/opened"):
    id: str
    kind: str
    size: int


# Segments carry their own token count ("size"), so every expectation is exact.
Sized = cf.SegmentedFold("sized", data=dict[str, Any], summary=str, tag="kind")
State = cf.SegmentedState[dict[str, Any], str]


@Sized.open(Opened)
def _opened(ev: cf.Envelope[Opened]) -> cf.Segment[dict[str, Any]]:
    return cf.Segment(ev.payload.id, {"kind": ev.payload.kind, "size": ev.payload.size})


def by_size(segment: cf.Segment[dict[str, Any]]) -> int:
    return int(segment.data["size"])


def summary_size(summary: str) -> int:
    return len(summary)


def state_of(*specs: tuple[str, str, int], summary: str | None = None) -> State:
    segments: list[cf.Segment[dict[str, Any]]] = [
        cf.Segment(sid, cf.FrozenDict(kind=kind, size=size)) for sid, kind, size in specs
    ]
    return cf.SegmentedState(segments, summary)


def ids(state: cf.SegmentedState[Any, Any]) -> list[str]:
    return [s.id for s in state.segments]


def halve(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "size": data["size"] // 2, "elided": True}


# -- budgets -----------------------------------------------------------------------------------


BAD_BUDGETS = [0, 0.0, -1, -0.5, math.nan, -math.inf, True, False, "10", None, [10], 1j]


@pytest.mark.parametrize("budget", BAD_BUDGETS)
def test_budget_must_be_a_positive_number_or_infinity(budget: object) -> None:
    view = cf.ContextView(Sized, count=by_size)
    plain: cf.ContextView[tuple[Any, ...]] = cf.ContextView(
        cf.Fold("plain", initial=tuple), measure=len
    )
    with pytest.raises(ValueError):
        view(state_of(("a", "user", 1)), budget=budget)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        plain((), budget=budget)  # type: ignore[arg-type]


@pytest.mark.parametrize("budget", [math.inf, 0.5, 1, 10**9, 2.5])
def test_positive_budgets_and_infinity_are_accepted(budget: float) -> None:
    view = cf.ContextView(Sized, count=by_size)
    result = view(state_of(("a", "user", 1)), budget=budget)
    assert result.budget == budget
    assert result.over_budget is (budget < 1)


# -- ViewResult --------------------------------------------------------------------------------


def test_view_result_fields() -> None:
    view = cf.ContextView(Sized, count=by_size, strategies=[cf.drop_oldest()])
    state = state_of(("a", "user", 10), ("b", "step", 10), ("c", "answer", 10))

    trimmed = view(state, budget=25)
    assert ids(trimmed.state) == ["b", "c"]
    assert (trimmed.tokens, trimmed.budget, trimmed.over_budget) == (20, 25.0, False)
    assert list(trimmed.dropped) == ["a"]
    assert trimmed.fits is False  # within budget, but something was dropped

    whole = view(state, budget=30)
    assert whole.state == state
    assert (whole.tokens, whole.over_budget, list(whole.dropped), whole.fits) == (
        30,
        False,
        [],
        True,
    )


def test_without_strategies_a_view_only_measures() -> None:
    view = cf.ContextView(Sized, count=by_size, count_summary=summary_size)
    state = state_of(("a", "user", 10), ("b", "step", 10), summary="12345")
    result = view(state, budget=20)
    assert result.state == state
    assert (result.tokens, result.over_budget, list(result.dropped), result.fits) == (
        25,
        True,
        [],
        False,
    )


def test_default_counter_is_approx_tokens() -> None:
    view = cf.ContextView(Sized)
    state = state_of(("a", "user", 10))
    assert view(state, budget=math.inf).tokens == cf.approx_tokens(state.segments[0])
    assert cf.approx_tokens("x" * 8) == math.ceil(len('"xxxxxxxx"') / 4)


def test_strategies_run_in_order_at_most_once_and_only_while_over_budget() -> None:
    calls: list[str] = []

    def noop(name: str) -> Any:
        def strategy(state: State, ctx: cf.StrategyContext) -> State:
            calls.append(name)
            return state

        return strategy

    view = cf.ContextView(Sized, count=by_size, strategies=[noop("first"), noop("second")])
    state = state_of(("a", "user", 10), ("b", "step", 10))
    view(state, budget=100)
    assert calls == []
    result = view(state, budget=5)
    assert calls == ["first", "second"]
    assert result.over_budget and result.state == state


# -- counting ----------------------------------------------------------------------------------


def test_count_is_cached_per_segment_across_calls_and_budgets() -> None:
    counted: list[str] = []

    def counter(segment: cf.Segment[dict[str, Any]]) -> int:
        counted.append(segment.id)
        return by_size(segment)

    view = cf.ContextView(
        Sized, count=counter, strategies=[cf.drop_oldest(keep_from=cf.from_newest(Sized, "user"))]
    )
    state = state_of(*[(f"s{i}", "user" if i % 3 == 0 else "step", 10) for i in range(30)])
    for budget in (math.inf, 1000, 95, 40, 10, 0.5, 250):
        view(state, budget=budget)
    assert sorted(counted) == sorted(set(counted))  # each segment counted at most once
    assert len(counted) == 30

    # A new segment (the fold appends to a persistent vector) is the only one counted.
    segments = cast("PVector[cf.Segment[dict[str, Any]]]", state.segments)
    grown: State = cf.SegmentedState(
        segments.append(cf.Segment("new", {"kind": "step", "size": 1}))
    )
    counted.clear()
    view(grown, budget=math.inf)
    view(grown, budget=30)
    assert counted == ["new"]
    assert view.count(grown.segments[0]) == 10 and counted == ["new"]  # shared with reads


def test_a_segment_copied_with_new_data_is_counted_and_elided_again() -> None:
    # dataclasses.replace is how a handler or a custom strategy naturally derives a segment;
    # the copy must not inherit the memo of the original's data.
    view = cf.ContextView(Sized, count=by_size)
    elide = cf.elide(keep_newest=0, map=halve)
    segment = cf.Segment("x", cf.FrozenDict(kind="step", size=10))
    assert view.count(segment) == 10 and elide.apply(segment, 0, 1).data["size"] == 5
    bigger = dataclasses.replace(segment, data=cf.FrozenDict(kind="step", size=40))
    assert view.count(bigger) == 40
    assert elide.apply(bigger, 0, 1).data["size"] == 20


def test_each_view_counts_with_its_own_counter() -> None:
    segment = cf.Segment("x", {"kind": "user", "size": 7})

    def count_with(tokens: int) -> float:
        # A view built per call: a new view must never reuse a dead view's cached count.
        return cf.ContextView(Sized, count=lambda s: tokens).count(segment)

    for tokens in range(20):
        assert count_with(tokens) == tokens
        gc.collect()
    assert cf.ContextView(Sized, count=by_size).count(segment) == 7


def test_views_built_per_request_leave_one_memo_entry_per_segment() -> None:
    state = state_of(*[(f"s{i}", "step", 10) for i in range(8)])
    for _ in range(1000):
        cf.ContextView(Sized, count=by_size)(state, budget=math.inf)
    assert [len(s._memo) for s in state.segments] == [1] * 8

    for _ in range(1000):
        elide = cf.elide(keep_newest=2, map=halve)
        result = cf.ContextView(Sized, count=by_size, strategies=[elide])(state, budget=1)
    # Its count, and for the six older segments their elided form (which holds its count).
    assert [len(s._memo) for s in state.segments] == [2] * 6 + [1] * 2
    assert [len(s._memo) for s in result.state.segments] == [1] * 8


def test_counters_and_elides_built_per_request_keep_the_memo_bounded() -> None:
    # A closure (or a TiktokenCounter) made per request is a new memo key each time: the
    # memo of a long-lived segment must not keep one entry, and the function, per request.
    state = state_of(*[(f"s{i}", "step", 10) for i in range(8)])
    for _ in range(1000):

        def count(segment: cf.Segment[dict[str, Any]]) -> int:
            return by_size(segment)

        def shorten(data: dict[str, Any]) -> dict[str, Any]:
            return halve(data)

        view = cf.ContextView(Sized, count=count, strategies=[cf.elide(keep_newest=2, map=shorten)])
        result = view(state, budget=1)
        assert result.tokens == 6 * 5 + 2 * 10  # still counted (and elided) right
    assert max(len(s._memo) for s in state.segments) <= 16


@dataclasses.dataclass
class Plus:
    """A counter that is unhashable (a dataclass with eq): memoized by identity instead."""

    extra: int

    def __call__(self, segment: cf.Segment[dict[str, Any]]) -> int:
        return by_size(segment) + self.extra


@dataclasses.dataclass
class Halve:
    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        return halve(data)


def test_an_unhashable_counter_is_memoized_by_identity() -> None:
    segment = cf.Segment("x", {"kind": "user", "size": 7})
    assert cf.ContextView(Sized, count=Plus(1)).count(segment) == 8
    assert cf.ContextView(Sized, count=Plus(2)).count(segment) == 9
    elide = cf.elide(keep_newest=0, map=Halve())
    assert elide.apply(segment, 0, 1) is elide.apply(segment, 0, 1)
    assert elide.apply(segment, 0, 1).data["size"] == 3


def test_a_state_within_budget_is_returned_without_walking_it() -> None:
    looked: list[int] = []

    class Probe(Work):
        def segment(self, index: int) -> cf.Segment[Any]:
            looked.append(index)
            return super().segment(index)

    state = state_of(*[(f"s{i}", "step", 10) for i in range(50)])
    kept = Probe(cf.ContextView(Sized, count=by_size), state).state()
    assert looked == [] and kept.segments is state.segments and kept == state


# -- elide -------------------------------------------------------------------------------------


def test_elide_is_memoized_and_never_changes_the_folds_state() -> None:
    mapped: list[int] = []

    def shorten(data: dict[str, Any]) -> dict[str, Any]:
        mapped.append(data["size"])
        return halve(data)

    elide = cf.elide(keep_newest=2, map=shorten)
    view = cf.ContextView(Sized, count=by_size, strategies=[elide])
    state = state_of(*[(f"s{i}", "step", 10 + i) for i in range(6)])
    snapshot = [(s.id, dict(s.data)) for s in state.segments]
    data_objects = [s.data for s in state.segments]

    first = view(state, budget=40)
    assert [s.data["size"] for s in first.state.segments] == [5, 5, 6, 6, 14, 15]
    assert [s.data.get("elided", False) for s in first.state.segments] == [True] * 4 + [False] * 2
    assert first.tokens == 51 and first.over_budget and list(first.dropped) == []
    second = view(state, budget=45)
    view(state, budget=1)
    assert sorted(mapped) == [10, 11, 12, 13]  # map ran once per old segment
    assert all(a is b for a, b in zip(first.state.segments, second.state.segments, strict=True))

    # The fold's state is untouched: same segments, same data objects, same content.
    assert [(s.id, dict(s.data)) for s in state.segments] == snapshot
    assert all(s.data is d for s, d in zip(state.segments, data_objects, strict=True))
    assert view(state, budget=math.inf).state == state  # within budget: nothing elided


def test_elide_where_selects_segments_and_never_removes_one() -> None:
    elide = cf.elide(keep_newest=0, map=halve, where=lambda s: s.data["kind"] == "step")
    view = cf.ContextView(Sized, count=by_size, strategies=[elide])
    state = state_of(("a", "user", 10), ("b", "step", 10), ("c", "step", 10))
    result = view(state, budget=1)
    assert ids(result.state) == ["a", "b", "c"]
    assert [s.data["size"] for s in result.state.segments] == [10, 5, 5]
    assert result.tokens == 20 and list(result.dropped) == []


def test_each_elide_maps_with_its_own_function() -> None:
    state = state_of(("a", "step", 10), ("b", "step", 10))

    def elided_with(tag: str) -> Any:
        strategy = cf.elide(keep_newest=1, map=lambda d: {**d, "tag": tag})
        return cf.ContextView(Sized, count=by_size, strategies=[strategy])(state, budget=1)

    for tag in "abcdefghij":
        assert elided_with(tag).state.segments[0].data["tag"] == tag
        gc.collect()


def test_elide_options_are_checked() -> None:
    for bad in (-1, 1.5, "2", None):
        with pytest.raises(ValueError):
            cf.elide(keep_newest=bad, map=halve)  # type: ignore[arg-type]


# -- drop_oldest, from_newest, newest ----------------------------------------------------------


def test_drop_oldest_drops_whole_segments_oldest_first() -> None:
    view = cf.ContextView(
        Sized, count=by_size, count_summary=summary_size, strategies=[cf.drop_oldest()]
    )
    state = state_of(("a", "user", 10), ("b", "step", 20), ("c", "answer", 5), summary="sum")
    result = view(state, budget=28)
    assert ids(result.state) == ["b", "c"] and list(result.dropped) == ["a"]
    assert result.tokens == 28
    result = view(state, budget=27)
    assert ids(result.state) == ["c"]  # "b" no longer fits next to "c" and the summary
    assert result.state.summary == "sum"
    assert list(result.dropped) == ["a", "b"]
    assert result.tokens == 8


def test_the_summary_is_never_dropped() -> None:
    view = cf.ContextView(
        Sized, count=by_size, count_summary=summary_size, strategies=[cf.drop_oldest()]
    )
    state = state_of(("a", "user", 1), summary="a long summary")
    result = view(state, budget=3)
    assert result.state.summary == "a long summary" and ids(result.state) == []
    assert result.over_budget and result.tokens == len("a long summary")


def test_drop_oldest_with_from_newest_keeps_the_current_turn() -> None:
    view = cf.ContextView(
        Sized, count=by_size, strategies=[cf.drop_oldest(keep_from=cf.from_newest(Sized, "user"))]
    )
    state = state_of(
        ("u1", "user", 10),
        ("s1", "step", 10),
        ("a1", "answer", 10),
        ("u2", "user", 10),
        ("s2", "step", 30),
        ("s3", "step", 30),
    )
    result = view(state, budget=85)
    assert ids(result.state) == ["a1", "u2", "s2", "s3"]
    # The current turn alone is over budget: it stays whole, over budget.
    tight = view(state, budget=20)
    assert ids(tight.state) == ["u2", "s2", "s3"]
    assert tight.over_budget and tight.tokens == 70 and list(tight.dropped) == ["u1", "s1", "a1"]


def test_from_newest_without_that_kind_keeps_everything() -> None:
    keep_from = cf.from_newest(Sized, "user")
    state = state_of(("s1", "step", 10), ("s2", "step", 10))
    assert keep_from(state.segments) == 0
    view = cf.ContextView(Sized, count=by_size, strategies=[cf.drop_oldest(keep_from=keep_from)])
    result = view(state, budget=5)
    assert ids(result.state) == ["s1", "s2"] and result.over_budget


def test_from_newest_needs_a_tag() -> None:
    untagged = cf.SegmentedFold("untagged", data=str, tag=None)
    with pytest.raises(TypeError):
        cf.from_newest(untagged, "user")


def test_newest_keeps_the_newest_segments() -> None:
    state = state_of(*[(f"s{i}", "step", 10) for i in range(5)])
    assert cf.newest()(state.segments) == 4
    assert cf.newest(2)(state.segments) == 3
    assert cf.newest(0)(state.segments) == 5
    assert cf.newest(9)(state.segments) == 0
    view = cf.ContextView(Sized, count=by_size, strategies=[cf.drop_oldest(keep_from=cf.newest(2))])
    assert ids(view(state, budget=1).state) == ["s3", "s4"]
    with pytest.raises(ValueError):
        cf.newest(-1)


def test_keep_from_must_return_an_index_of_the_segments() -> None:
    state = state_of(("a", "user", 10), ("b", "step", 10))
    for bad in (-1, 3, 1.0, "1"):
        view = cf.ContextView(
            Sized,
            count=by_size,
            # 1.0 and "1" are not ints on purpose: the view must refuse them at run time
            strategies=[cf.drop_oldest(keep_from=lambda segments, bad=bad: bad)],  # type: ignore[misc]
        )
        with pytest.raises(ValueError, match="keep_from"):
            view(state, budget=1)


def test_elide_then_drop_oldest() -> None:
    view = cf.ContextView(
        Sized,
        count=by_size,
        strategies=[
            cf.elide(keep_newest=1, map=halve),
            cf.drop_oldest(keep_from=cf.from_newest(Sized, "user")),
        ],
    )
    state = state_of(("u1", "user", 10), ("s1", "step", 20), ("u2", "user", 20), ("s2", "step", 40))
    # Elided: 5 + 10 + 10 + 40 = 65; fits in 70 without dropping.
    elided = view(state, budget=70)
    assert ids(elided.state) == ["u1", "s1", "u2", "s2"] and elided.tokens == 65
    assert not elided.over_budget and elided.fits  # nothing dropped
    dropped = view(state, budget=55)
    assert ids(dropped.state) == ["u2", "s2"] and dropped.tokens == 50
    assert list(dropped.dropped) == ["u1", "s1"] and not dropped.fits


# -- custom strategies -------------------------------------------------------------------------


def test_a_custom_plain_function_strategy() -> None:
    seen: list[cf.StrategyContext] = []

    def keep_newest_two(state: State, ctx: cf.StrategyContext) -> State:
        seen.append(ctx)
        if len(state.segments) <= 2:
            return state
        return cf.SegmentedState(list(state.segments)[-2:], state.summary)

    view = cf.ContextView(Sized, count=by_size, strategies=[keep_newest_two])
    state = state_of(("a", "user", 10), ("b", "step", 10), ("c", "step", 10), summary="s")
    result = view(state, budget=25)
    assert ids(result.state) == ["b", "c"] and result.state.summary == "s"
    assert list(result.dropped) == ["a"]
    assert (result.tokens, result.over_budget) == (20 + cf.approx_tokens("s"), False)
    assert seen[0].budget == 25 and seen[0].tokens == 30 + cf.approx_tokens("s")
    assert seen[0].count(state.segments[0]) == 10

    # After a built-in strategy dropped segments, a custom one still reports all drops.
    combined = cf.ContextView(
        Sized, count=by_size, strategies=[cf.drop_oldest(keep_from=cf.newest(3)), keep_newest_two]
    )
    four = state_of(("a", "user", 10), ("b", "step", 10), ("c", "step", 10), ("d", "step", 10))
    result = combined(four, budget=15)
    assert ids(result.state) == ["c", "d"] and sorted(result.dropped) == ["a", "b"]


def test_a_custom_strategy_must_return_a_segmented_state() -> None:
    view = cf.ContextView(
        Sized, count=by_size, strategies=[lambda state, ctx: list(state.segments)]
    )
    with pytest.raises(TypeError):
        view(state_of(("a", "user", 10), ("b", "step", 10)), budget=1)


# -- plain folds -------------------------------------------------------------------------------


def test_a_view_of_a_plain_fold_needs_measure() -> None:
    plain: cf.Fold[tuple[str, ...]] = cf.Fold("turns", initial=tuple)
    with pytest.raises(TypeError, match="measure"):
        cf.ContextView(plain)
    with pytest.raises(TypeError):
        cf.ContextView(Sized, measure=len)  # a segmented view counts segments
    with pytest.raises(TypeError):
        cf.ContextView("not a fold")  # type: ignore[arg-type]

    def keep_last(state: tuple[str, ...], ctx: cf.StrategyContext) -> tuple[str, ...]:
        return state[-1:]

    view = cf.ContextView(plain, measure=lambda s: sum(len(t) for t in s), strategies=[keep_last])
    turns = ("hello", "world", "!")
    within = view(turns, budget=100)
    assert (within.state, within.tokens, within.over_budget, within.fits) == (
        turns,
        11,
        False,
        True,
    )
    trimmed = view(turns, budget=5)
    assert trimmed.state == ("!",) and trimmed.tokens == 1
    assert list(trimmed.dropped) == [] and trimmed.fits is True
    over = cf.ContextView(plain, measure=lambda s: sum(len(t) for t in s))(turns, budget=5)
    assert over.over_budget and over.fits is False and list(over.dropped) == []
    with pytest.raises(TypeError):
        view.split(turns, keep_tokens=1)  # type: ignore[arg-type]


def test_a_view_is_named_after_its_fold() -> None:
    view = cf.ContextView(Sized)
    assert view.fold is Sized
    assert view.__name__ == "sizedView"


# -- split -------------------------------------------------------------------------------------


def test_split_keeps_a_run_of_the_newest_segments_that_fit() -> None:
    view = cf.ContextView(Sized, count=by_size, count_summary=summary_size)
    state = state_of(
        ("a", "user", 5),
        ("b", "step", 50),
        ("c", "step", 5),
        ("d", "step", 5),
        ("e", "step", 5),
        summary="x" * 100,
    )
    cut = view.split(state, keep_tokens=12)
    assert [s.id for s in cut.kept] == ["d", "e"]  # the summary does not count
    assert [s.id for s in cut.older] == ["a", "b", "c"]

    # It stops at the first segment that does not fit, even if older ones would.
    cut = view.split(state, keep_tokens=20)
    assert [s.id for s in cut.kept] == ["c", "d", "e"]
    assert [s.id for s in cut.older] == ["a", "b"]

    assert [s.id for s in view.split(state, keep_tokens=math.inf).kept] == ["a", "b", "c", "d", "e"]
    assert [s.id for s in view.split(state, keep_tokens=0).kept] == []


def test_split_keep_from_is_always_kept() -> None:
    view = cf.ContextView(Sized, count=by_size)
    state = state_of(("a", "user", 5), ("b", "step", 50), ("c", "step", 500))
    cut = view.split(state, keep_tokens=10, keep_from=cf.newest())
    assert [s.id for s in cut.kept] == ["c"] and [s.id for s in cut.older] == ["a", "b"]
    cut = view.split(state, keep_tokens=0, keep_from=cf.newest(2))
    assert [s.id for s in cut.kept] == ["b", "c"] and [s.id for s in cut.older] == ["a"]
    cut = view.split(state, keep_tokens=600, keep_from=cf.newest())
    assert [s.id for s in cut.kept] == ["a", "b", "c"] and list(cut.older) == []


def test_split_never_cuts_a_segment_and_keeps_order() -> None:
    view = cf.ContextView(Sized, count=by_size)
    state = state_of(*[(f"s{i}", "step", i + 1) for i in range(10)])
    for keep in (0, 1, 9, 10, 11, 30, 54, 55, 1000):
        cut = view.split(state, keep_tokens=keep)
        assert [*cut.older, *cut.kept] == list(state.segments)
        assert sum(by_size(s) for s in cut.kept) <= keep


@pytest.mark.parametrize("bad", [-1, math.nan, True, "1", None])
def test_split_checks_keep_tokens(bad: object) -> None:
    view = cf.ContextView(Sized, count=by_size)
    with pytest.raises(ValueError):
        view.split(state_of(("a", "user", 1)), keep_tokens=bad)  # type: ignore[arg-type]
