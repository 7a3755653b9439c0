"""The fold reader: incremental, bounded cache, single flight, resets, run scope, decoding."""

from __future__ import annotations

import asyncio
import gc
import math
from collections.abc import AsyncIterator

import pytest
from pydantic import BaseModel, ConfigDict

import contextfold as cf
from contextfold.folds.reader import PAGE, FoldReader
from contextfold.store.memory import MemoryStore
from contextfold.store.sqlite import SQLiteStore
from contextfold.testing import RecordingStore


class Said(cf.Event, type="rdr/said"):
    text: str


class Other(cf.Event, type="rdr/other"):
    n: int


class Stepped(cf.Event, type="rdr/stepped"):
    n: int = 0


class Note(cf.Event, type="rdr/note"):
    text: str


def said_fold(name: str = "said", calls: list[str] | None = None) -> cf.Fold[tuple[str, ...]]:
    fold: cf.Fold[tuple[str, ...]] = cf.Fold(name, state=tuple[str, ...], initial=tuple)

    @fold.on(Said)
    def _said(state: tuple[str, ...], ev: cf.Envelope[Said]) -> tuple[str, ...]:
        if calls is not None:
            calls.append(ev.payload.text)
        return (*state, ev.payload.text)

    return fold


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, sqlite_path: str) -> AsyncIterator[RecordingStore]:
    inner: cf.Store = MemoryStore() if request.param == "memory" else SQLiteStore(sqlite_path)
    recording = RecordingStore(inner)
    await recording.open()
    try:
        yield recording
    finally:
        await recording.close()


# -- incremental -------------------------------------------------------------------------------


