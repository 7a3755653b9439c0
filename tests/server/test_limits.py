"""Exposure and limits: loopback hosts by default, settings checked, stream slots, namespaces."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx
import pytest

import contextfold as cf
from contextfold.errors import InvalidInputError
from contextfold.server import create_app, runner, serve_async, sessions
from contextfold.server.protocol import HeaderTimeoutProtocol
from contextfold.transcript import TranscriptBus
from tests.server.helpers import Running, Serve, SseReader, running

NOTE = {"events": [{"type": "note", "payload": {}}]}


def _error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == kind, error
    message: str = error["message"]
    return message


async def test_without_a_token_only_loopback_hosts_are_served(serve: Serve) -> None:
    async with serve() as server:
        rebound = {"Host": "rebound.attacker.example"}
        assert (await server.client.get("/v1/streams", headers=rebound)).status_code == 400
        posted = await server.client.post("/v1/streams/s/events", json=NOTE, headers=rebound)
        assert posted.status_code == 400
        for host in ("localhost:8765", "127.0.0.1", "[::1]:8765"):
            assert (
                await server.client.get("/v1/streams", headers={"Host": host})
            ).status_code == 200
    async with serve(token="s3cret") as guarded:  # a token guards any host name
        auth = {"Host": "cf.example.com", "Authorization": "Bearer s3cret"}
        assert (await guarded.client.get("/v1/streams", headers=auth)).status_code == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.5", "example.com"])
async def test_serve_refuses_a_public_address_without_a_token(host: str) -> None:
    with pytest.raises(InvalidInputError, match="--token"):
        await asyncio.wait_for(serve_async("memory://", host, 0), 5)


@pytest.mark.parametrize(
    ("host", "extra"), [("127.0.0.1", None), ("127.0.0.2", "127.0.0.2"), ("::1", None)]
)
async def test_serve_accepts_its_loopback_address_and_limits_requests(
    monkeypatch: pytest.MonkeyPatch, host: str, extra: str | None
) -> None:
    seen: dict[str, Any] = {}

    class FakeServer:
        def __init__(self, config: Any, streams: Any) -> None:
            seen["config"] = config

        async def serve(self) -> None:
            seen["hosts"] = runner._allowed_hosts(host, False)

    def capture(journal: cf.Journal, **options: Any) -> Any:
        seen["options"] = options
        return create_app(journal, **options)

    monkeypatch.setattr(runner, "_Server", FakeServer)
    monkeypatch.setattr(runner, "create_app", capture)
    await serve_async(
        "memory://", host, 0, max_live_streams=7, extra_connections=3, header_timeout=4
    )
    # requests in flight are limited, not connections: idle sockets never count
    assert seen["options"]["max_requests"] == 10
    assert seen["config"].limit_concurrency is None
    assert issubclass(seen["config"].http, HeaderTimeoutProtocol)
    assert seen["config"].http.header_timeout == 4
    assert {"localhost", "127.0.0.1", "[::1]"} <= set(seen["hosts"])
    if extra is not None:
        assert extra in seen["hosts"]


@pytest.mark.parametrize("option", ["heartbeat", "tail_poll_interval"])
@pytest.mark.parametrize("value", [0, -1.0, math.inf, math.nan, True, "1"])
async def test_intervals_must_be_positive_and_finite(
    journal: cf.Journal, option: str, value: object
) -> None:
    with pytest.raises(ValueError, match=option):
        create_app(journal, **{option: value})  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -1, True, 1.5])
async def test_max_live_streams_must_be_a_positive_int(journal: cf.Journal, value: object) -> None:
    with pytest.raises(ValueError, match="max_live_streams"):
        create_app(journal, max_live_streams=value)  # type: ignore[arg-type]


async def test_session_routes_check_the_namespace(journal: cf.Journal) -> None:
    bus = TranscriptBus()
    async with running(create_app(journal, bus=bus)) as server:
        response = await server.client.get(
            "/v1/sessions/chat/live", headers={"X-Contextfold-Namespace": "n" * 600}
        )
        assert "namespace" in _error(response, 400, "InvalidInputError")
        assert bus.subscribers("chat", namespace="n" * 600) == 0


async def test_a_live_stream_that_fails_to_start_leaves_no_subscription(
    journal: cf.Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("response failed")

    monkeypatch.setattr(sessions, "EventStreamResponse", broken)
    bus = TranscriptBus()
    async with running(create_app(journal, bus=bus)) as server:
        response = await server.client.get("/v1/sessions/chat/live")
        assert response.status_code == 500
        assert bus.subscribers("chat") == 0


async def test_live_streams_share_a_limit(journal: cf.Journal) -> None:
    bus = TranscriptBus()
    async with running(create_app(journal, bus=bus, max_live_streams=1)) as server:
        async with server.client.stream("GET", "/v1/streams/s/tail") as first:
            assert first.status_code == 200
            for path in ("/v1/streams/s/tail", "/v1/sessions/chat/live"):
                full = await server.client.get(path)
                assert "live streams" in _error(full, 503, "TooManyStreamsError")
            assert (await server.client.get("/v1/streams")).status_code == 200
        # the slot is free again once the first stream is gone
        for _ in range(100):
            async with server.client.stream("GET", "/v1/sessions/chat/live") as again:
                if again.status_code == 200:
                    break
            await asyncio.sleep(0.05)
        assert again.status_code == 200


async def test_namespaces_outside_the_allow_list_are_forbidden(
    serve: Serve, journal: cf.Journal
) -> None:
    async with serve(namespaces=["team-a"], bus=TranscriptBus()) as server:
        for namespace in ("team-b", None):  # None: the journal's default namespace
            headers = {} if namespace is None else {"X-Contextfold-Namespace": namespace}
            for method, path in (
                ("GET", "/v1/streams"),
                ("POST", "/v1/streams/s/events"),
                ("GET", "/v1/streams/s/tail"),
                ("GET", "/v1/sessions/chat/live"),
            ):
                response = await server.client.request(
                    method, path, headers=headers, json=NOTE if method == "POST" else None
                )
                assert "namespace" in _error(response, 403, "ForbiddenError")
        assert await journal.list_streams() == ()
        allowed = {"X-Contextfold-Namespace": "team-a"}
        posted = await server.client.post("/v1/streams/s/events", json=NOTE, headers=allowed)
        assert posted.status_code == 201
    with pytest.raises(ValueError):
        create_app(journal, namespaces="team-a")


async def test_running_is_unchanged_for_the_default_server(server: Running) -> None:
    assert (await server.client.post("/v1/streams/s/events", json=NOTE)).status_code == 201


async def test_closing_the_live_streams_ends_them_cleanly(journal: cf.Journal) -> None:
    app = create_app(journal, bus=TranscriptBus())
    async with (
        running(app) as server,
        server.client.stream("GET", "/v1/streams/s/tail") as tail,
        server.client.stream("GET", "/v1/sessions/chat/live") as live,
    ):
        readers = [SseReader(tail), SseReader(live)]
        for reader in readers:
            assert await reader.next_comment() == "stream open"
        app.state.live_streams.close()  # what the runner does as shutdown begins
        for reader in readers:
            assert await reader.rest() == []  # ended, not cut: no RemoteProtocolError
        late = await server.client.get("/v1/streams/s/tail")
        assert late.status_code == 200 and late.text == ": stream open\n\n"  # ends at once
