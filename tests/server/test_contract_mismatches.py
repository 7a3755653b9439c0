"""What the OpenAPI document promises and the server once did otherwise (each found by
schemathesis): a namespace header outside printable ASCII, the methods ``OPTIONS``
allows, the headers of a request's manifest view, an integral ``expected_version``."""

from __future__ import annotations

import re
from typing import Any

import pytest

import contextfold as cf
from contextfold.server.body import NAMESPACE_HEADER, NAMESPACE_HEADER_PATTERN
from contextfold.server.openapi import openapi_schema
from contextfold.server.streams import MANIFEST_HEADER, SHA256_HEADER, TRANSPORT_HEADER
from tests.server.helpers import Running

EVENT = {"type": "note", "payload": {"i": 1}}


def _header_schema(document: dict[str, Any]) -> dict[str, Any]:
    parameters = document["paths"]["/v1/streams/{stream}/events"]["get"]["parameters"]
    found = [p for p in parameters if p["in"] == "header" and p["name"] == NAMESPACE_HEADER]
    assert len(found) == 1
    schema: dict[str, Any] = found[0]["schema"]
    return schema


def test_the_document_and_the_server_check_the_namespace_header_alike() -> None:
    document = openapi_schema(max_body_bytes=1000, authenticated=False, namespaced=False)
    assert _header_schema(document)["pattern"] == NAMESPACE_HEADER_PATTERN
    for refused in ("a\x7fb", "caf\xe9", "a\x85b", "\xa0x"):
        assert re.search(NAMESPACE_HEADER_PATTERN, refused) is None


@pytest.mark.parametrize("value", [b"a\x7fb", b"caf\xe9", b"a\x85b", b"caf\xc3\xa9"])
async def test_a_namespace_header_outside_printable_ascii_is_refused(
    server: Running, journal: cf.Journal, value: bytes
) -> None:
    await journal.append("s", cf.RawEvent("note", {"i": 1}))
    headers = {NAMESPACE_HEADER.encode(): value}
    for response in (
        await server.client.get("/v1/streams/s/events", headers=headers),
        await server.client.get("/v1/streams", headers=headers),
        await server.client.post("/v1/streams/s/events", json={"events": [EVENT]}, headers=headers),
    ):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "InvalidInputError"
        assert "X-Contextfold-Namespace" in response.json()["error"]["message"]
    assert await journal.version("s") == 1


async def test_a_printable_namespace_header_is_served(server: Running, journal: cf.Journal) -> None:
    await journal.with_namespace("team a~1").append("s", cf.RawEvent("note", {"i": 1}))
    response = await server.client.get(
        "/v1/streams/s/events", headers={NAMESPACE_HEADER: "team a~1"}
    )
    assert response.status_code == 200, response.text
    assert [e["position"] for e in response.json()["events"]] == [1]


async def test_options_on_events_allows_get_and_post(server: Running) -> None:
    response = await server.client.options("/v1/streams/s/events")
    assert response.status_code == 405
    allowed = {method.strip() for method in response.headers["allow"].split(",")}
    assert {"GET", "POST"} <= allowed
    assert response.json()["error"]["type"]


async def test_the_manifest_view_carries_the_documented_headers(
    server: Running, journal: cf.Journal
) -> None:
    await journal.append("s", cf.system_prompt("Be brief."))
    await journal.append("s", cf.ContextAdded(role="user", content="hi"))
    agent = cf.Agent(journal, "s", cf.FunctionModel(lambda request: "hello"))
    offset = (await agent.run_until_idle()).requests[0]
    body = await server.client.get(f"/v1/streams/s/requests/{offset}")
    manifest = await server.client.get(
        f"/v1/streams/s/requests/{offset}", params={"view": "manifest"}
    )
    assert body.status_code == manifest.status_code == 200
    document = openapi_schema(max_body_bytes=1000, authenticated=False, namespaced=False)
    declared = document["paths"]["/v1/streams/{stream}/requests/{offset}"]["get"]["responses"]
    required = {n for n, h in declared["200"]["headers"].items() if h.get("required")}
    assert required == {SHA256_HEADER, TRANSPORT_HEADER}
    for name in (SHA256_HEADER, TRANSPORT_HEADER):
        assert manifest.headers[name] == body.headers[name]
    assert manifest.headers.get(MANIFEST_HEADER) == body.headers.get(MANIFEST_HEADER)
    assert manifest.json()["offset"] == offset


@pytest.mark.parametrize("expected", [0.0, 0, 1.0, 1e0])
async def test_an_integral_expected_version_is_an_int(
    server: Running, journal: cf.Journal, expected: float
) -> None:
    version = int(expected)
    if version:
        await journal.append("s", cf.RawEvent("note", {"i": 0}))
    body = {"events": [EVENT], "expected_version": expected}
    response = await server.client.post("/v1/streams/s/events", json=body)
    assert response.status_code == 201, response.text
    assert await journal.version("s") == version + 1


@pytest.mark.parametrize("expected", [0.5, -1.0, -1, 1e19, 2.0**63, True])
async def test_an_expected_version_that_is_no_version_is_refused(
    server: Running, journal: cf.Journal, expected: object
) -> None:
    body = {"events": [EVENT], "expected_version": expected}
    response = await server.client.post("/v1/streams/s/events", json=body)
    assert response.status_code == 400, response.text
    assert "expected_version" in response.json()["error"]["message"]
    assert await journal.version("s") == 0
