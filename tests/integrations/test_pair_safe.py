"""The pair-safe window every integration trims with: the newest whole units that fit, the
newest ``keep`` whatever they cost, read no further than one unit past the window; starts
found from links never part a tool call from its result."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.errors import InvalidInputError
from contextfold.integrations._pair_safe import (
    checked_counter,
    costed,
    link_of,
    newest_fitting,
    pair_safe_starts,
)

_budgets = st.one_of(st.integers(0, 200), st.just(math.inf))


def _read(units: list[tuple[str, int]], seen: list[str]) -> Iterator[tuple[str, int]]:
    for unit in units:
        seen.append(unit[0])
        yield unit


@given(
    costs=st.lists(st.integers(0, 40), max_size=12),
    base=st.integers(0, 30),
    budget=_budgets,
    keep=st.integers(0, 4),
)
def test_the_window_is_the_longest_newest_run_that_fits_beyond_the_kept_ones(
    costs: list[int], base: int, budget: float, keep: int
) -> None:
    units = [(f"u{i}", cost) for i, cost in enumerate(costs)]  # newest first
    seen: list[str] = []
    views = costed(_read(units, seen), cost=lambda unit: unit[1], base=base)
    kept, tokens = newest_fitting(views, budget=budget, keep=keep, empty=base)

    def window(n: int) -> int:  # the tokens of the window of the n newest units
        return base + sum(costs[:n])

    n = len(kept)
    assert kept == units[:n]  # whole units, the newest, in order
    assert tokens == window(n)
    assert n >= min(keep, len(units))
    # Beyond the forced ones, every kept window fits, and the next unit would not.
    assert all(window(m) <= budget for m in range(keep + 1, n + 1))
    if n < len(units):
        assert n < keep or window(n + 1) > budget
        assert len(seen) == n + 1  # read one unit past the window, no further
    if tokens > budget:
        assert n <= keep  # over budget only with what is kept whatever it costs


@dataclass(frozen=True)
class _Item:
    calls: frozenset[str]
    answers: frozenset[str]
    tokens: int
    may_start: bool


_ids = st.sampled_from(["a", "b", "c"])  # few ids: calls are made and answered again
_items = st.lists(
    st.builds(
        _Item,
        calls=st.frozensets(_ids, max_size=2),
        answers=st.frozensets(_ids, max_size=2),
        tokens=st.integers(0, 30),
        may_start=st.booleans(),
    ),
    max_size=14,
)


def _links(items: list[_Item]) -> list[int]:
    latest: dict[str, int] = {}
    found = []
    for index, item in enumerate(items):
        found.append(link_of(index, item.answers, latest))
        latest.update(dict.fromkeys(item.calls, index))
    return found


def _pairs(items: list[_Item]) -> list[tuple[int, int]]:
    """Every (call, result) pair of indexes, by brute force: a result answers the latest
    earlier item making its call."""
    pairs = []
    for j, item in enumerate(items):
        for answer in item.answers:
            made = [i for i in range(j) if answer in items[i].calls]
            if made:
                pairs.append((made[-1], j))
    return pairs


@given(items=_items, lowest=st.integers(-2, 16))
def test_starts_are_exactly_the_cuts_that_part_no_call_from_its_result(
    items: list[_Item], lowest: int
) -> None:
    links = _links(items)
    pairs = _pairs(items)
    starts = list(
        pair_safe_starts(
            len(items),
            link=links.__getitem__,
            tokens=lambda i: items[i].tokens,
            may_start=lambda i: items[i].may_start,
            lowest=lowest,
        )
    )
    expected = [
        cut
        for cut in range(len(items) - 1, max(lowest, 0) - 1, -1)
        if not any(call < cut <= result for call, result in pairs)
        and (cut == 0 or items[cut].may_start)
    ]
    assert [cut for cut, _ in starts] == expected
    assert all(tokens == sum(item.tokens for item in items[cut:]) for cut, tokens in starts)


@given(items=_items, budget=_budgets)
def test_a_trimmed_window_keeps_every_call_with_its_results_within_the_budget(
    items: list[_Item], budget: float
) -> None:
    links = _links(items)
    starts = list(
        pair_safe_starts(len(items), link=links.__getitem__, tokens=lambda i: items[i].tokens)
    )
    kept, tokens = newest_fitting(iter(starts), budget=budget, keep=1)
    start = kept[-1] if kept else len(items)
    window = range(start, len(items))
    for call, result in _pairs(items):
        assert (call in window) == (result in window), (call, result, start)
    assert tokens == sum(item.tokens for item in items[start:])
    if tokens > budget:  # only when the newest unit alone does not fit
        assert kept == [starts[0][0]]
    if len(kept) < len(starts):
        assert starts[len(kept)][1] > budget  # the next whole unit would not fit


def test_a_counter_is_checked_on_every_answer_naming_the_item() -> None:
    def default(item: str) -> float:
        return 1.0

    assert checked_counter(None, default=default, what=str) is default
    with pytest.raises(InvalidInputError, match="count_tokens must be a function"):
        checked_counter(3, default=default, what=str)  # type: ignore[arg-type]
    answers: dict[str, object] = {"ok": 2, "neg": -1, "nan": math.nan, "yes": True, "txt": "1"}
    count = checked_counter(answers.__getitem__, default=default, what=lambda i: f"item {i}")
    assert count("ok") == 2.0 and type(count("ok")) is float
    for bad in ("neg", "nan", "yes", "txt"):
        with pytest.raises(InvalidInputError, match=f"returned .* for item {bad}: it must"):
            count(bad)
