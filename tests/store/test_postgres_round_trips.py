"""PostgreSQL appends without an idempotency key are one statement in its own transaction
(no pipeline, no transaction block): one round trip, and concurrent ones still give every
stream gapless positions whose global positions grow with them."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from contextfold.events import Event, StoredEvent
from contextfold.journal import open_journal


class Note(Event, type="test.round-trips/note"):
    n: int = 0


def _n(stored: StoredEvent) -> int:
    event = stored.decode(Note)
    assert isinstance(event, Note)
    return event.n


@pytest.fixture
def driver_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """How often the store's connections run a statement, open a pipeline or a transaction."""
    calls: Counter[str] = Counter()

    def spy(name: str, method: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
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
