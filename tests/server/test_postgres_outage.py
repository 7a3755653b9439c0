"""The HTTP API over PostgreSQL while the database is down (the suite's real server,
halted): each request is answered 503 within the pool timeout, with the JSON error, and
the first request once the database is back up is answered 200."""

from __future__ import annotations

import pytest

import contextfold as cf
from contextfold.server import create_app
from tests.pgserver import TemporaryPostgres
from tests.server.helpers import running


async def test_an_outage_is_answered_503_and_the_next_request_after_it_200(
    pg_server: TemporaryPostgres, pg_dsn: str
) -> None:
    if pg_server.external:
        pytest.skip("only the suite's own server can be halted")
    async with cf.open_journal(pg_dsn, timeout=1.0, max_size=2) as journal:
        await journal.append("s", cf.RawEvent("note", {}))
        async with running(create_app(journal)) as server:
            assert (await server.client.get("/v1/streams")).status_code == 200
            pg_server.halt()
            messages = []
            try:
                for _ in range(3):
                    down = await server.client.get("/v1/streams")
                    assert down.status_code == 503, down.text
                    error = down.json()["error"]
                    assert error["type"] == "StoreUnavailableError"
                    assert "is unavailable while listing the streams" in error["message"]
                    messages.append(error["message"])
            finally:
                pg_server.resume()
            # past the pooled connection the server dropped: no connection within 1 s
            assert "couldn't get a connection after 1.00 sec" in messages[-1], messages
            up = await server.client.get("/v1/streams")
            assert up.status_code == 200, up.text
            assert up.json() == {"streams": [{"stream": "s", "version": 1}], "next": None}
