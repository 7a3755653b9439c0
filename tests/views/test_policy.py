"""Compaction by a view's policy (journal.compact) and chunks_of."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

import contextfold as cf
from contextfold.store.sqlite import SQLiteStore


class Opened(cf.Event, type="pol/opened"):
    id: str
    kind: str = "step"
    size: int


Sized = cf.SegmentedFold("polsized", data=dict[str, Any], summary=str, tag="kind")


@Sized.open(Opened)
def _opened(ev: cf.Envelope[Opened]) -> cf.Segment[dict[str, Any]]:
    return cf.Segment(ev.payload.id, {"kind": ev.payload.kind, "size": ev.payload.size})


NoSummary = cf.SegmentedFold("polnosummary", data=dict[str, Any], tag="kind")
NoSummary.open(Opened)(lambda ev: cf.Segment(ev.payload.id, {"kind": "step", "size": 1}))


def by_size(segment: cf.Segment[dict[str, Any]]) -> int:
    return int(segment.data["size"])


VIEW = cf.ContextView(
    Sized,
    count=by_size,
    count_summary=lambda summary: 2,
    strategies=[cf.drop_oldest(keep_from=cf.newest())],
)


class Summarizer:
    """Records its calls; the summary names the segments it replaced."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self,
        *,
        summary: str | None,
        older: Sequence[cf.Segment[Any]],
        kept: Sequence[cf.Segment[Any]],
    ) -> str:
        self.calls.append(
            {"summary": summary, "older": [s.id for s in older], "kept": [s.id for s in kept]}
        )
        return f"{summary or ''}[{','.join(s.id for s in older)}]"


@pytest.fixture(params=["memory", "sqlite"])
async def journal(request: pytest.FixtureRequest, sqlite_path: str) -> AsyncIterator[cf.Journal]:
    j = (
        cf.open_journal("memory://")
        if request.param == "memory"
        else cf.Journal(SQLiteStore(sqlite_path))
    )
    try:
        yield j
    finally:
        await j.close()


async def opened(journal: cf.Journal, *sizes: tuple[str, int]) -> None:
    await journal.append("s", [Opened(id=sid, size=size) for sid, size in sizes])


async def policy(
    journal: cf.Journal, summarize: Any, budget: float = 30, keep_tokens: float = 15
) -> cf.CompactionResult:
    result = await journal.compact(
        Sized,
        "s",
        view=VIEW,
        budget=budget,
        keep_tokens=keep_tokens,
        keep_from=cf.newest(),
        summarize=summarize,
    )
    assert isinstance(result, cf.CompactionResult)
    return result


async def test_it_does_not_compact_when_the_view_fits(journal: cf.Journal) -> None:
    await opened(journal, ("a", 10), ("b", 10))
    summarize = Summarizer()
    result = await policy(journal, summarize)
    assert (result.compacted, result.summarized) == (False, 0)
    assert result.state == await journal.fold(Sized, "s")
    assert summarize.calls == [] and await journal.version("s") == 2


async def test_it_compacts_when_the_view_does_not_fit_and_split_leaves_older(
    journal: cf.Journal,
) -> None:
    await opened(journal, ("a", 10), ("b", 10), ("c", 8), ("d", 6))
    summarize = Summarizer()
    result = await policy(journal, summarize)  # 34 > 30: the view drops "a"
    assert (result.compacted, result.summarized) == (True, 2)
    assert summarize.calls == [{"summary": None, "older": ["a", "b"], "kept": ["c", "d"]}]
    assert result.state.summary == "[a,b]"
    assert [s.id for s in result.state.segments] == ["c", "d"]
    assert result.state == await journal.fold(Sized, "s")
    assert result.state == await cf.Journal(journal.store).fold(Sized, "s")
    assert VIEW(result.state, budget=30).fits
    compacted, state, summarized = (
        result  # unpacks like the seed's { compacted, state, summarized }
    )
    assert (compacted, state, summarized) == (True, result.state, 2)

    # The next call fits again and does not compact.
    again = await policy(journal, summarize)
    assert again.compacted is False and len(summarize.calls) == 1

    # Later, the earlier summary is summarized again together with older segments.
    await opened(journal, ("e", 10), ("f", 10))
    result = await policy(journal, summarize)
    assert result.compacted
    assert summarize.calls[-1] == {"summary": "[a,b]", "older": ["c", "d", "e"], "kept": ["f"]}
    assert result.state.summary == "[a,b][c,d,e]"


async def test_it_compacts_when_the_view_is_over_budget_without_dropping(
    journal: cf.Journal,
) -> None:
    measuring = cf.ContextView(Sized, count=by_size)  # no strategies: only measures
    await opened(journal, ("a", 20), ("b", 20))
    result = await journal.compact(
        Sized,
        "s",
        view=measuring,
        budget=30,
        keep_tokens=15,
        keep_from=cf.newest(),
        summarize=Summarizer(),
    )
    assert result.compacted and [s.id for s in result.state.segments] == ["b"]


async def test_it_never_compacts_when_only_the_newest_segment_is_over_budget(
    journal: cf.Journal,
) -> None:
    summarize = Summarizer()
    await opened(journal, ("huge", 100))
    result = await policy(journal, summarize)
    assert (result.compacted, result.summarized) == (False, 0)

    # After a compaction left a summary and one huge segment, it does not compact again
    # (that would only summarize the summary, on every step).
    await opened(journal, ("a", 5), ("huger", 200))
    first = await policy(journal, summarize)
    assert first.compacted and [s.id for s in first.state.segments] == ["huger"]
    version = await journal.version("s")
    for _ in range(3):
        result = await policy(journal, summarize)
        assert result.compacted is False and not VIEW(result.state, budget=30).fits
    assert len(summarize.calls) == 1 and await journal.version("s") == version


