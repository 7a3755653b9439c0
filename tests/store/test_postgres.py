"""PostgreSQL-specific behaviour of PostgresStore: concurrency, NOTIFY, schema creation.

The store contract itself runs in tests/contract/; these tests need a real server
(the ``pg_dsn`` fixture gives each test a fresh database).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest

import contextfold as cf
from contextfold.errors import (
    IdempotencyConflictError,
    InvalidInputError,
    StoreError,
    StoreUnavailableError,
    WrongExpectedVersionError,
)
from contextfold.journal import Journal, open_journal
from contextfold.store.postgres import PostgresStore


def raw(i: int, **extra: object) -> cf.RawEvent:
    return cf.RawEvent("note", {"i": i, **extra})


@pytest.fixture
async def journal(pg_dsn: str) -> AsyncIterator[Journal]:
    j = open_journal(pg_dsn)
    try:
        yield j
    finally:
        await j.close()


async def test_round_trip_keeps_exact_json_bytes(journal: Journal) -> None:
    # Keys out of order and unicode: jsonb would reorder them, BYTEA must not.
    payload = {"z": 1, "a": [1, 2.5, None], "é": "\u2028 snow ☃", "m": {"b": True, "a": ""}}
    result = await journal.append("s-1", [cf.RawEvent("note", payload), raw(2)])
    assert (result.first_position, result.last_position, result.deduplicated) == (1, 2, False)
    page = await journal.read("s-1")
    assert [e.position for e in page.events] == [1, 2]
    assert page.events[0].payload == payload
    assert list(page.events[0].payload) == ["z", "a", "é", "m"]
    assert page.cursor == result.cursor == page.events[-1].cursor
    assert page.events[0].meta.channels == ("main",)
    assert (await journal.read("s-1", after=page.cursor)).events == ()
    assert await journal.version("s-1") == 2
    assert await journal.version("nothing") == 0


async def test_meta_round_trips(journal: Journal) -> None:
    await journal.append(
        "s", [raw(1)], run_id="run-7", actor="user", channels=("a", "b"), idempotency_key="k"
    )
    await journal.append("s", [raw(2)], channels=())
    first, second = (await journal.read("s")).events
    assert (first.meta.run_id, first.meta.actor, first.meta.idempotency_key) == (
        "run-7",
        "user",
        "k",
    )
    assert first.meta.channels == ("a", "b")
    assert second.meta.channels == ()
    assert (second.meta.run_id, second.meta.actor, second.meta.idempotency_key) == (
        None,
        None,
        None,
    )


async def test_idempotency_and_expected_version(journal: Journal) -> None:
    first = await journal.append("s", [raw(1), raw(2)], idempotency_key="req-1")
    again = await journal.append("s", [raw(1), raw(2)], idempotency_key="req-1")
    assert again.deduplicated
    assert (again.first_position, again.last_position, again.cursor) == (1, 2, first.cursor)
    assert await journal.version("s") == 2
    with pytest.raises(IdempotencyConflictError, match=r"'req-1'.*'s'"):
        await journal.append("s", [raw(3)], idempotency_key="req-1")
    with pytest.raises(WrongExpectedVersionError) as info:
        await journal.append("s", [raw(3)], expected_version=1)
    assert (info.value.expected, info.value.actual) == (1, 2)
    with pytest.raises(WrongExpectedVersionError):
        await journal.append("new", [raw(1)], expected_version=3)
    assert await journal.version("new") == 0
    assert [s.stream for s in await journal.list_streams()] == ["s"]
    ok = await journal.append("s", [raw(3)], expected_version=2)
    assert ok.last_position == 3


async def test_reads_cursors_types_and_limits(journal: Journal) -> None:
    await journal.append("s", [raw(i) for i in range(1, 6)])
    await journal.append("s", [cf.RawEvent("other", {})])
    page = await journal.read("s", limit=2)
    assert [e.position for e in page.events] == [1, 2] and page.more
    rest = await journal.read("s", after=page.cursor, limit=10)
    assert [e.position for e in rest.events] == [3, 4, 5, 6] and not rest.more
    typed = await journal.read("s", types=["other"])
    assert [e.position for e in typed.events] == [6]
    typed_after = await journal.read("s", after=page.cursor, types=["note"], limit=2)
    assert [e.position for e in typed_after.events] == [3, 4] and typed_after.more
    for unknown in ("999999", "not-a-cursor", "0x1"):
        reset = await journal.read("s", after=unknown, limit=1)
        assert reset.reset and [e.position for e in reset.events] == [1]
    latest = await journal.latest("s", ["note"], limit=2)
    assert [e.position for e in latest] == [5, 4]
    before = await journal.latest("s", ["note"], before=latest[1].cursor)
    assert [e.position for e in before] == [3]
    assert await journal.contains("s", latest[0].cursor)
    assert not await journal.contains("other-stream", latest[0].cursor)


async def test_delete_and_recreate_resets_old_cursors(journal: Journal) -> None:
    old = await journal.append("s", [raw(1), raw(2)], idempotency_key="k")
    assert await journal.delete_stream("s")
    assert not await journal.delete_stream("s")
    new = await journal.append("s", [raw(9)], idempotency_key="k")
    assert (new.first_position, new.deduplicated) == (1, False)
    assert int(new.cursor) > int(old.cursor)  # global positions are never reused
    page = await journal.read("s", after=old.cursor)
    assert page.reset and [e.payload["i"] for e in page.events] == [9]


async def test_namespaces_are_isolated_and_listing_sorts_by_code_point(journal: Journal) -> None:
    other = journal.with_namespace("tenant-b")
    for name in ("b", "a", "B", "a%_", "ab", "é"):
        await journal.append(name, [raw(1)])
    await other.append("a", [raw(1), raw(2)])
    names = [s.stream for s in await journal.list_streams()]
    assert names == sorted(names) == ["B", "a", "a%_", "ab", "b", "é"]
    assert [s.stream for s in await journal.list_streams(prefix="a%")] == ["a%_"]
    assert [s.stream for s in await journal.list_streams(prefix="a", limit=2)] == ["a", "a%_"]
    assert [(s.stream, s.version) for s in await other.list_streams()] == [("a", 2)]
    cursor = (await other.read("a")).cursor
    assert cursor is not None
    assert (await journal.read("a", after=cursor)).reset
    assert await other.delete_stream("a")
    assert await journal.version("a") == 1


async def test_global_positions_grow_with_positions_inside_a_big_batch(journal: Journal) -> None:
    result = await journal.append("s", [raw(i) for i in range(2000)])
    events = (await journal.read("s")).events
    globals_ = [e.global_position for e in events]
    assert [e.position for e in events] == list(range(1, 2001))
    assert globals_ == sorted(globals_)
    assert result.cursor == events[-1].cursor


async def test_concurrent_appends_on_separate_connections_leave_no_gap(pg_dsn: str) -> None:
    tasks, rounds = 20, 10
    async with open_journal(pg_dsn, min_size=tasks, max_size=tasks) as j:

        async def writer(t: int) -> list[tuple[int, int]]:
            spans = []
            for r in range(rounds):
                res = await j.append("hot", [raw(t * 100 + r), raw(t * 100 + r)])
                spans.append((res.first_position, res.last_position))
            return spans

        spans = [s for chunk in await asyncio.gather(*map(writer, range(tasks))) for s in chunk]
        events = (await j.read("hot")).events
    total = tasks * rounds * 2
    assert sorted(p for span in spans for p in range(span[0], span[1] + 1)) == list(
        range(1, total + 1)
    )
    assert all(last == first + 1 for first, last in spans)
    assert [e.position for e in events] == list(range(1, total + 1))
    # Each batch sits together, and global order follows stream order.
    assert [e.global_position for e in events] == sorted(e.global_position for e in events)
    for first, _ in spans:
        assert events[first - 1].payload == events[first].payload


async def test_racing_idempotent_retries_store_the_batch_once(pg_dsn: str) -> None:
    journals = [open_journal(pg_dsn) for _ in range(8)]
    try:
        await asyncio.gather(*(j.version("warm-up") for j in journals))
        results = await asyncio.gather(
            *(j.append("s", [raw(1), raw(2)], idempotency_key="same") for j in journals)
        )
        assert sum(not r.deduplicated for r in results) == 1
        assert {(r.first_position, r.last_position, r.cursor) for r in results} == {
            (1, 2, results[0].cursor)
        }
        assert await journals[0].version("s") == 2
    finally:
        await asyncio.gather(*(j.close() for j in journals))


async def test_expected_version_race_has_one_winner(pg_dsn: str) -> None:
    journals = [open_journal(pg_dsn) for _ in range(6)]
    try:
        outcomes = await asyncio.gather(
            *(j.append("s", [raw(i)], expected_version=0) for i, j in enumerate(journals)),
            return_exceptions=True,
        )
        assert sum(isinstance(o, cf.AppendResult) for o in outcomes) == 1
        assert all(isinstance(o, (cf.AppendResult, WrongExpectedVersionError)) for o in outcomes)
    finally:
        await asyncio.gather(*(j.close() for j in journals))


_CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import contextfold as cf

    async def main() -> None:
        async with cf.open_journal(sys.argv[1]) as j:
            await j.version("shared")  # connected: now wait for the starting signal
            print("ready", flush=True)
            sys.stdin.readline()
            for i in range(int(sys.argv[2])):
                tag = {"pid": sys.argv[3], "i": i}
                await j.append("shared", [cf.RawEvent("n", tag), cf.RawEvent("n", tag)])

    asyncio.run(main())
    """
)


