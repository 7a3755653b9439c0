"""Hostile input over real HTTP is refused with a 400 naming the place, and never stored."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.server import strict_json
from contextfold.server.body import MAX_META_CHARS
from tests.server.helpers import Running, Serve

ADDED = cf.ContextAdded.event_type


def _refusal(response: httpx.Response, kind: str = "RequestBodyError") -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == kind, error
    message: str = error["message"]
    return message


async def _post_bytes(server: Running, body: bytes, path: str = "/v1/streams/s/events") -> Any:
    return await server.client.post(
        path, content=body, headers={"Content-Type": "application/json"}
    )


@pytest.mark.parametrize(
    ("literal", "field"),
    [
        ("18446744073709551616", "events[0].payload.n"),
        ("-9223372036854775809", "events[0].payload.n"),
        ("[1, 99999999999999999999999]", "events[0].payload.n[1]"),
    ],
)
async def test_integers_beyond_64_bits_are_refused_not_rounded(
    server: Running, journal: cf.Journal, literal: str, field: str
) -> None:
    body = f'{{"events": [{{"type": "note", "payload": {{"n": {literal}}}}}]}}'.encode()
    message = _refusal(await _post_bytes(server, body))
    assert field in message and "64 bits" in message
    assert await journal.list_streams() == ()


async def test_the_64_bit_bounds_themselves_are_stored_exactly(
    server: Running, journal: cf.Journal
) -> None:
    body = b'{"events": [{"type": "note", "payload": {"hi": 18446744073709551615, '
    body += b'"lo": -9223372036854775808, "text": "12345678901234567890123: ok"}}]}'
    assert (await _post_bytes(server, body)).status_code == 201
    [event] = (await journal.read("s")).events
    assert event.payload == {
        "hi": 2**64 - 1,
        "lo": -(2**63),
        "text": "12345678901234567890123: ok",
    }


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"events": [{"type": "note", "payload": {"a": 1, "a": 2}}]}', "events[0].payload.a"),
        (b'{"events": [], "events": [{"type": "note", "payload": {}}]}', "events"),
        (
            b'{"events": [{"type": "note", "type": "contextfold.agent/llm-response", '
            b'"payload": {}}]}',
            "events[0].type",
        ),
    ],
)
async def test_duplicate_keys_are_refused(
    server: Running, journal: cf.Journal, body: bytes, field: str
) -> None:
    message = _refusal(await _post_bytes(server, body))
    assert field in message and "more than once" in message
    assert await journal.list_streams() == ()


@pytest.mark.parametrize("name", ["idempotency_key", "run_id", "actor"])
async def test_meta_strings_are_bounded(server: Running, journal: cf.Journal, name: str) -> None:
    note = {"type": "note", "payload": {}}
    # one small body would copy a large meta string into every one of its events
    body = {"events": [note] * 2000, name: "k" * (MAX_META_CHARS + 1)}
    message = _refusal(await server.client.post("/v1/streams/s/events", json=body))
    assert f'"{name}"' in message and str(MAX_META_CHARS) in message
    assert await journal.list_streams() == ()
    at_limit = {"events": [note], name: "k" * MAX_META_CHARS}
    assert (await server.client.post("/v1/streams/s/events", json=at_limit)).status_code == 201


@pytest.mark.parametrize(
    "target",
    ["/v1/streams/%ff/events", "/v1/streams/a%c3/events", "/v1/streams/s/events?after=%fe"],
)
async def test_paths_that_are_not_utf8_are_refused(
    server: Running, journal: cf.Journal, target: str
) -> None:
    raw = target.encode()
    for method in ("GET", "POST"):
        body = b'{"events": [{"type": "note", "payload": {}}]}' if method == "POST" else b""
        request = httpx.Request(
            method,
            server.url + target,
            content=body,
            headers={"Content-Type": "application/json"},
        )
        request.url = request.url.copy_with(raw_path=raw)  # sent exactly as written
        message = _refusal(await server.client.send(request), "InvalidInputError")
        assert "UTF-8" in message and target.rsplit("?", 1)[-1] in message
    assert await journal.list_streams() == ()


async def test_utf8_stream_names_are_still_served(server: Running, journal: cf.Journal) -> None:
    body = {"events": [{"type": "note", "payload": {}}]}
    response = await server.client.post("/v1/streams/caf%C3%A9/events", json=body)
    assert response.status_code == 201
    assert [info.stream for info in await journal.list_streams()] == ["café"]


@pytest.mark.parametrize("char", ["\u202e", "\u2066", "\u200b", "\ufeff", "\x85", "\x7f"])
async def test_names_with_hidden_characters_are_refused(
    server: Running, journal: cf.Journal, char: str
) -> None:
    """Bidi, zero-width and control characters in a stream or namespace name get
    400 from the library's one check, naming the character; nothing is stored."""
    quoted = "".join(f"%{byte:02X}" for byte in char.encode())
    body = {"events": [{"type": "note", "payload": {}}]}
    code = f"U+{ord(char):04X}"
    for method, target in (
        ("POST", f"/v1/streams/pay{quoted}ment/events"),
        ("GET", f"/v1/streams/pay{quoted}ment/tail"),
        ("GET", f"/v1/streams/pay{quoted}ment/context"),
        ("GET", f"/v1/streams?namespace=ten{quoted}ant"),
    ):
        request = server.client.build_request(
            method, target, json=body if method == "POST" else None
        )
        kind = "InvalidInputError" if "namespace" in target else "InvalidStreamNameError"
        assert code in _refusal(await server.client.send(request), kind), target
    assert await journal.list_streams() == ()


