"""An append through the journal folds its events into the cached states it continues: the
read that follows asks the store only for its head. Other writers, deletes, checkpoints and
failing handlers leave the state to the read, which catches up as before."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import model_validator

import contextfold as cf
from contextfold.store.memory import MemoryStore
from contextfold.store.sqlite import SQLiteStore
from contextfold.testing import RecordingStore


class Said(cf.Event, type="apf/said"):
    text: str


class Other(cf.Event, type="apf/other"):
    n: int


class Boom(cf.Event, type="apf/boom"):
    pass


def said_fold(name: str) -> cf.Fold[tuple[str, ...]]:
    fold: cf.Fold[tuple[str, ...]] = cf.Fold(name, state=tuple[str, ...], initial=tuple)

    @fold.on(Said)
    def _said(state: tuple[str, ...], ev: cf.Envelope[Said]) -> tuple[str, ...]:
        return (*state, f"{ev.payload.text}@{ev.position}/{ev.global_position}/{ev.meta.run_id}")

    @fold.on(Boom)
    def _boom(state: tuple[str, ...], ev: cf.Envelope[Boom]) -> tuple[str, ...]:
        raise RuntimeError(f"boom at {ev.position}")

    return fold


SAID = said_fold("apf_said")
SAID_TOO = said_fold("apf_said_too")  # the same event classes: appends decode them once
RUN_SAID: cf.Fold[tuple[str, ...]] = cf.Fold(
    "apf_run_said", state=tuple[str, ...], initial=tuple, scope="run"
)
RUN_SAID.on(Said)(lambda state, ev: (*state, ev.payload.text))


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, sqlite_path: str) -> AsyncIterator[RecordingStore]:
    inner: cf.Store = MemoryStore() if request.param == "memory" else SQLiteStore(sqlite_path)
    recording = RecordingStore(inner)
    # The recording passes appends through: their global positions are the inner store's.
    recording.consecutive_globals = inner.consecutive_globals
    await recording.open()
    try:
        yield recording
    finally:
        await recording.close()


async def cold(store: cf.Store, fold: cf.Fold[Any], stream: str = "s", **kw: Any) -> Any:
    """What a journal that never saw the stream reads."""
    return await cf.Journal(store).fold(fold, stream, **kw)


async def test_a_read_after_the_journals_own_append_reads_no_events(
    store: RecordingStore,
) -> None:
    journal = cf.Journal(store)
    await journal.append("s", [Other(n=0), Said(text="a")])
    await journal.fold(SAID, "s")
    store.clear()
    await journal.append("s", [Said(text="b"), Other(n=2), Said(text="c")], run_id="r1")
    await journal.append("s", Other(n=3))
    state = await journal.fold(SAID, "s")
    assert store.reads == () and store.of("latest") == ()
    assert len(store.of("head")) == 1  # the one check that nothing else was appended
    assert state == await cold(store, SAID)
    assert state[-1].startswith("c@5/")


async def test_the_cursor_stays_the_one_a_read_gives(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    await journal.fold(SAID, "s")
    await journal.append("s", [Said(text="a"), Other(n=1)])
    _, cursor = await journal.folds.read_with_cursor(SAID, journal.namespace, "s")
    _, cold_cursor = await cf.Journal(store).folds.read_with_cursor(SAID, journal.namespace, "s")
    assert cursor == cold_cursor


async def test_another_writers_append_in_between_is_read(store: RecordingStore) -> None:
    journal, other = cf.Journal(store), cf.Journal(store)
    await journal.append("s", Said(text="a"))
    await journal.fold(SAID, "s")
    await other.append("s", Said(text="theirs"))
    await journal.append("s", Said(text="mine"))
    store.clear()
    state = await journal.fold(SAID, "s")
    assert [r.returned for r in store.reads] == [2]
    assert state == await cold(store, SAID)


async def test_another_writers_append_after_is_caught_up(store: RecordingStore) -> None:
    journal, other = cf.Journal(store), cf.Journal(store)
    await journal.fold(SAID, "s")
    await journal.append("s", Said(text="mine"))
    await other.append("s", Said(text="theirs"))
    state = await journal.fold(SAID, "s")
    assert state == await cold(store, SAID)
    assert len(state) == 2


async def test_a_delete_and_recreate_to_the_same_length_is_not_continued(
    store: RecordingStore,
) -> None:
    journal, other = cf.Journal(store), cf.Journal(store)
    await journal.append("s", [Said(text="a"), Said(text="b")])
    await journal.fold(SAID, "s")
    await other.delete_stream("s")
    await other.append("s", [Said(text="x"), Said(text="y")])
    await journal.append("s", Said(text="mine"))
    state = await journal.fold(SAID, "s")
    assert state == await cold(store, SAID)
    assert [s.split("@")[0] for s in state] == ["x", "y", "mine"]


async def test_an_append_of_the_folds_checkpoint_is_restored_by_the_read(
    store: RecordingStore,
) -> None:
    journal = cf.Journal(store)
    await journal.append("s", [Said(text="a"), Said(text="b")])
    await journal.fold(SAID, "s")
    state = await journal.checkpoint(SAID, "s", lambda state: ("summary",))
    assert state == ("summary",)
    await journal.append("s", Said(text="c"))
    store.clear()
    state = await journal.fold(SAID, "s")
    assert store.reads == ()
    assert state == await cold(store, SAID)
    assert state[0] == "summary" and state[1].startswith("c@")


async def test_a_failed_append_applies_nothing(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    await journal.append("s", Said(text="a"), idempotency_key="k")
    before = await journal.fold(SAID, "s")
    with pytest.raises(cf.WrongExpectedVersionError):
        await journal.append("s", Said(text="no"), expected_version=5)
    with pytest.raises(cf.IdempotencyConflictError):
        await journal.append("s", Said(text="other"), idempotency_key="k")
    retry = await journal.append("s", Said(text="a"), idempotency_key="k")
    assert retry.deduplicated
    assert await journal.fold(SAID, "s") == before == await cold(store, SAID)


async def test_a_handler_that_raises_raises_in_the_read_not_the_append(
    store: RecordingStore,
) -> None:
    journal = cf.Journal(store)
    await journal.fold(SAID, "s")
    done = await journal.append("s", [Said(text="a"), Boom()])
    assert done.last_position == 2
    with pytest.raises(RuntimeError, match="boom at 2"):
        await journal.fold(SAID, "s")
    with pytest.raises(RuntimeError, match="boom at 2"):
        await cold(store, SAID)


async def test_a_run_scoped_state_folds_only_its_runs_events(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    await journal.fold(RUN_SAID, "s", run_id="r1")
    await journal.append("s", Said(text="one"), run_id="r1")
    await journal.append("s", Said(text="two"), run_id="r2")
    store.clear()
    assert await journal.fold(RUN_SAID, "s", run_id="r1") == ("one",)
    assert store.reads == ()
    assert await cold(store, RUN_SAID, run_id="r1") == ("one",)


async def test_without_known_global_positions_a_batch_is_read(sqlite_path: str) -> None:
    store = RecordingStore(SQLiteStore(sqlite_path))  # consecutive_globals left False
    await store.open()
    try:
        journal = cf.Journal(store)
        await journal.fold(SAID, "s")
        await journal.append("s", [Said(text="a"), Said(text="b")])
        store.clear()
        state = await journal.fold(SAID, "s")
        assert [r.returned for r in store.reads] == [2]
        assert state == await cold(store, SAID)
        await journal.append("s", Said(text="c"))  # one event: its cursor is its position
        store.clear()
        state = await journal.fold(SAID, "s")
        assert store.reads == ()
        assert state == await cold(store, SAID)
    finally:
        await store.close()


class Counted(cf.Event, type="apf/counted"):
    """Counts its decodes (and constructions) in ``DECODES``."""

    n: int

    @model_validator(mode="after")
    def _count(self) -> Counted:
        DECODES.append(self.n)
        return self


DECODES: list[int] = []


def counted_fold(name: str) -> cf.Fold[tuple[int, ...]]:
    fold: cf.Fold[tuple[int, ...]] = cf.Fold(name, state=tuple[int, ...], initial=tuple)
    fold.on(Counted)(lambda state, ev: (*state, ev.payload.n))
    return fold


async def test_folds_taking_one_event_class_decode_an_appended_event_once(
    store: RecordingStore,
) -> None:
    journal = cf.Journal(store)
    first, second = counted_fold("apf_first"), counted_fold("apf_second")
    await journal.fold(first, "s")
    await journal.fold(second, "s")
    events = [Counted(n=1), Said(text="a"), Counted(n=2)]
    DECODES.clear()
    await journal.append("s", events)
    assert DECODES == [1, 2]  # once per event, for both folds
    assert await journal.fold(first, "s") == await journal.fold(second, "s") == (1, 2)
    assert await cold(store, first) == (1, 2)


async def test_a_handler_registered_after_a_read_folds_the_next_append(
    store: RecordingStore,
) -> None:
    journal = cf.Journal(store)
    fold = said_fold("apf_later")
    await journal.append("s", Said(text="a"))
    await journal.fold(fold, "s")
    fold.on(Other)(lambda state, ev: (*state, f"other {ev.payload.n}"))
    await journal.append("s", [Other(n=1), Said(text="b")])
    store.clear()
    state = await journal.fold(fold, "s")
    assert store.reads == ()
    assert state == await cold(store, fold)
    assert state[1] == "other 1" and state[2].startswith("b@3/")


# -- property: any interleaving with a second writer on the same SQLite file ----------------

operations = st.one_of(
    st.tuples(
        st.sampled_from(["mine", "theirs"]),
        st.sampled_from(["s", "t"]),
        st.lists(st.sampled_from(["said", "other"]), min_size=1, max_size=3),
        st.sampled_from([None, "r1", "r2"]),
    ),
    st.tuples(st.just("read"), st.sampled_from(["s", "t"])),
    st.tuples(st.just("delete"), st.sampled_from(["mine", "theirs"])),
    st.tuples(st.just("checkpoint")),
)


async def same_as_cold(mine: cf.Journal, other: cf.Store, stream: str) -> None:
    fresh = cf.Journal(other)
    assert await mine.fold(SAID, stream) == await fresh.fold(SAID, stream)
    assert await mine.fold(SAID_TOO, stream) == await fresh.fold(SAID_TOO, stream)
    run = await mine.fold(RUN_SAID, stream, run_id="r1")
    assert run == await fresh.fold(RUN_SAID, stream, run_id="r1")


async def run_interleaving(path: str, ops: list[tuple[Any, ...]]) -> None:
    mine_store, their_store = SQLiteStore(path), SQLiteStore(path)
    mine, theirs = cf.Journal(mine_store), cf.Journal(their_store)
    try:
        for number, op in enumerate(ops):
            if op[0] in ("mine", "theirs"):
                _, stream, kinds, run_id = op
                batch = [Said(text=f"{number}") if k == "said" else Other(n=number) for k in kinds]
                await (mine if op[0] == "mine" else theirs).append(stream, batch, run_id=run_id)
            elif op[0] == "read":
                await same_as_cold(mine, their_store, op[1])
            elif op[0] == "delete":
                await (mine if op[1] == "mine" else theirs).delete_stream("s")
            else:
                await mine.checkpoint(SAID, "s", lambda state: (f"cp{len(state)}",))
        for stream in ("s", "t"):
            await same_as_cold(mine, their_store, stream)
    finally:
        await mine.close()
        await theirs.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operations, min_size=2, max_size=20))
def test_appends_folded_in_equal_cold_reads_with_a_second_writer(ops: list[Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run_interleaving(str(Path(tmp) / "journal.db"), ops))


# -- property: reads racing the journal's own appends ------------------------------------------


async def race(path: str, batches: list[list[str]]) -> None:
    store = SQLiteStore(path)  # its calls run on a thread: the reads and appends interleave
    journal = cf.Journal(store)
    try:
        await journal.fold(SAID, "s")
        for number, kinds in enumerate(batches):
            before = len(await cold(store, SAID))
            batch = [Said(text=f"{number}") if k == "said" else Other(n=number) for k in kinds]
            first, _, second = await asyncio.gather(
                journal.fold(SAID, "s"), journal.append("s", batch), journal.fold(SAID, "s")
            )
            history = await cold(store, SAID)
            for state in (first, second):
                # A state of this history, holding at least what was stored before the call.
                assert len(state) >= before and state == history[: len(state)]
        assert await journal.fold(SAID, "s") == await cold(store, SAID)
    finally:
        await journal.close()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.sampled_from(["said", "other"]), min_size=1, max_size=3), max_size=8))
def test_reads_racing_appends_return_a_state_at_least_as_new_as_their_call(
    batches: list[list[str]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(race(str(Path(tmp) / "journal.db"), batches))
