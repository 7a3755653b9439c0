"""The store contract, run against every backend we ship."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextfold.store import MemoryStore, SQLiteStore, Store
from contextfold.store.contract import StoreContract


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
