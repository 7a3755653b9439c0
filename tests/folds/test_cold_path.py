"""The cold read's page folding: ``fold_stored`` equals decoding and applying event by event
(skips included), the collector's older generations wait over the whole catch-up (reads
running together share one such spell), and a tampered row in a real SQLite file is left
out and reported by stream and position, never folded as wrong state."""

from __future__ import annotations

import asyncio
import gc
import sqlite3
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

import contextfold as cf
from contextfold import canonical
from contextfold.errors import CorruptEventError
from contextfold.events import EventMeta, NewEvent, StoredEvent
from contextfold.folds.fold import FoldBase
from contextfold.folds.reader import _Collector
from contextfold.store.memory import MemoryStore


class Opened(cf.Event, type="coldpath/opened"):
    id: str


class Added(cf.Event, type="coldpath/added"):
    id: str
    value: int


class Counted(cf.Event, type="coldpath/counted"):
    n: int


class Dropped(cf.Event, type="coldpath/dropped"):
    """Drops the oldest segment: a whole-state handler between opens and attaches."""


class Item(BaseModel):
    model_config = ConfigDict(frozen=True)
    values: tuple[int, ...] = ()
    run: str | None = None


SEGMENTED = cf.SegmentedFold("coldpath_segments", data=Item, tag=None)


@SEGMENTED.open(Opened)
def _opened(ev: cf.Envelope[Opened]) -> cf.Segment[Item]:
    return cf.Segment(ev.payload.id, Item(run=ev.meta.run_id))


@SEGMENTED.attach(Added, to=lambda ev: ev.payload.id, on_missing="report")
def _added(item: Item, ev: cf.Envelope[Added]) -> Item:
    return item.model_copy(update={"values": (*item.values, ev.payload.value)})


@SEGMENTED.on(Dropped)
def _dropped(state: cf.SegmentedState[Item, Any], ev: cf.Envelope[Dropped]) -> Any:
    return cf.SegmentedState(state.segments[1:], state.summary)


COUNTS: cf.Fold[tuple[tuple[int, int, str], ...]] = cf.Fold(
    "coldpath_counts", state=tuple[tuple[int, int, str], ...], initial=tuple
)


@COUNTS.on(Counted)
def _counted(
    state: tuple[tuple[int, int, str], ...], ev: cf.Envelope[Counted]
) -> tuple[tuple[int, int, str], ...]:
    return (*state, (ev.payload.n, ev.position, ev.meta.event_id))


CHECKPOINT = "coldpath/checkpoint"

# What a stored row may hold: a valid event of each kind, one the folds do not read, bytes
# that are not JSON, JSON that the event's schema refuses, and a stop marker.
_ROW = st.one_of(
    st.builds(lambda i: ("coldpath/opened", {"id": f"s{i}"}), st.integers(0, 3)),
    st.builds(
        lambda i, v: ("coldpath/added", {"id": f"s{i}", "value": v}),
        st.integers(0, 4),
        st.integers(-5, 5),
    ),
    st.builds(lambda n: ("coldpath/counted", {"n": n}), st.integers(0, 9)),
    st.just(("coldpath/dropped", {})),
    st.just(("coldpath/unread", {"x": 1})),
    st.just(("coldpath/counted", b"{not json")),
    st.just(("coldpath/added", {"id": 3})),
    st.just((CHECKPOINT, {})),
)


def _stored(rows: Sequence[tuple[str, Any]], runs: Sequence[str | None]) -> list[StoredEvent]:
    events = []
    for position, ((kind, payload), run) in enumerate(zip(rows, runs, strict=True), 1):
        data = payload if isinstance(payload, bytes) else canonical.dumps(payload)
        meta = EventMeta(f"ev-{position}", "2026-01-01T00:00:00+00:00", run, None, None, ("c",))
        events.append(
            StoredEvent.appended("ns", "s", position + 100, position, NewEvent(kind, data, meta))
        )
    return events


def _each(
    fold: FoldBase[Any], state: Any, events: Sequence[StoredEvent], run_id: str | None
) -> tuple[Any, int, list[tuple[str, int]]]:
    """The reference: decode, then apply_reporting, event by event, up to a checkpoint."""
    skipped: list[tuple[str, int]] = []
    for index, event in enumerate(events):
        if event.type == CHECKPOINT:
            return state, index, skipped
        if fold.scope == "run" and event.meta.run_id != run_id:
            continue
        try:
            envelope = fold.decode(event)
        except ValueError:
            skipped.append(("decode", event.position))
            continue
        if envelope is None:
            continue
        state, problem = fold.apply_reporting(state, envelope)
        if problem is not None:
            skipped.append((problem, event.position))
    return state, len(events), skipped


