"""A store's push channel as the journal offers it (``change_key``, ``listen_changes``): what
a worker listens to. PostgreSQL has one (its NOTIFYs); the other stores say they have none."""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg
import pytest

import contextfold as cf
from contextfold.errors import StoreError, StoreUnavailableError
from contextfold.journal import open_journal
from contextfold.store.base import StreamChange
from contextfold.store.postgres import NOTIFY_CHANNEL


def raw(i: int) -> cf.RawEvent:
    return cf.RawEvent("note", {"i": i})


async def test_stores_without_a_push_channel_say_so(tmp_path: Path) -> None:
    for url in ("memory://", f"sqlite:///{tmp_path / 'j.db'}"):
        journal = open_journal(url)
        try:
            assert journal.listen_changes() is None
            assert journal.change_key("s") is None
        finally:
            await journal.close()
    with cf.open_journal_sync("memory://") as sync:
        assert sync.listen_changes() is None and sync.change_key("s") is None


async def test_a_listener_hears_every_append_and_deletion_with_version_and_head(
    pg_dsn: str,
) -> None:
    journal = open_journal(pg_dsn)
    try:
        key = journal.change_key("s")
        assert key is not None
        assert key not in {journal.change_key("t"), journal.with_namespace("n").change_key("s")}
        listening = journal.listen_changes()
        assert listening is not None
        async with listening as changes:
            done = await journal.append("s", [raw(1), raw(2)])
            heard = await asyncio.wait_for(anext(changes), 30)
            assert heard == StreamChange(key, 2, int(done.cursor))
            await journal.delete_stream("s")
            assert await asyncio.wait_for(anext(changes), 30) == StreamChange(key, 0, None)
    finally:
        await journal.close()


async def test_a_lost_listening_connection_ends_the_changes_with_a_store_error(
    pg_dsn: str,
) -> None:
    journal = open_journal(pg_dsn)
    try:
        listening = journal.listen_changes()
        assert listening is not None
        async with listening as changes:
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query = %s "
                    "AND datname = current_database() AND pid <> pg_backend_pid()",
                    (f"LISTEN {NOTIFY_CHANNEL}",),
                )
            with pytest.raises(StoreError):
                await asyncio.wait_for(anext(changes), 30)
    finally:
        await journal.close()


async def test_listening_to_a_server_out_of_reach_raises_store_unavailable() -> None:
    journal = open_journal("postgresql://contextfold@127.0.0.1:1/nothing")
    listening = journal.listen_changes()
    assert listening is not None
    with pytest.raises(StoreUnavailableError, match="listening for changes"):
        async with listening:
            pass


def test_the_sync_journal_listens_on_its_loop(pg_dsn: str) -> None:
    with cf.open_journal_sync(pg_dsn) as journal:
        listening = journal.listen_changes()
        assert listening is not None
        with listening as changes:
            done = journal.append("s", raw(1))
            assert next(changes) == StreamChange(journal.change_key("s") or "", 1, int(done.cursor))
