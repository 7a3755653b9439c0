"""Errors over real HTTP: one JSON shape, the documented status, and nothing written."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

import contextfold as cf
from contextfold.server import create_app
from tests.server.helpers import Running, Serve, running

EVENT = {"type": "note", "payload": {"text": "x"}}
JSON = {"Content-Type": "application/json"}


async def _assert_nothing_stored(journal: cf.Journal) -> None:
    assert await journal.list_streams() == ()


def _error(response: httpx.Response, status: int, kind: str) -> str:
    """The error message, after checking the status and the one JSON error shape."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == kind, error
    assert set(response.json()) == {"error"} and set(error) == {"type", "message"}
    message: str = error["message"]
    return message


@pytest.mark.parametrize(
    "content",
    [b"{", b"", b"not json", b'{"events": [', b"\xff\xfe"],
)
async def test_malformed_json_is_400(server: Running, journal: cf.Journal, content: bytes) -> None:
    response = await server.client.post("/v1/streams/s/events", content=content, headers=JSON)
    assert "not valid JSON" in _error(response, 400, "RequestBodyError")
    await _assert_nothing_stored(journal)


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"events": [EVENT], "expected": 1}, "'expected'"),
        ({"events": [{**EVENT, "meta": {}}]}, "'meta'"),
        ({"events": [{**EVENT, "actor": "x", "id": 1}]}, "'actor', 'id'"),
        ({"events": [EVENT, {"type": "t", "payload": 1, "position": 3}]}, "events[1]"),
    ],
)
async def test_unknown_fields_are_400(
    server: Running, journal: cf.Journal, body: object, names: str
) -> None:
    response = await server.client.post("/v1/streams/s/events", json=body)
    assert names in _error(response, 400, "RequestBodyError")
    await _assert_nothing_stored(journal)


@pytest.mark.parametrize(
    "body",
    [
        [EVENT],
        {"events": []},
        {"events": EVENT},
        {"events": [{"type": "t"}]},
        {"events": [{"payload": {}}]},
        {"events": [{"type": "", "payload": {}}]},
        {"events": [EVENT], "expected_version": -1},
        {"events": [EVENT], "expected_version": True},
        {"events": [EVENT], "idempotency_key": ""},
        {"events": [EVENT], "idempotency_key": 7},
    ],
)
async def test_wrong_shapes_are_400(server: Running, journal: cf.Journal, body: object) -> None:
    response = await server.client.post("/v1/streams/s/events", json=body)
    _error(response, 400, "RequestBodyError")
    await _assert_nothing_stored(journal)


async def test_a_payload_its_event_class_rejects_is_400(
    server: Running, journal: cf.Journal
) -> None:
    good = {"type": cf.ContextAdded.event_type, "payload": {"role": "user", "content": "hi"}}
    bad = {"type": cf.ContextAdded.event_type, "payload": {"role": "boss", "content": "hi"}}
    response = await server.client.post("/v1/streams/s/events", json={"events": [good, bad]})
    message = _error(response, 400, "PayloadError")
    assert "events[1]" in message and "role" in message
    await _assert_nothing_stored(journal)


async def test_bad_stream_names_and_types_are_400(server: Running, journal: cf.Journal) -> None:
    response = await server.client.post("/v1/streams/%20padded/events", json={"events": [EVENT]})
    _error(response, 400, "InvalidStreamNameError")
    response = await server.client.post(
        "/v1/streams/s/events", json={"events": [{"type": "bad\ntype", "payload": {}}]}
    )
    assert response.status_code == 400
    await _assert_nothing_stored(journal)