@pytest.mark.slow
async def test_processes_appending_to_one_stream_never_gap_or_duplicate(pg_dsn: str) -> None:
    procs, rounds = 4, 100
    async with open_journal(pg_dsn) as j:
        await j.version("shared")  # the schema exists before the children race
        env = {**os.environ, "PYTHONWARNINGS": "error"}
        children = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _CHILD,
                pg_dsn,
                str(rounds),
                str(c),
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            for c in range(procs)
        ]
        for child in children:
            assert child.stdout is not None
            assert await asyncio.wait_for(child.stdout.readline(), 60) == b"ready\n"
        for child in children:  # all connected: release them together
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            await child.stdin.drain()
        for child in children:
            _, err = await child.communicate()
            assert child.returncode == 0, err.decode()
        events = (await j.read("shared")).events
    assert [e.position for e in events] == list(range(1, procs * rounds * 2 + 1))
    tags = [(e.payload["pid"], e.payload["i"]) for e in events]
    assert all(tags[k] == tags[k + 1] for k in range(0, len(tags), 2))  # batches never split
    assert sorted(set(tags)) == sorted((str(c), i) for c in range(procs) for i in range(rounds))
    switches = sum(tags[k][0] != tags[k + 2][0] for k in range(0, len(tags) - 2, 2))
    assert switches > procs  # the writers really interleaved


