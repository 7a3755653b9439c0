"""The transcript store contract, run against every backend we ship."""

from __future__ import annotations

from pathlib import Path

import pytest

from contextfold.transcript import MemoryTranscriptStore, SQLiteTranscriptStore, TranscriptStore
from contextfold.transcript.store.contract import TranscriptStoreContract


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