def _model(events: Sequence[StoredEvent]) -> list[tuple[str, tuple[int, ...], str | None]]:
    """What SEGMENTED folds, written out: an attach reaches the newest segment of its id."""
    segments: list[tuple[str, tuple[int, ...], str | None]] = []
    for event in events:
        if event.type == CHECKPOINT:
            break
        try:
            payload = event.payload
        except CorruptEventError:
            continue
        if event.type == "coldpath/opened":
            segments.append((payload["id"], (), event.meta.run_id))
        elif event.type == "coldpath/added" and isinstance(payload["id"], str):
            for index in range(len(segments) - 1, -1, -1):
                if segments[index][0] == payload["id"]:
                    sid, values, run = segments[index]
                    segments[index] = (sid, (*values, payload["value"]), run)
                    break
        elif event.type == "coldpath/dropped":
            segments = segments[1:]
    return segments


@settings(max_examples=150, deadline=None)
@given(
    rows=st.lists(_ROW, max_size=40),
    runs=st.lists(st.sampled_from([None, "r1", "r2"]), min_size=40, max_size=40),
    start=st.integers(0, 5),
)
def test_fold_stored_equals_decoding_and_applying_each_event(
    rows: list[tuple[str, Any]], runs: list[str | None], start: int
) -> None:
    events = _stored(rows, runs[: len(rows)])
    start = min(start, len(events))
    folds: tuple[FoldBase[Any], ...] = (SEGMENTED, COUNTS)
    for fold in folds:
        expected, stop_at, expected_skips = _each(fold, fold.initial_state(), events[start:], None)
        skips: list[tuple[str, int]] = []

        def skip(reason: str, event: StoredEvent, detail: str, skips: list[Any] = skips) -> None:
            skips.append((reason, event.position))

        state, index, _ = fold.fold_stored(
            fold.initial_state(), events, start, stop=CHECKPOINT, skip=skip
        )
        assert index == start + stop_at
        assert state == expected
        assert skips == expected_skips
        if isinstance(state, cf.SegmentedState):
            folded = [(s.id, s.data.values, s.data.run) for s in state.segments]
            assert folded == _model(events[start:])


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(_ROW, max_size=30),
    runs=st.lists(st.sampled_from([None, "r1", "r2"]), min_size=30, max_size=30),
)
def test_a_run_scoped_fold_folds_only_its_runs_events(
    rows: list[tuple[str, Any]], runs: list[str | None]
) -> None:
    fold: cf.Fold[tuple[tuple[int, int, str], ...]] = cf.Fold(
        "coldpath_run_counts", state=tuple[tuple[int, int, str], ...], initial=tuple, scope="run"
    )
    fold.on(Counted)(_counted)
    events = [e for e in _stored(rows, runs[: len(rows)]) if e.type != CHECKPOINT]
    expected, _, expected_skips = _each(fold, (), events, "r1")
    skips: list[tuple[str, int]] = []
    state, index, folded = fold.fold_stored(
        (),
        events,
        run_id="r1",
        run_scoped=True,
        skip=lambda reason, event, detail: skips.append((reason, event.position)),
    )
    assert (state, index, skips) == (expected, len(events), expected_skips)
    assert folded == len(state)


def test_a_fold_that_overrides_apply_reporting_is_read_through_it() -> None:
    seen: list[int] = []

    class Watching(cf.Fold[tuple[int, ...]]):
        def apply_reporting(
            self, state: tuple[int, ...], envelope: cf.Envelope[Any]
        ) -> tuple[tuple[int, ...], str | None]:
            seen.append(envelope.position)
            return super().apply_reporting(state, envelope)

    fold = Watching("coldpath_watching", state=tuple[int, ...], initial=tuple)

    @fold.on(Counted)
    def _count(state: tuple[int, ...], ev: cf.Envelope[Counted]) -> tuple[int, ...]:
        return (*state, ev.payload.n)

    events = _stored([("coldpath/counted", {"n": 4}), ("coldpath/counted", {"n": 5})], [None] * 2)
    state, _, folded = fold.fold_stored((), events, skip=lambda *_: None)
    assert (state, folded, seen) == ((4, 5), 2, [1, 2])