async def test_a_refused_host_gets_the_json_error_body(serve: Serve, journal: cf.Journal) -> None:
    async with serve() as server:
        for host in ("rebound.attacker.example", "127.0.0.1:notaport", ""):
            response = await server.client.get("/v1/streams", headers={"Host": host})
            assert response.headers["content-type"] == "application/json"
            message = _refusal(response, "HostNotAllowedError")
            assert "Host" in message
        posted = await server.client.post(
            "/v1/streams/s/events",
            json={"events": [{"type": "note", "payload": {}}]},
            headers={"Host": "rebound.attacker.example"},
        )
        assert "rebound.attacker.example" in _refusal(posted, "HostNotAllowedError")
    assert await journal.list_streams() == ()


async def test_a_request_without_a_host_header_is_refused_as_json(server: Running) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /v1/streams HTTP/1.0\r\n\r\n")
        reply = await asyncio.wait_for(reader.read(), 10)  # HTTP/1.0: closed after the answer
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(body)["error"]["type"] == "HostNotAllowedError"


# JSON values of every shape, with keys that may contain quotes, colons and escapes.
_KEYS = st.text(alphabet=st.sampled_from('ab":\\\u00e9 {}[],'), max_size=4)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.sampled_from('ab":\\\u00e9 0123456789'), max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_KEYS, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(value=_JSON, indent=st.booleans())
def test_strict_parsing_keeps_every_value_that_round_trips(value: Any, indent: bool) -> None:
    data = json.dumps(value, indent=2 if indent else None).encode()
    assert strict_json.loads(data) == orjson.loads(data)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    value=st.dictionaries(_KEYS, _JSON, min_size=1, max_size=4),
    big=st.integers(min_value=2**64) | st.integers(max_value=-(2**63) - 1),
    data=st.data(),
)
def test_strict_parsing_refuses_any_big_integer_or_repeated_key(
    value: dict[str, Any], big: int, data: st.DataObject
) -> None:
    key = data.draw(st.sampled_from(sorted(value)))
    with_big = json.dumps({**value, key: [value[key], big]}).encode()
    with pytest.raises(cf.StrictJsonError, match="64 bits"):
        strict_json.loads(with_big)
    body = json.dumps(value)
    repeated = f"{body[:-1]}, {json.dumps(key)}: null}}".encode()
    with pytest.raises(cf.StrictJsonError, match="more than once"):
        strict_json.loads(repeated)


def test_the_server_guide_states_the_limits() -> None:
    from pathlib import Path

    from contextfold.server.limits import DEFAULT_BODY_TIMEOUT
    from contextfold.server.protocol import DEFAULT_HEADER_TIMEOUT

    page = Path(__file__).parents[2] / "docs" / "how-to" / "server.md"
    guide = " ".join(page.read_text().split())
    assert f"at most {MAX_META_CHARS} characters" in guide
    assert f"`--header-timeout` seconds ({DEFAULT_HEADER_TIMEOUT:g})" in guide
    assert f"`body_timeout` seconds ({DEFAULT_BODY_TIMEOUT:g}; else 408)" in guide
