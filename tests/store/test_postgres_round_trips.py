"""PostgreSQL appends without an idempotency key are one statement in its own transaction
(no pipeline, no transaction block): one round trip, and concurrent ones still give every
stream gapless positions whose global positions grow with them. Their NOTIFY is sent
after their commit, never inside their transaction (where PostgreSQL's notification lock
would make every append of the database commit one at a time)."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from contextlib import aclosing
from typing import Any

import psycopg
import pytest

from contextfold.events import Event, StoredEvent
from contextfold.journal import open_journal
from contextfold.store.postgres import NOTIFY_CHANNEL, PostgresStore, Wake, parse_wake, wake_key


class Note(Event, type="test.round-trips/note"):
    n: int = 0


def _n(stored: StoredEvent) -> int:
    event = stored.decode(Note)
    assert isinstance(event, Note)
    return event.n


@pytest.fixture
def driver_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """How often the store's connections run a statement, open a pipeline or a transaction
    (the wake-ups sent after appends left out)."""
    calls: Counter[str] = Counter()

    def spy(name: str, method: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if not (len(args) > 1 and "pg_notify" in str(args[1])):
                calls[name] += 1
            return method(*args, **kwargs)

        return counted

    # Every statement goes through a cursor's execute (a connection's too).
    for cls, attr in (
        (psycopg.AsyncCursor, "execute"),
        (psycopg.AsyncConnection, "pipeline"),
        (psycopg.AsyncConnection, "transaction"),
    ):
        monkeypatch.setattr(cls, attr, spy(attr, getattr(cls, attr)))
    yield calls


async def test_an_append_without_a_key_is_one_statement(
    pg_dsn: str, driver_calls: Counter[str]
) -> None:
    async with open_journal(pg_dsn) as journal:
        await journal.append("s", Note(n=0))  # the schema is in place
        for expected in (None, 3):
            driver_calls.clear()
            await journal.append("s", [Note(n=1), Note(n=2)], expected_version=expected)
            assert driver_calls == {"execute": 1}, expected
        driver_calls.clear()
        await journal.append("s", Note(n=3), idempotency_key="k")
        # The key is checked under the stream's lock: three statements, pipelined.
        assert driver_calls["execute"] == 3 and driver_calls["pipeline"] > 0
        assert [_n(e) for e in (await journal.read("s")).events] == [0, 1, 2, 1, 2, 3]


async def test_concurrent_appends_to_one_stream_are_gapless_in_global_order(
    pg_dsn: str,
) -> None:
    async with open_journal(pg_dsn) as first, open_journal(pg_dsn) as second:
        await first.append("s", Note())
        writers = [first, second] * 10
        await asyncio.gather(
            *(j.append("s", [Note(n=i), Note(n=i)]) for i, j in enumerate(writers))
        )
        events = (await first.read("s")).events
        assert [e.position for e in events] == list(range(1, 2 * len(writers) + 2))
        globals_ = [e.global_position for e in events]
        assert globals_ == sorted(globals_)
        pairs = [_n(e) for e in events[1:]]
        assert all(a == b for a, b in zip(pairs[::2], pairs[1::2], strict=True))


async def test_an_append_notifies_after_its_transaction_not_inside_it(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as listener:
        await listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        async with aclosing(listener.notifies()) as notifies, open_journal(pg_dsn) as journal:
            await journal.append("s", Note(n=1))  # notified once committed
            first = await asyncio.wait_for(anext(notifies), 30)
            assert parse_wake(first.payload).key == wake_key("default", "s")
            posted: list[str] = []
            monkeypatch.setattr(PostgresStore, "_post", lambda self, key, *_: posted.append(key))
            await journal.append("t", Note(n=2))  # its transaction sends nothing itself
            async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as other:
                await other.execute("SELECT pg_notify(%s, 'marker')", (NOTIFY_CHANNEL,))
            second = await asyncio.wait_for(anext(notifies), 30)
            assert second.payload == "marker" and posted == [wake_key("default", "t")]


async def test_wake_ups_of_appends_committing_together_share_a_statement(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[str] = []
    execute = psycopg.AsyncCursor.execute

    def spy(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if "pg_notify" in str(query):
            sent.append(str(query))
        return execute(cursor, query, *args, **kwargs)

    streams = [f"s{n}" for n in range(10)]
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as listener:
        await listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        async with aclosing(listener.notifies()) as notifies, open_journal(pg_dsn) as journal:
            await journal.append("warm", Note())  # the schema and the pool are ready
            assert (await asyncio.wait_for(anext(notifies), 30)).payload
            monkeypatch.setattr(psycopg.AsyncCursor, "execute", spy)
            await asyncio.gather(*(journal.append(s, Note()) for s in streams))
            woken = {(await asyncio.wait_for(anext(notifies), 30)).payload for _ in streams}
    assert {parse_wake(p).key for p in woken} == {wake_key("default", s) for s in streams}
    assert 1 <= len(sent) < len(streams)


async def test_a_notification_names_the_streams_version_and_head_after_the_change(
    pg_dsn: str,
) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as listener:
        await listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
        async with aclosing(listener.notifies()) as notifies, open_journal(pg_dsn) as journal:
            key = wake_key("default", "s")
            done = await journal.append("s", [Note(n=1), Note(n=2)])
            heard = parse_wake((await asyncio.wait_for(anext(notifies), 30)).payload)
            assert heard == Wake(key, 2, int(done.cursor))
            # Appends committing close together share one, naming the newest.
            results = [await journal.append("s", Note(n=n)) for n in range(3)]
            newest = results[-1]
            while heard.head != int(newest.cursor):
                heard = parse_wake((await asyncio.wait_for(anext(notifies), 30)).payload)
                assert heard.key == key and heard.head is not None
                assert heard.head in {int(r.cursor) for r in results}
            assert heard.version == newest.version == 5
            await journal.delete_stream("s")
            deleted = parse_wake((await asyncio.wait_for(anext(notifies), 30)).payload)
            assert deleted == Wake(key, 0, None)


def test_a_payload_of_another_shape_is_a_bare_key() -> None:
    assert parse_wake("abc") == Wake("abc", None, None)
    assert parse_wake("abc x 3") == Wake("abc", None, None)
    assert parse_wake("abc 4 y") == Wake("abc", 4, None)
    assert parse_wake("abc 4 12") == Wake("abc", 4, 12)


async def test_an_append_says_every_global_position_it_drew_and_the_event_before(
    pg_dsn: str,
) -> None:
    async with open_journal(pg_dsn) as journal:
        first = await journal.append("s", [Note(n=0), Note(n=1)])
        assert first.previous is None  # the stream's first events
        others = [journal.append(f"other-{n}", [Note(), Note(), Note()]) for n in range(8)]
        second_append = journal.append("s", [Note(n=2), Note(n=3)], expected_version=2)
        results = await asyncio.gather(*others, second_append)
        second = results[-1]
        one = await journal.append("s", Note(n=4), expected_version=4)
        # With no check, its snapshot may predate a delete and recreate it waited out.
        loose = await journal.append("s", Note(n=5))
        events = (await journal.read("s")).events
    assert loose.previous is None and loose.cursor == events[5].cursor
    cursors = [e.cursor for e in events]
    assert first.cursors == tuple(cursors[:2]) and second.cursors == tuple(cursors[2:4])
    assert second.previous == cursors[1] and one.previous == cursors[3]
    assert one.cursors == () and one.cursor == cursors[4]


async def test_a_read_after_the_journals_own_append_checks_only_the_head(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Other streams' appends draw global positions in between (so they are not
    consecutive), yet the store says where a batch landed and which event it follows: the
    journal folds its own append into the cached state, and the next read asks only for the
    head."""
    from contextfold.folds.fold import Fold

    notes: Fold[tuple[int, ...]] = Fold("round_trips_notes", state=tuple[int, ...], initial=tuple)
    notes.on(Note)(lambda state, ev: (*state, ev.payload.n))
    async with open_journal(pg_dsn) as journal, open_journal(pg_dsn) as other:
        await journal.append("s", Note(n=0))
        assert await journal.fold(notes, "s") == (0,)
        for n in range(1, 4):
            await other.append("elsewhere", Note())  # a gap in the global positions
            # At an expected version: one with no check may have waited out a recreate.
            await journal.append("s", [Note(n=n), Note(n=n)], expected_version=2 * n - 1)
        asked: list[str] = []
        for name in ("read", "head"):

            def spy(method: Any, name: str = name) -> Any:
                async def call(*args: Any, **kwargs: Any) -> Any:
                    asked.append(name)
                    return await method(*args, **kwargs)

                return call

            monkeypatch.setattr(journal.store, name, spy(getattr(journal.store, name)))
        assert await journal.fold(notes, "s") == (0, 1, 1, 2, 2, 3, 3)
        assert asked == ["head"]