async def test_a_read_of_many_pages_settles_its_state_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("contextfold.folds.reader.PAGE", 4)
    fold = cf.SegmentedFold("coldpath_pages", data=Item, tag=None)
    fold.open(Opened)(_opened)
    fold.attach(Added, to=lambda ev: ev.payload.id, on_missing="report")(_added)
    settled: list[int] = []
    original = fold._settled

    def spy(work: Any) -> cf.SegmentedState[Any, Any]:
        state = original(work)
        settled.append(len(state))
        return state

    monkeypatch.setattr(fold, "_settled", spy)
    journal = cf.open_journal("memory://")
    try:
        await journal.append("s", [Opened(id=f"s{i}") for i in range(9)])
        await journal.append("s", [Added(id=f"s{i}", value=i) for i in range(9)])
        state = await journal.fold(fold, "s")
        assert [(s.id, s.data.values) for s in state.segments] == [
            (f"s{i}", (i,)) for i in range(9)
        ]
        assert settled == [9]  # five pages, one state
    finally:
        await journal.close()


# -- the collector -------------------------------------------------------------------------------

THRESHOLDS = gc.get_threshold()


def _waiting() -> bool:
    """Whether the collector is held to its youngest generation (as a read holds it)."""
    return gc.get_threshold() == (THRESHOLDS[0], 2**31 - 1, 2**31 - 1)


