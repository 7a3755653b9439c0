"""The transcript store contract, run against every backend we ship."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from contextfold.transcript import MemoryTranscriptStore, SQLiteTranscriptStore, TranscriptStore
from contextfold.transcript.store.contract import TranscriptStoreContract

if TYPE_CHECKING:
    from tests.pgserver import TemporaryPostgres


class TestMemoryTranscriptStore(TranscriptStoreContract):
    def make_store(self) -> TranscriptStore:
        return MemoryTranscriptStore()


class TestSQLiteFileTranscriptStore(TranscriptStoreContract):
    @pytest.fixture(autouse=True)
    def _path(self, tmp_path: Path) -> None:
        self.counter = 0
        self.dir = tmp_path

    def make_store(self) -> TranscriptStore:
        self.counter += 1
        return SQLiteTranscriptStore(self.dir / f"transcript-{self.counter}.db")


class TestSQLiteInMemoryTranscriptStore(TranscriptStoreContract):
    def make_store(self) -> TranscriptStore:
        return SQLiteTranscriptStore(":memory:")


@pytest.mark.postgres
class TestPostgresTranscriptStore(TranscriptStoreContract):
    @pytest.fixture(autouse=True)
    def _database(self, pg_dsn: str) -> None:
        self.dsn = pg_dsn

    def make_store(self) -> TranscriptStore:
        from contextfold.transcript.store.postgres import PostgresTranscriptStore

        return PostgresTranscriptStore(self.dsn)


@pytest.fixture
def icu_dsn(pg_server: TemporaryPostgres) -> Iterator[str]:
    """A fresh database whose default collation is ICU's en-US, not code point order."""
    import secrets

    import psycopg
    from psycopg import sql

    name = f"cf_icu_{secrets.token_hex(6)}"
    create = "CREATE DATABASE {} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US'"
    with psycopg.connect(pg_server.admin_dsn, autocommit=True) as admin:
        try:
            admin.execute(sql.SQL(create + " LOCALE 'C'").format(sql.Identifier(name)))
        except psycopg.Error as exc:
            pytest.skip(f"this PostgreSQL server cannot create an ICU database: {exc}")
    try:
        yield pg_server.dsn_for(name)
    finally:
        pg_server.drop_database(name)


@pytest.mark.postgres
class TestPostgresICUTranscriptStore(TranscriptStoreContract):
    """Times and names compare by code point whatever the database's locale."""

    @pytest.fixture(autouse=True)
    def _database(self, icu_dsn: str) -> None:
        self.dsn = icu_dsn

    def make_store(self) -> TranscriptStore:
        from contextfold.transcript.store.postgres import PostgresTranscriptStore

        return PostgresTranscriptStore(self.dsn)