async def test_events_appended_while_summarize_runs_are_folded_on_top(journal: cf.Journal) -> None:
    await opened(journal, ("a", 10), ("b", 10), ("c", 10), ("d", 10))

    async def summarize(*, summary: str | None, older: Sequence[Any], kept: Sequence[Any]) -> str:
        await opened(journal, ("late", 3))
        return "summary"

    result = await policy(journal, summarize)
    assert result.compacted
    assert [s.id for s in result.state.segments] == ["d", "late"]
    assert result.state == await cf.Journal(journal.store).fold(Sized, "s")


async def test_summarize_failures_publish_nothing(journal: cf.Journal) -> None:
    await opened(journal, ("a", 20), ("b", 20))

    def broken(**kwargs: Any) -> str:
        raise RuntimeError("no model")

    with pytest.raises(cf.CompactionError) as caught:
        await policy(journal, broken)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert caught.value.reason == "summarize-failed"

    with pytest.raises(cf.CompactionError) as caught:
        await policy(journal, lambda **kwargs: 42)  # not a str: the summary schema rejects it
    assert caught.value.reason == "invalid-state"
    assert await journal.version("s") == 2


async def test_invalid_policy_options(journal: cf.Journal) -> None:
    await opened(journal, ("a", 20), ("b", 20))
    other_view = cf.ContextView(NoSummary)
    kwargs: dict[str, Any] = {"budget": 30, "keep_tokens": 15, "summarize": Summarizer()}
    with pytest.raises(cf.InvalidInputError, match="view must be a ContextView of fold polsized"):
        await journal.compact(Sized, "s", view=other_view, **kwargs)
    # Wrong types on purpose (a str for a callable, "30" for a number): refused at run time.
    with pytest.raises(cf.InvalidInputError, match="summarize must be a function"):
        await journal.compact(Sized, "s", view=VIEW, budget=30, summarize="not callable")  # type: ignore[arg-type]
    for bad in (0, -1, math.nan, "30"):
        with pytest.raises(ValueError):
            await journal.compact(Sized, "s", view=VIEW, budget=bad, summarize=Summarizer())  # type: ignore[arg-type]
        if bad != 0:
            with pytest.raises(ValueError):
                await journal.compact(
                    Sized,
                    "s",
                    view=VIEW,
                    budget=30,
                    keep_tokens=bad,  # type: ignore[arg-type]
                    summarize=Summarizer(),
                )
    with pytest.raises(cf.CompactionError, match="no summary schema") as caught:
        await journal.compact(NoSummary, "s", view=other_view, **kwargs)
    assert caught.value.reason == "unsupported"
    plain: cf.Fold[int] = cf.Fold("polplain", initial=lambda: 0)
    plain.on(Opened)(lambda n, ev: n + 1)
    with pytest.raises(cf.CompactionError, match="not a SegmentedFold") as caught:
        await journal.compact(plain, "s", view=VIEW, **kwargs)  # type: ignore[arg-type]
    assert caught.value.reason == "unsupported"
    assert await journal.version("s") == 2


# -- chunks_of ---------------------------------------------------------------------------------


def segs(*sizes: int) -> list[cf.Segment[dict[str, Any]]]:
    return [cf.Segment(f"s{i}", {"kind": "step", "size": size}) for i, size in enumerate(sizes)]


def sizes_of(chunks: list[list[cf.Segment[dict[str, Any]]]]) -> list[list[int]]:
    return [[by_size(s) for s in chunk] for chunk in chunks]


def test_chunks_of_cuts_consecutive_runs_of_at_most_a_budget() -> None:
    segments = segs(3, 4, 2, 9, 1, 1, 20, 5)
    chunks = cf.chunks_of(segments, 10, count=by_size)
    assert sizes_of(chunks) == [[3, 4, 2], [9, 1], [1], [20], [5]]
    assert [s for chunk in chunks for s in chunk] == segments
    assert cf.chunks_of([], 10, count=by_size) == []
    assert sizes_of(cf.chunks_of(segments, math.inf, count=by_size)) == [[3, 4, 2, 9, 1, 1, 20, 5]]
    assert sizes_of(cf.chunks_of(segs(5, 5), 10, count=by_size)) == [[5, 5]]


def test_chunks_of_counts_with_the_views_counter() -> None:
    counted: list[str] = []

    def counter(segment: cf.Segment[Any]) -> int:
        counted.append(segment.id)
        return by_size(segment)

    view = cf.ContextView(Sized, count=counter)
    segments = segs(3, 4, 5)
    view(cf.SegmentedState(segments), budget=100)
    assert sizes_of(cf.chunks_of(segments, 8, count=view.count)) == [[3, 4], [5]]
    assert counted == ["s2", "s1", "s0"]  # counted once, by the view's call


@pytest.mark.parametrize("bad", [0, -1, math.nan, True, "5"])
def test_chunks_of_checks_its_budget(bad: object) -> None:
    with pytest.raises(ValueError):
        cf.chunks_of(segs(1), bad, count=by_size)  # type: ignore[arg-type]