async def test_a_warm_read_asks_only_for_events_after_its_cursor(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = said_fold()
    first = await journal.append("s", [Said(text="a"), Said(text="b"), Said(text="c")])
    assert await journal.fold(fold, "s") == ("a", "b", "c")
    assert store.reads[0].after is None  # cold: from the start
    assert store.reads[0].types is not None and set(store.reads[0].types) >= {"rdr/said"}

    store.clear()
    writer = cf.Journal(store)  # another writer's appends: this journal's reads catch up
    second = await writer.append("s", Said(text="d"))
    assert await journal.fold(fold, "s") == ("a", "b", "c", "d")
    assert [(r.after, r.returned) for r in store.reads] == [(first.cursor, 1)]
    assert store.of("latest") == ()  # no checkpoint lookup on a warm read

    store.clear()
    assert await journal.fold(fold, "s") == ("a", "b", "c", "d")
    assert [(r.after, r.returned) for r in store.reads] == [(second.cursor, 0)]

    # Events the fold does not read are not asked for at all.
    store.clear()
    await writer.append("s", [Other(n=1), Other(n=2)])
    await journal.fold(fold, "s")
    assert [(r.after, r.returned) for r in store.reads] == [(second.cursor, 0)]
    assert "rdr/other" not in (store.reads[0].types or ())


async def test_a_long_stream_is_read_in_pages(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold: cf.Fold[tuple[int, str]] = cf.Fold("counter", initial=lambda: (0, ""))
    fold.on(Said)(lambda state, ev: (state[0] + 1, ev.payload.text))
    total = 2 * PAGE + 3
    last = None
    for start in range(0, total, 5000):
        batch = [Said(text=str(i)) for i in range(start, min(total, start + 5000))]
        last = await journal.append("s", batch)
    assert await journal.fold(fold, "s") == (total, str(total - 1))
    assert [r.returned for r in store.reads] == [PAGE, PAGE, 3]
    assert store.reads[0].after is None
    store.clear()
    await cf.Journal(store).append("s", Said(text="new"))  # another writer's
    assert await journal.fold(fold, "s") == (total + 1, "new")
    assert last is not None
    assert [(r.after, r.returned) for r in store.reads] == [(last.cursor, 1)]


# -- cache bounds ------------------------------------------------------------------------------


async def test_max_entries_evicts_the_least_recently_read(store: RecordingStore) -> None:
    journal = cf.Journal(store, fold_cache=cf.FoldCache(max_entries=2, ttl=10))
    fold = said_fold()
    cursors = {}
    for stream in ("a", "b", "c"):
        cursors[stream] = (await journal.append(stream, [Said(text=stream), Said(text="x")])).cursor
    before = {stream: await journal.fold(fold, stream) for stream in ("a", "b", "c")}
    assert len(journal.folds.cache) == 2

    store.clear()
    assert await journal.fold(fold, "a") == before["a"]  # evicted: folded again from the start
    assert store.reads[0].after is None
    store.clear()
    assert await journal.fold(fold, "c") == before["c"]  # still cached: warm
    assert [r.after for r in store.reads] == [cursors["c"]]
    store.clear()
    assert await journal.fold(fold, "b") == before["b"]  # evicted by the read of "a"
    assert store.reads[0].after is None
    assert len(journal.folds.cache) == 2


async def test_ttl_expires_lazily_with_an_injected_clock(store: RecordingStore) -> None:
    now = [0.0]
    reader = FoldReader(store, cf.FoldCache(ttl=10), clock=lambda: now[0])
    journal = cf.Journal(store)
    fold = said_fold()
    cursor = (await journal.append("s", Said(text="a"))).cursor

    async def read_start() -> str | None:
        store.clear()
        assert await reader.read(fold, "default", "s") == ("a",)
        return store.reads[0].after

    assert await read_start() is None  # t=0 cold
    now[0] = 5.0
    assert await read_start() == cursor  # warm; touched at 5
    now[0] = 15.0
    assert await read_start() == cursor  # exactly ttl after the last read: still warm
    now[0] = 25.5
    assert await read_start() is None  # more than ttl after the last read: cold again
    assert len(reader.cache) == 1


async def test_expired_states_are_dropped_without_being_read_again() -> None:
    # With only a ttl bound (max_entries=inf), states of streams never read again must still
    # go once expired, or the cache grows with every stream ever read.
    now = [0.0]
    store = MemoryStore()
    reader = FoldReader(store, cf.FoldCache(max_entries=math.inf, ttl=10), clock=lambda: now[0])
    journal = cf.Journal(store)
    fold = said_fold()
    for i in range(50):
        await journal.append(f"s{i}", Said(text=str(i)))
        assert await reader.read(fold, "default", f"s{i}") == (str(i),)
    now[0] = 5.0
    assert await reader.read(fold, "default", "s7") == ("7",)  # read again: stays
    now[0] = 12.0
    assert await reader.read(fold, "default", "s49") == ("49",)
    assert len(reader.cache) == 2  # s7 and s49; the other 48 expired at 10


@pytest.mark.parametrize("bad", [0, -1, -0.5])
def test_cache_bounds_must_be_positive(bad: float) -> None:
    with pytest.raises(ValueError):
        cf.FoldCache(max_entries=bad)
    with pytest.raises(ValueError):
        cf.FoldCache(ttl=bad)


async def test_infinite_bounds_keep_everything() -> None:
    journal = cf.Journal(MemoryStore(), fold_cache=cf.FoldCache(max_entries=math.inf, ttl=math.inf))
    fold = said_fold()
    for i in range(50):
        await journal.append(f"s{i}", Said(text=str(i)))
        await journal.fold(fold, f"s{i}")
    assert len(journal.folds.cache) == 50


# -- single flight -----------------------------------------------------------------------------


async def test_concurrent_reads_fold_each_event_once(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    calls: list[str] = []
    fold = said_fold(calls=calls)
    await journal.append("s", [Said(text=str(i)) for i in range(50)])
    results = await asyncio.gather(*(journal.fold(fold, "s") for _ in range(20)))
    assert calls == [str(i) for i in range(50)]
    assert all(r == results[0] for r in results) and len(results[0]) == 50

    await journal.append("s", [Said(text=str(i)) for i in range(50, 60)])
    results = await asyncio.gather(*(journal.fold(fold, "s") for _ in range(20)))
    assert calls == [str(i) for i in range(60)]
    assert all(len(r) == 60 for r in results)


async def test_concurrent_reads_with_appends_in_between(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    calls: list[str] = []
    fold = said_fold(calls=calls)

    async def writer(i: int) -> None:
        await journal.append("s", Said(text=str(i)))

    await asyncio.gather(
        *(coro for i in range(20) for coro in (writer(i), journal.fold(fold, "s")))
    )
    final = await journal.fold(fold, "s")
    assert sorted(calls) == sorted(str(i) for i in range(20))
    assert len(calls) == 20 and list(final) == calls


# -- read-your-writes, resets ------------------------------------------------------------------


async def test_read_your_writes(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = said_fold()
    expected: tuple[str, ...] = ()
    for i in range(10):
        await journal.append("s", Said(text=str(i)))
        expected = (*expected, str(i))
        assert await journal.fold(fold, "s") == expected


async def test_a_stale_cursor_after_delete_stream_rebuilds(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = said_fold()
    await journal.append("s", [Said(text="old-1"), Said(text="old-2")])
    assert await journal.fold(fold, "s") == ("old-1", "old-2")

    assert await journal.delete_stream("s")
    await journal.append("s", [Said(text="new-1")])
    store.clear()
    assert await journal.fold(fold, "s") == ("new-1",)
    assert store.reads[0].reset  # the store reported the cursor unknown...
    assert any(r.after is None for r in store.reads[1:])  # ...and the state was rebuilt
    assert await cf.Journal(store).fold(fold, "s") == ("new-1",)

    await journal.delete_stream("s")
    assert await journal.fold(fold, "s") == ()


async def test_a_raising_handler_fails_warm_and_cold_reads_alike(store: RecordingStore) -> None:
    # A failed catch-up leaves the cached state as it was: the next warm read meets the same
    # event again and raises like a cold rebuild, instead of silently skipping it.
    fold: cf.Fold[tuple[str, ...]] = cf.Fold("fragile", state=tuple[str, ...], initial=tuple)

    @fold.on(Said)
    def _said(state: tuple[str, ...], ev: cf.Envelope[Said]) -> tuple[str, ...]:
        if ev.payload.text == "boom":
            raise RuntimeError(f"cannot fold @{ev.position}")
        return (*state, ev.payload.text)

    journal = cf.Journal(store)
    await journal.append("s", Said(text="before"))
    assert await journal.fold(fold, "s") == ("before",)  # cached, warm from here on
    await journal.append("s", [Said(text="ok"), Said(text="boom"), Said(text="after")])

    for reader in (journal, journal, cf.Journal(store), journal):
        with pytest.raises(RuntimeError, match="cannot fold @3"):
            await reader.fold(fold, "s")


# -- run scope ---------------------------------------------------------------------------------


def progress_fold() -> cf.Fold[int]:
    fold: cf.Fold[int] = cf.Fold("progress", scope="run", initial=lambda: 0)
    fold.on(Stepped)(lambda steps, ev: steps + 1)
    return fold


async def test_a_run_scoped_fold_folds_only_its_runs_events(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    progress = progress_fold()
    await journal.append("s", [Stepped(), Stepped(), Stepped()], run_id="r1")
    await journal.append("s", [Stepped(), Stepped()], run_id="r2")
    await journal.append("s", Stepped())  # no run
    with pytest.raises(cf.FoldDefinitionError, match="run_id"):
        await journal.fold(progress, "s")
    assert await journal.fold(progress, "s", run_id="r1") == 3
    assert await journal.fold(progress, "s", run_id="r2") == 2
    assert await journal.fold(progress, "s", run_id="r3") == 0
    await journal.append("s", Stepped(), run_id="r1")
    assert await journal.fold(progress, "s", run_id="r1") == 4
    assert await journal.fold(progress, "s", run_id="r2") == 2


async def test_end_run_drops_the_runs_state(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    progress = progress_fold()
    context_fold = said_fold()
    await journal.append("s", [Stepped(), Said(text="x")], run_id="r1")
    await journal.append("s", [Stepped()], run_id="r2")
    await journal.fold(progress, "s", run_id="r1")
    await journal.fold(progress, "s", run_id="r2")
    await journal.fold(context_fold, "s")
    assert len(journal.folds.cache) == 3

    journal.end_run("s", "r1")
    assert len(journal.folds.cache) == 2
    store.clear()
    assert await journal.fold(progress, "s", run_id="r2") == 1
    assert store.reads[0].after is not None  # r2 is still cached
    store.clear()
    assert await journal.fold(progress, "s", run_id="r1") == 1
    assert store.reads[0].after is None  # r1 was dropped: folded again from the start


async def test_a_read_in_flight_when_its_run_ends_caches_nothing(store: RecordingStore) -> None:
    # end_run while a read of that run is between its store read and storing its state: the
    # read still returns, but must not put the ended run's state back into the cache.
    journal = cf.Journal(store)
    progress = progress_fold()
    await journal.append("s", [Stepped(), Stepped()], run_id="r1")
    store.pause("read")
    read = asyncio.create_task(journal.fold(progress, "s", run_id="r1"))
    await store.paused.wait()
    journal.end_run("s", "r1")
    store.resume()
    assert await read == 2
    assert len(journal.folds.cache) == 0

    store.clear()  # a read after the run ended is served, and cached as any read of it
    assert await journal.fold(progress, "s", run_id="r1") == 2
    assert store.reads[0].after is None and len(journal.folds.cache) == 1


# -- decoding ----------------------------------------------------------------------------------


async def test_an_undecodable_event_is_skipped_and_reported_once(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = said_fold("decoding")
    await journal.append("s", Said(text="a"))
    bad = await journal.append(
        "s",
        [cf.RawEvent("rdr/said", {"text": 5}), cf.RawEvent("rdr/said", ["not", "an", "object"])],
    )
    await journal.append("s", Said(text="b"))
    assert await journal.fold(fold, "s") == ("a", "b")
    reports = [s for s in journal.folds.skipped if s.fold == "decoding"]
    assert [(s.reason, s.position) for s in reports] == [
        ("decode", bad.first_position),
        ("decode", bad.last_position),
    ]
    for _ in range(3):  # cold rebuilds do not report the same events again
        journal.folds.cache.drop(lambda key: True)
        assert await journal.fold(fold, "s") == ("a", "b")
        assert await journal.fold(fold, "s") == ("a", "b")
    assert len([s for s in journal.folds.skipped if s.fold == "decoding"]) == 2


class Kept(BaseModel):
    model_config = ConfigDict(frozen=True)
    notes: tuple[Note, ...] = ()


async def test_unknown_fields_are_stripped(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold: cf.Fold[Kept] = cf.Fold("keeper", state=Kept)

    @fold.on(Note)
    def _note(state: Kept, ev: cf.Envelope[Note]) -> Kept:
        return state.model_copy(update={"notes": (*state.notes, ev.payload)})

    await journal.append("s", cf.RawEvent("rdr/note", {"text": "a", "secret": 1, "more": {"x": 2}}))
    state = await journal.fold(fold, "s")
    assert state.notes[0].model_dump() == {"text": "a"}
    assert not hasattr(state.notes[0], "secret")
    # A fold that keeps payloads still takes checkpoints (they encode strictly).
    compacted = await journal.checkpoint(fold, "s", lambda s: s)
    assert compacted == state
    checkpoint = (await journal.latest("s", [fold.checkpoint_type]))[0]
    assert checkpoint.payload["state"] == {"notes": [{"text": "a"}]}


async def test_other_namespaces_are_separate(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    tenant = journal.with_namespace("tenant")
    fold = said_fold()
    await journal.append("s", Said(text="default"))
    await tenant.append("s", Said(text="tenant"))
    assert await journal.fold(fold, "s") == ("default",)
    assert await tenant.fold(fold, "s") == ("tenant",)


async def test_each_fold_object_has_its_own_state_even_after_others_die() -> None:
    # Folds built per call (a factory) are different folds: a new one must never be served
    # the cached state of a dead one that happened to live at the same address.
    journal = cf.open_journal("memory://")
    await journal.append("s", Said(text="x"))

    def tagged(tag: str) -> cf.Fold[tuple[str, ...]]:
        fold: cf.Fold[tuple[str, ...]] = cf.Fold("tagged", initial=tuple)
        fold.on(Said)(lambda state, ev: (*state, tag + ev.payload.text))
        return fold

    for tag in "abcdefghijklmnopqrstuvwxyz":
        assert await journal.fold(tagged(tag), "s") == (tag + "x",)
        gc.collect()


def test_a_read_restarts_its_states_ttl_even_when_the_read_then_fails() -> None:
    """Expiry pops from the least recently read end, so a read must refresh the time it
    is measured from: otherwise a state read just before its ttl ran out (a read that then
    failed never puts it back) expires with, or ahead of, states nobody read."""
    from contextfold.folds.reader import _Entry

    cache = cf.FoldCache(ttl=10)
    cache.put(("a",), _Entry(state=1, cursor=None, checkpoint_at=0, touched=0.0))
    cache.put(("b",), _Entry(state=2, cursor=None, checkpoint_at=0, touched=0.0))
    assert cache.get(("a",), now=9.0) is not None  # read; suppose this read then fails
    assert cache.get(("a",), now=15.0) is not None  # 6 s after its last read: alive
    assert cache.get(("b",), now=15.0) is None  # never read since 0: expired
    assert len(cache) == 1