class _GatedStore(MemoryStore):
    """A memory store whose reads record whether the older generations wait, and whose reads of
    ``gated`` streams wait until ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.collector: list[tuple[str, bool]] = []
        self.gate = asyncio.Event()
        self.gated: set[str] = set()
        self.waiting = asyncio.Event()

    async def read(self, namespace: str, stream: str, **kwargs: Any) -> cf.ReadResult:
        self.collector.append((stream, _waiting()))
        if stream in self.gated and kwargs.get("after") is not None:
            self.waiting.set()
            await self.gate.wait()
        return await super().read(namespace, stream, **kwargs)


async def test_the_older_generations_wait_over_every_page_and_store_read_of_a_cold_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("contextfold.folds.reader.PAGE", 3)
    store = _GatedStore()
    journal = cf.Journal(store)
    try:
        await journal.append("s", [Counted(n=i) for i in range(10)])
        assert not _waiting()
        state = await journal.fold(COUNTS, "s")
        assert [n for n, _, _ in state] == list(range(10))
        pages = [waiting for stream, waiting in store.collector if stream == "s"]
        assert len(pages) >= 4 and all(pages)  # every page read without older generations
        assert not _waiting() and gc.get_threshold() == THRESHOLDS
    finally:
        await journal.close()


async def test_a_journal_told_to_leave_the_collector_alone_reads_with_it_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("contextfold.folds.reader.PAGE", 3)
    store = _GatedStore()
    journal = cf.Journal(store, young_collections=False)
    try:
        await journal.append("s", [Counted(n=i) for i in range(10)])
        state = await journal.fold(COUNTS, "s")
        assert [n for n, _, _ in state] == list(range(10))
        pages = [waiting for stream, waiting in store.collector if stream == "s"]
        assert len(pages) >= 4 and not any(pages)  # the thresholds as the host set them
        assert gc.get_threshold() == THRESHOLDS
    finally:
        await journal.close()


async def test_concurrent_cold_reads_share_one_pause_that_ends_with_the_last() -> None:
    store = _GatedStore()
    store.gated.add("slow")
    journal = cf.Journal(store)
    try:
        await journal.append("slow", [Counted(n=i) for i in range(3)])
        await journal.append("fast", [Counted(n=i) for i in range(3)])
        await journal.fold(COUNTS, "slow")  # cached: the next read of it is a catch-up
        await journal.append("slow", Counted(n=3))
        journal.folds.cache.drop(lambda key: key[1] == "fast")
        slow = asyncio.create_task(journal.fold(COUNTS, "slow"))
        await store.waiting.wait()  # the slow read holds the pause, waiting on the store
        assert _waiting()
        fast = await journal.fold(COUNTS, "fast")
        assert len(fast) == 3
        assert _waiting()  # the fast read ended, the slow one still folds
        store.gate.set()
        slow_state = await slow
        assert len(slow_state) == 4
        assert gc.get_threshold() == THRESHOLDS
    finally:
        await journal.close()


async def test_only_young_collections_run_while_a_read_folds() -> None:
    kept: list[list[list[int]]] = []
    generations: list[int] = []
    fold: cf.Fold[int] = cf.Fold("coldpath_allocating", state=int, initial=int)

    @fold.on(Counted)
    def _(state: int, ev: cf.Envelope[Counted]) -> int:
        kept.append([[] for _ in range(500)])  # alive until the read ends: the young fill
        return len(generations)  # collections so far

    def watch(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    journal = cf.open_journal("memory://")
    try:
        await journal.append("s", [Counted(n=i) for i in range(20)])
        gc.callbacks.append(watch)
        try:
            during = await journal.fold(fold, "s")
        finally:
            gc.callbacks.remove(watch)
        assert during > 0  # the young generation was collected while the read folded
        assert set(generations) == {0}
    finally:
        await journal.close()


async def test_thresholds_changed_during_a_read_are_kept() -> None:
    fold: cf.Fold[int] = cf.Fold("coldpath_retunes", state=int, initial=int)

    @fold.on(Counted)
    def _(state: int, ev: cf.Envelope[Counted]) -> int:
        gc.set_threshold(500, 5, 5)  # the application tunes the collector meanwhile
        return state + 1

    journal = cf.open_journal("memory://")
    try:
        await journal.append("s", [Counted(n=1)])
        await journal.fold(fold, "s")
        assert gc.get_threshold() == (500, 5, 5)
    finally:
        gc.set_threshold(*THRESHOLDS)
        await journal.close()


def test_reads_that_keep_overlapping_end_the_spell_after_the_longest() -> None:
    now = [0.0]
    collector = _Collector(clock=lambda: now[0], longest=1.0)
    with ExitStack() as first:
        first.enter_context(collector.young_only())
        assert _waiting()
        with ExitStack() as second:
            second.enter_context(collector.young_only())
            now[0] = 0.5
            first.close()  # within the longest spell: the second read keeps it
            assert _waiting()
            with collector.young_only():  # a third read overlaps the second
                now[0] = 1.5
                second.close()  # past it: the older generations run again
                assert gc.get_threshold() == THRESHOLDS
                with collector.young_only():  # a read joining now starts no spell
                    assert gc.get_threshold() == THRESHOLDS
    assert gc.get_threshold() == THRESHOLDS
    with collector.young_only():  # once no read runs, the next starts one again
        assert _waiting()
    assert gc.get_threshold() == THRESHOLDS


async def test_a_caller_that_disabled_the_collector_keeps_it_disabled() -> None:
    journal = cf.open_journal("memory://")
    gc.disable()
    try:
        await journal.append("s", [Counted(n=1)])
        await journal.fold(COUNTS, "s")
        assert not gc.isenabled()
    finally:
        gc.enable()
        await journal.close()


async def test_a_handler_that_raises_fails_the_read_and_resumes_the_collector() -> None:
    fold: cf.Fold[int] = cf.Fold("coldpath_raises", state=int, initial=int)

    @fold.on(Counted)
    def _(state: int, ev: cf.Envelope[Counted]) -> int:
        if ev.payload.n == 2:
            raise RuntimeError("handler bug")
        return state + 1

    journal = cf.open_journal("memory://")
    try:
        await journal.append("s", [Counted(n=i) for i in range(4)])
        with pytest.raises(RuntimeError, match="handler bug"):
            await journal.fold(fold, "s")
        assert gc.isenabled() and gc.get_threshold() == THRESHOLDS
    finally:
        await journal.close()


# -- tampered rows in a real SQLite file ----------------------------------------------------------


async def test_a_tampered_sqlite_row_is_reported_by_stream_and_position_not_folded(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    journal = cf.open_journal(f"sqlite:///{path}")
    try:
        await journal.append("chat", [Counted(n=i) for i in range(1, 6)])
    finally:
        await journal.close()
    with sqlite3.connect(path) as conn:  # written by something else than this version
        conn.execute("UPDATE cf_events SET data = ? WHERE position = 2", (b'{"n": ',))
        conn.execute("UPDATE cf_events SET data = ? WHERE position = 4", (b'{"n": "four"}',))
    conn.close()

    journal = cf.open_journal(f"sqlite:///{path}")
    try:
        state = await journal.fold(COUNTS, "chat")
        assert [(n, position) for n, position, _ in state] == [(1, 1), (3, 3), (5, 5)]
        reports = [(s.reason, s.stream, s.position) for s in journal.folds.skipped]
        assert reports == [("decode", "chat", 2), ("decode", "chat", 4)]
        page = await journal.read("chat")
        with pytest.raises(CorruptEventError, match=r"stream 'chat' position 2"):
            page.events[1].payload  # noqa: B018
    finally:
        await journal.close()