async def test_subscribe_wakes_on_notify_from_another_journal(pg_dsn: str) -> None:
    # A huge poll fallback: only NOTIFY can deliver the event in time.
    reader = open_journal(pg_dsn, poll_fallback=60.0)
    writer = open_journal(pg_dsn)
    try:
        await writer.append("live", [raw(1)])
        tail = reader.subscribe("live")
        first = await asyncio.wait_for(anext(tail), 5)
        assert first.position == 1
        pending = asyncio.ensure_future(anext(tail))
        await asyncio.sleep(0.3)  # the tail is now parked on its wait
        assert not pending.done()
        await writer.append("other", [raw(0)])
        await writer.with_namespace("elsewhere").append("live", [raw(0)])
        await asyncio.sleep(0.2)
        assert not pending.done()
        await writer.append("live", [raw(2)])
        second = await asyncio.wait_for(pending, 10)
        assert (second.position, second.payload["i"]) == (2, 2)
        await tail.aclose()  # type: ignore[attr-defined]
        store = reader.store
        assert isinstance(store, PostgresStore)
        for _ in range(40):  # the store's own generator is finalised by the loop, soon after
            if store._listener is None:
                break
            await asyncio.sleep(0.05)
        assert store._listener is None  # the last tail closed the listening connection
    finally:
        await reader.close()
        await writer.close()