def _executed(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every node of an EXPLAIN ANALYZE plan that ran at least once."""
    if plan.get("Actual Loops", 0) > 0:
        yield plan
    for child in plan.get("Plans", ()):
        yield from _executed(child)


def _append_plan(dsn: str, sql: str, namespace: str, n: int, expected: int | None) -> list[Any]:
    """The executed nodes of an append statement of ``n`` events to stream ``s`` (rolled back)."""
    args: dict[str, Any] = {"ns": namespace, "s": "s", "n": n, "key": None, "digest": None}
    args.update(types=["t"] * n, data=[b"{}"] * n, ids=[f"id-{i}" for i in range(n)])
    args.update(times=["2026-01-01T00:00:00+00:00"] * n, runs=[None] * n, actors=[None] * n)
    args.update(keys=[None] * n, chans=["main"] * n, expected=expected)
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", args).fetchone()
        conn.rollback()
    assert row is not None
    return list(_executed(row[0][0]["Plan"]))


async def test_an_append_passes_over_the_rows_it_inserted_once(pg_dsn: str) -> None:
    """Its cursors come from the insert's own returned rows: no second pass over them to
    aggregate, and the event before the batch is looked up only where it is reported."""
    from contextfold.store._postgres_sql import _INSERT_ANY, _INSERT_AT

    async with open_journal(pg_dsn) as journal:
        await journal.append("s", [Note(), Note()])
        namespace = journal.namespace
    for sql, expected, lookups in ((_INSERT_ANY, None, 0), (_INSERT_AT, 2, 1)):
        nodes = _append_plan(pg_dsn, sql, namespace, 10, expected)
        scanned = [
            node["Actual Rows"] * node["Actual Loops"]
            for node in nodes
            if node["Node Type"] == "CTE Scan" and node.get("CTE Name") == "ins"
        ]
        assert scanned == [10], (sql, scanned)
        looked_up = [
            node
            for node in nodes
            if node["Node Type"].startswith("Index") and node.get("Relation Name") == "cf_events"
        ]
        assert len(looked_up) == lookups, (sql, looked_up)
