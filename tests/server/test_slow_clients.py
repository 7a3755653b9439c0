"""Slow and silent clients cannot lock the others out: idle connections count for nothing
and are closed, bodies have a deadline, and requests in flight are bounded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import httpx
import pytest

import contextfold as cf
from contextfold.server import create_app
from tests.server.helpers import Running, running

IDLE_SOCKETS = 250
NOTE = b'{"events": [{"type": "note", "payload": {}}]}'


def _port(server: Running) -> int:
    return int(server.url.rsplit(":", 1)[1])


@asynccontextmanager
async def _connections(
    server: Running, count: int, first_bytes: bytes = b""
) -> AsyncIterator[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
    """``count`` connections to the server that send ``first_bytes`` and then nothing;
    all closed when the block ends."""
    opened: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    try:
        for _ in range(count):
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(server))
            opened.append((reader, writer))
            if first_bytes:
                writer.write(first_bytes)
                await writer.drain()
        yield opened
    finally:
        for _, writer in opened:
            writer.close()
        for _, writer in opened:
            with suppress(OSError):  # already reset by the server
                await writer.wait_closed()


async def _answer(reader: asyncio.StreamReader) -> bytes:
    """Everything the server sends until it closes the connection (bounded wait).

    A reset counts as the close it is: when the server's deadline fires before the
    client's last bytes arrive, its kernel answers them with RST instead of FIN."""
    received = bytearray()
    with suppress(ConnectionResetError):
        while chunk := await asyncio.wait_for(reader.read(65536), 30):
            received += chunk
    return bytes(received)


async def test_idle_connections_do_not_lock_out_a_real_request(journal: cf.Journal) -> None:
    app = create_app(journal, token="t0ken")
    auth = {"Authorization": "Bearer t0ken"}
    async with (
        running(app) as server,
        _connections(server, IDLE_SOCKETS // 2) as silent,
        _connections(
            server, IDLE_SOCKETS // 2, b"GET /v1/streams HTTP/1.1\r\nHost: loc"
        ) as partial,
    ):
        assert len(silent) + len(partial) == IDLE_SOCKETS
        response = await server.client.get("/v1/streams", headers=auth)  # 10 s at most
        assert response.status_code == 200, response.text
        posted = await server.client.post(
            "/v1/streams/s/events",
            content=NOTE,
            headers={**auth, "Content-Type": "application/json"},
        )
        assert posted.status_code == 201
        # the silent ones are still open: nothing was answered on them
        assert not any(reader.at_eof() for reader, _ in (*silent, *partial))


async def test_connections_that_do_not_send_their_headers_in_time_are_closed(
    journal: cf.Journal,
) -> None:
    async with (
        running(create_app(journal), header_timeout=0.5) as server,
        _connections(server, 5) as silent,
        _connections(server, 5, b"GET /v1/streams HTTP/1.1\r\nHost: 127.0.0.1\r\n") as partial,
        _connections(server, 1, b"GET /v1/streams HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") as kept,
    ):
        for reader, _ in (*silent, *partial):
            assert await _answer(reader) == b""  # closed without an answer
        [(reader, writer)] = kept
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert head.startswith(b"HTTP/1.1 200")
        # kept alive, then the next request's headers stall: closed as well
        writer.write(b"GET /v1/streams HTTP/1.1\r\n")
        rest = await _answer(reader)
        assert b"HTTP/1.1" not in rest.split(b"\r\n\r\n", 1)[-1]


async def test_a_body_that_does_not_arrive_in_time_gets_408(journal: cf.Journal) -> None:
    async with (
        running(create_app(journal, body_timeout=0.5)) as server,
        _connections(server, 1) as [(reader, writer)],
    ):
        writer.write(
            b"POST /v1/streams/s/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 200\r\n\r\n" + NOTE[:10]
        )
        answer = await _answer(reader)  # closed after the answer
        assert answer.startswith(b"HTTP/1.1 408")
        assert b'"RequestTimeoutError"' in answer
    assert await journal.list_streams() == ()


async def _stalled_post(server: Running) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", _port(server))
    writer.write(
        b"POST /v1/streams/s/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(NOTE) + NOTE[:5]
    )
    await writer.drain()
    return reader, writer


async def _status_becomes(client: httpx.AsyncClient, status: int) -> httpx.Response:
    """GET /v1/streams until it answers ``status`` (the stalled requests reach the app
    asynchronously); the last response."""
    for _ in range(500):
        response = await client.get("/v1/streams")
        if response.status_code == status:
            return response
        await asyncio.sleep(0.02)
    return response


@pytest.mark.parametrize(
    ("limits", "status", "kind"),
    [
        ({"max_requests": 2, "max_client_requests": 5}, 503, "ServerBusyError"),
        ({"max_requests": 10, "max_client_requests": 2}, 429, "TooManyRequestsError"),
    ],
)
async def test_requests_in_flight_are_bounded(
    journal: cf.Journal, limits: dict[str, Any], status: int, kind: str
) -> None:
    app = create_app(journal, body_timeout=60, **limits)
    async with running(app) as server:
        stalled = [await _stalled_post(server), await _stalled_post(server)]
        try:
            full = await _status_becomes(server.client, status)
            assert full.status_code == status and full.json()["error"]["type"] == kind
            assert full.headers["retry-after"] == "1"
            if status == 429:  # another client address is still served
                other = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
                async with httpx.AsyncClient(
                    base_url=server.url, transport=other, timeout=10
                ) as second:
                    assert (await second.get("/v1/streams")).status_code == 200
            reader, writer = stalled[0]
            writer.write(NOTE[5:])  # one body completes: its slot frees
            assert (await asyncio.wait_for(reader.readline(), 30)).startswith(b"HTTP/1.1 201")
            assert (await _status_becomes(server.client, 200)).status_code == 200
        finally:
            for _, writer in stalled:
                writer.close()
    assert [info.version for info in await journal.list_streams()] == [1]


@pytest.mark.parametrize("option", ["max_requests", "max_client_requests", "body_timeout"])
@pytest.mark.parametrize("value", [0, -1, True])
async def test_limits_must_be_positive(journal: cf.Journal, option: str, value: object) -> None:
    with pytest.raises(ValueError, match=option):
        create_app(journal, **{option: value})  # type: ignore[arg-type]