async def test_subscribe_survives_a_killed_listener_connection(pg_dsn: str) -> None:
    reader = open_journal(pg_dsn, poll_fallback=60.0)
    writer = open_journal(pg_dsn)
    try:
        tail = reader.subscribe("live")
        pending = asyncio.ensure_future(anext(tail))
        store = reader.store
        assert isinstance(store, PostgresStore)
        for _ in range(200):  # the tail starts the listener (slow machines take a while)
            if store._listener is not None:
                break
            await asyncio.sleep(0.05)
        assert store._listener is not None
        old_pid = store._listener.info.backend_pid
        with psycopg.connect(pg_dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (old_pid,))
        await asyncio.sleep(0.5)  # the tail notices, re-reads and listens again
        assert not pending.done()
        await writer.append("live", [raw(1)])
        assert (await asyncio.wait_for(pending, 10)).position == 1
        assert store._listener is not None and store._listener.info.backend_pid != old_pid
        await tail.aclose()  # type: ignore[attr-defined]
    finally:
        await reader.close()
        await writer.close()


async def test_a_tail_cancelled_as_its_listener_starts_closes_that_connection(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = open_journal(pg_dsn)
    opened: list[psycopg.AsyncConnection[Any]] = []
    connect = psycopg.AsyncConnection.connect

    async def connect_then_cancel(*args: Any, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
        conn: psycopg.AsyncConnection[Any] = await connect(*args, **kwargs)
        if asyncio.current_task() is task:  # the tail's listener, not a pool connection
            opened.append(conn)
            task.cancel()  # lands on the store's next await: the LISTEN on this connection
        return conn

    async def tail() -> None:
        async for _ in journal.subscribe("s"):
            pass

    try:
        await journal.append("s", [raw(1)])  # the pool is open before connect is patched
        monkeypatch.setattr(psycopg.AsyncConnection, "connect", connect_then_cancel)
        task = asyncio.create_task(tail())
        done, _ = await asyncio.wait({task}, timeout=10)
        assert task in done and task.cancelled()
        assert len(opened) == 1
        assert opened[0].closed, "the listening connection was left open"
    finally:
        await journal.close()


async def test_a_journal_closed_while_a_tail_connects_its_listener_keeps_no_connection(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another tail holds an event (paused at its yield, so the listener is still wanted)
    when the journal closes under a tail that is connecting the listener: that connection
    must be closed, not kept by a store that is gone."""
    journal = open_journal(pg_dsn)
    store = journal.store
    assert isinstance(store, PostgresStore)
    opened: list[psycopg.AsyncConnection[Any]] = []
    connect = psycopg.AsyncConnection.connect
    closer: asyncio.Task[None] | None = None

    async def patched(*args: Any, **kwargs: Any) -> psycopg.AsyncConnection[Any]:
        if closer is None:  # the first tail: no listener (it polls)
            raise OSError("listener unavailable")
        conn: psycopg.AsyncConnection[Any] = await connect(*args, **kwargs)
        opened.append(conn)
        await journal.close()  # the journal closes while the listener is being set up
        return conn

    async def tail() -> None:
        async for _ in journal.subscribe("s"):
            pass

    await journal.append("s", [raw(1)])  # the pool is open before connect is patched
    monkeypatch.setattr(psycopg.AsyncConnection, "connect", patched)
    holder = journal.subscribe("s", poll_interval=60)
    try:
        assert (await anext(holder)).position == 1  # paused at its yield, listening wanted
        store._next_listen = 0.0  # the next tail tries to listen again at once
        closer = asyncio.create_task(tail())
        done, _ = await asyncio.wait({closer}, timeout=10)
        assert closer in done
        with pytest.raises(StoreUnavailableError, match="closed"):
            closer.result()
        assert len(opened) == 1
        assert opened[0].closed, "the listener outlived the closed journal"
        assert store._listener is None
    finally:
        await holder.aclose()  # type: ignore[attr-defined]


async def test_closing_the_journal_ends_a_waiting_tail(pg_dsn: str) -> None:
    reader = open_journal(pg_dsn, poll_fallback=60.0)
    tail = reader.subscribe("live")
    pending = asyncio.ensure_future(anext(tail))
    await asyncio.sleep(0.3)
    await reader.close()
    with pytest.raises(StoreUnavailableError, match="closed"):
        await asyncio.wait_for(pending, 10)


async def test_appends_racing_deletes_keep_streams_consistent(pg_dsn: str) -> None:
    journals = [open_journal(pg_dsn) for _ in range(6)]
    try:

        async def churn(j: Journal, k: int) -> None:
            for i in range(15):
                if k == 0 and i % 3 == 0:
                    await j.delete_stream("s")
                else:
                    await j.append("s", [raw(i), raw(i)])

        await asyncio.gather(*(churn(j, k) for k, j in enumerate(journals)))
        events = (await journals[0].read("s")).events
        assert [e.position for e in events] == list(range(1, len(events) + 1))
        assert await journals[0].version("s") == len(events)
    finally:
        await asyncio.gather(*(j.close() for j in journals))


async def test_subscribe_from_cursor_and_cancel(journal: Journal) -> None:
    r = await journal.append("s", [raw(1), raw(2)])
    await journal.append("s", [raw(3)])
    seen: list[int] = []

    async def consume() -> None:
        async for event in journal.subscribe("s", after=r.cursor):
            seen.append(event.position)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.3)
    await journal.append("s", [raw(4)])
    for _ in range(50):
        if seen == [3, 4]:
            break
        await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == [3, 4]


async def test_concurrent_schema_creation(pg_dsn: str) -> None:
    journals = [open_journal(pg_dsn) for _ in range(6)]
    try:
        await asyncio.gather(*(j.append(f"s{i}", [raw(i)]) for i, j in enumerate(journals)))
        assert len(await journals[0].list_streams()) == 6
    finally:
        await asyncio.gather(*(j.close() for j in journals))
    with psycopg.connect(pg_dsn) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'cf\\_%'"
        ).fetchone()
    assert tables == (3,)


def test_bad_options_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="max_size"):
        PostgresStore("postgresql://localhost/db", min_size=5, max_size=2)
    with pytest.raises(InvalidInputError, match="poll_fallback"):
        open_journal("postgresql://localhost/db", poll_fallback=0)


async def test_unreachable_server_is_unavailable() -> None:
    j = open_journal("postgresql://nobody:secret@127.0.0.1:1/none", timeout=1.0)
    with pytest.raises(StoreUnavailableError) as info:
        await j.append("s", [raw(1)])
    assert "secret" not in str(info.value)
    await j.close()


async def test_closed_store_and_driver_errors_are_store_errors(pg_dsn: str) -> None:
    j = open_journal(pg_dsn)
    await j.append("s", [raw(1)])
    bad = cf.NewEvent("bad\x00type", b"{}", cf.EventMeta(event_id="e", time="t"))
    with pytest.raises(StoreError, match="'s'"):
        # PostgreSQL text cannot hold NUL: the driver refuses, the message names the stream.
        # (The journal refuses such a type name itself; the store is called directly here.)
        await j.store.append("default", "s", [bad], expected_version=None, idempotency_key=None)
    assert await j.version("s") == 1
    await j.close()
    with pytest.raises(StoreUnavailableError, match="closed"):
        await j.store.read("default", "s", after=None, types=None, limit=None)


async def test_a_journal_opened_before_its_database_exists_recovers(pg_server: Any) -> None:
    """A server started while PostgreSQL (here: its database) is not there yet is not stuck
    with the first failure: the next call opens the store."""
    name = f"cf_late_{os.getpid()}"
    journal = open_journal(pg_server.dsn_for(name), timeout=1.0)
    try:
        with pytest.raises(StoreUnavailableError):
            await journal.append("s", [raw(1)])
        pg_server.create_database(name)
        assert (await journal.append("s", [raw(2)])).last_position == 1
    finally:
        await journal.close()
        pg_server.drop_database(name)


async def test_a_journal_closed_during_its_first_open_leaves_no_pool_open(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() while the first operation is still opening the pool: that pool is closed
    too and the operation fails as closed, instead of a live pool behind a closed store."""
    from psycopg_pool import AsyncConnectionPool

    pools: list[AsyncConnectionPool[Any]] = []
    opening = asyncio.Event()
    pool_open = AsyncConnectionPool.open

    async def slow_open(self: AsyncConnectionPool[Any], *args: Any, **kwargs: Any) -> None:
        pools.append(self)
        opening.set()
        await asyncio.sleep(0.1)  # close() lands here
        await pool_open(self, *args, **kwargs)

    monkeypatch.setattr(AsyncConnectionPool, "open", slow_open)
    journal = open_journal(pg_dsn)
    first = asyncio.create_task(journal.append("s", [raw(1)]))
    await opening.wait()
    await journal.close()
    with pytest.raises(StoreUnavailableError, match="closed"):
        await asyncio.wait_for(first, 10)
    assert len(pools) == 1 and pools[0].closed, "the first open's pool outlived close()"