async def test_a_body_over_the_limit_is_413(serve: Serve, journal: cf.Journal) -> None:
    async with serve(max_body_bytes=1024) as srv:
        big = {"events": [{"type": "note", "payload": {"text": "x" * 2000}}]}
        response = await srv.client.post("/v1/streams/s/events", json=big)
        assert "1024" in _error(response, 413, "BodyTooLargeError")

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            yield b'{"events": [{"type": "note", "payload": "'
            for _ in range(10):
                yield b"y" * 200
            yield b'"}]}'

        chunked = await srv.client.post("/v1/streams/s/events", content=chunks(), headers=JSON)
        _error(chunked, 413, "BodyTooLargeError")
        small = await srv.client.post("/v1/streams/s/events", json={"events": [EVENT]})
        assert small.status_code == 201
    assert [info.stream for info in await journal.list_streams()] == ["s"]
    assert await journal.version("s") == 1


async def test_a_body_that_is_not_json_typed_is_415(server: Running, journal: cf.Journal) -> None:
    response = await server.client.post(
        "/v1/streams/s/events", content=b'{"events": []}', headers={"Content-Type": "text/plain"}
    )
    _error(response, 415, "UnsupportedMediaTypeError")
    await _assert_nothing_stored(journal)


async def test_bearer_token(serve: Serve, journal: cf.Journal) -> None:
    async with serve(token="s3cret") as srv:
        missing = await srv.client.post("/v1/streams/s/events", json={"events": [EVENT]})
        _error(missing, 401, "AuthenticationError")
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = await srv.client.get("/v1/streams", headers={"Authorization": "Bearer nope"})
        _error(wrong, 401, "AuthenticationError")
        basic = await srv.client.get("/v1/streams", headers={"Authorization": "Basic s3cret"})
        _error(basic, 401, "AuthenticationError")
        # the query token is for EventSource only: never on the JSON routes
        by_query = await srv.client.get("/v1/streams", params={"access_token": "s3cret"})
        _error(by_query, 401, "AuthenticationError")
        await _assert_nothing_stored(journal)

        auth = {"Authorization": "Bearer s3cret"}
        ok = await srv.client.post("/v1/streams/s/events", json={"events": [EVENT]}, headers=auth)
        assert ok.status_code == 201
        assert (await srv.client.get("/v1/streams", headers=auth)).status_code == 200
        # the inspector page holds no data and loads without the token
        assert (await srv.client.get("/")).status_code == 200
        async with srv.client.stream(
            "GET", "/v1/streams/s/tail", params={"access_token": "s3cret"}
        ) as tail:
            assert tail.status_code == 200
        async with srv.client.stream(
            "GET", "/v1/streams/s/tail", params={"access_token": "wrong"}
        ) as tail:
            assert tail.status_code == 401


async def test_unknown_routes_and_methods_are_json(server: Running) -> None:
    _error(await server.client.get("/v1/nothing"), 404, "NotFoundError")
    _error(await server.client.delete("/v1/streams/s/events"), 405, "MethodNotAllowedError")
    _error(await server.client.get("/v1/streams/s/requests/x"), 404, "NotFoundError")


async def test_bad_query_values_are_400(server: Running) -> None:
    for limit in ("0", "-1", "abc", "100000"):
        response = await server.client.get("/v1/streams/s/events", params={"limit": limit})
        assert f"limit={limit!r}" in _error(response, 400, "InvalidInputError")


async def test_an_untrusted_host_header_is_refused(serve: Serve) -> None:
    async with serve(allowed_hosts=["127.0.0.1"]) as srv:
        assert (await srv.client.get("/v1/streams")).status_code == 200
        evil = await srv.client.get("/v1/streams", headers={"Host": "evil.example"})
        assert evil.status_code == 400


async def test_the_token_guards_the_api_under_a_mount_prefix(journal: cf.Journal) -> None:
    mounted = Starlette(routes=[Mount("/cf", app=create_app(journal, token="s3cret"))])
    async with running(mounted) as srv:
        _error(await srv.client.get("/cf/v1/streams"), 401, "AuthenticationError")
        auth = {"Authorization": "Bearer s3cret"}
        assert (await srv.client.get("/cf/v1/streams", headers=auth)).status_code == 200
        assert (await srv.client.get("/cf/")).status_code == 200
        assert (await srv.client.get("/cf/inspector.js")).status_code == 200
