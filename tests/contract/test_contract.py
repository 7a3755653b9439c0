"""The store contract, run against every backend we ship and on the base class's defaults."""

from __future__ import annotations

import asyncio
import functools
from pathlib import Path

import pytest

from contextfold.events import StoredEvent
from contextfold.store import MemoryStore, SQLiteStore, Store
from contextfold.store.base import Wakeups
from contextfold.store.contract import StoreContract, new_event


class TestMemoryStore(StoreContract):
    def make_store(self) -> Store:
        return MemoryStore()


class TestSQLiteFileStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _path(self, tmp_path: Path) -> None:
        self.counter = 0
        self.dir = tmp_path

    def make_store(self) -> Store:
        self.counter += 1
        return SQLiteStore(self.dir / f"journal-{self.counter}.db")


class TestSQLiteInMemoryStore(StoreContract):
    def make_store(self) -> Store:
        return SQLiteStore(":memory:")


@pytest.mark.postgres
class TestPostgresStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _database(self, pg_dsn: str) -> None:
        self.dsn = pg_dsn

    def make_store(self) -> Store:
        from contextfold.store.postgres import PostgresStore

        return PostgresStore(self.dsn)


class _OnTheDefaults(MemoryStore):
    """The memory store on the base class's ``head`` and ``subscribe``: what a user's
    minimal backend gets without writing them."""

    head = Store.head


class TestStoreDefaults(StoreContract):
    def make_store(self) -> Store:
        return _OnTheDefaults()


class _Deaf(Wakeups):
    def notify(self, namespace: str, stream: str) -> None:
        pass


class _NeverNotifies(MemoryStore):
    """A backend that never wakes its tails: the default subscribe must poll."""

    @functools.cached_property
    def wakeups(self) -> Wakeups:
        return _Deaf()


async def test_the_default_tail_polls_a_backend_that_never_notifies() -> None:
    store = _NeverNotifies()
    assert type(store).subscribe is Store.subscribe
    await store.append(
        "ns", "s", [new_event("e", {"i": 0})], expected_version=None, idempotency_key=None
    )
    tail = store.subscribe("ns", "s", after=None, poll_interval=0.01)
    try:
        async with asyncio.timeout(10):
            first = await anext(tail)
            await store.append(
                "ns", "s", [new_event("e", {"i": 1})], expected_version=None, idempotency_key=None
            )
            second = await anext(tail)
    finally:
        await tail.aclose()  # type: ignore[attr-defined]
    assert isinstance(first, StoredEvent) and isinstance(second, StoredEvent)
    assert (first.payload, second.payload) == ({"i": 0}, {"i": 1})
