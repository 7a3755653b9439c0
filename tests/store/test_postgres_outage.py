"""A PostgreSQL outage, on the suite's real server halted and resumed: a call while the
database is down raises StoreUnavailableError within the configured pool timeout (the
pool's own setting, not a guess), and the first call once it is back up succeeds (the
pool does not sit out a long reconnection backoff)."""

from __future__ import annotations

import pytest

import contextfold as cf
from contextfold.errors import StoreUnavailableError
from contextfold.store.postgres import PostgresStore
from tests.pgserver import TemporaryPostgres


async def test_an_outage_is_unavailable_within_the_pool_timeout_and_recovery_is_at_once(
    pg_server: TemporaryPostgres, pg_dsn: str
) -> None:
    if pg_server.external:
        pytest.skip("only the suite's own server can be halted")
    url = f"{pg_dsn}{'&' if '?' in pg_dsn else '?'}pool_timeout=1.5"
    async with cf.open_journal(url, max_size=2) as journal:
        await journal.append("s", cf.RawEvent("note", {"n": 1}))
        store = journal.store
        assert isinstance(store, PostgresStore) and store._pool is not None
        pool = store._pool
        # the URL's seconds are what the pool waits, and how long it retries a connection
        assert (pool.timeout, pool.reconnect_timeout) == (1.5, 1.5)
        assert isinstance(pool.kwargs, dict) and pool.kwargs["connect_timeout"] == 2
        assert isinstance(pool.conninfo, str) and "pool_timeout" not in pool.conninfo
        pg_server.halt()
        try:
            # the pooled connection the server dropped, then no connection to be had
            for _ in range(3):
                with pytest.raises(StoreUnavailableError, match="is unavailable while"):
                    await journal.version("s")
            with pytest.raises(StoreUnavailableError, match=r"connection after 1\.50 sec"):
                await journal.version("s")
        finally:
            pg_server.resume()
        assert await journal.version("s") == 1
        await journal.append("s", cf.RawEvent("note", {"n": 2}))
        assert [e.payload for e in (await journal.read("s")).events] == [{"n": 1}, {"n": 2}]


async def test_the_default_pool_timeout_is_a_few_seconds(pg_dsn: str) -> None:
    async with cf.open_journal(pg_dsn) as journal:
        store = journal.store
        assert isinstance(store, PostgresStore) and store._pool is not None
        assert (store._pool.timeout, store._pool.reconnect_timeout) == (5.0, 5.0)
