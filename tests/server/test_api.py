"""The JSON API over real HTTP: appends, reads, idempotency, concurrency, namespaces."""

from __future__ import annotations

from typing import Any

import httpx

import contextfold as cf
from tests.server.helpers import Running


def _events(*texts: str) -> list[dict[str, Any]]:
    return [{"type": "note", "payload": {"text": text, "n": i}} for i, text in enumerate(texts)]


async def _post(
    client: httpx.AsyncClient, stream: str, body: Any, **headers: str
) -> httpx.Response:
    return await client.post(f"/v1/streams/{stream}/events", json=body, headers=headers)


async def test_append_then_read_round_trip(server: Running, journal: cf.Journal) -> None:
    payloads = [
        {"text": "héllo ✓", "nested": {"list": [1, 2.5, None, True], "big": 2**63 + 1}},
        {},
        [1, "two"],
        "plain string",
    ]
    body = {
        "events": [{"type": f"t{i}", "payload": p} for i, p in enumerate(payloads)],
        "run_id": "run-1",
        "actor": "webhook",
    }
    response = await _post(server.client, "agent/main", body)
    assert response.status_code == 201, response.text
    appended = response.json()
    assert appended["positions"] == [1, 2, 3, 4]
    assert appended["version"] == 4 and appended["deduplicated"] is False

    page = (await server.client.get("/v1/streams/agent/main/events")).json()
    assert [e["payload"] for e in page["events"]] == payloads
    assert [e["type"] for e in page["events"]] == ["t0", "t1", "t2", "t3"]
    assert [e["position"] for e in page["events"]] == [1, 2, 3, 4]
    assert page["cursor"] == appended["cursor"] and not page["reset"] and not page["more"]
    meta = page["events"][0]["meta"]
    assert meta["run_id"] == "run-1" and meta["actor"] == "webhook"
    assert meta["channels"] == ["main"] and meta["event_id"] and meta["time"]

    # the same bytes the Python API reads
    stored = (await journal.read("agent/main")).events
    assert [e.payload for e in stored] == payloads

    streams = (await server.client.get("/v1/streams")).json()
    assert streams == {"streams": [{"stream": "agent/main", "version": 4}], "next": None}


async def test_pages_continue_from_the_cursor(server: Running) -> None:
    await _post(server.client, "s", {"events": _events("a", "b", "c")})
    first = (await server.client.get("/v1/streams/s/events", params={"limit": 2})).json()
    assert [e["payload"]["text"] for e in first["events"]] == ["a", "b"] and first["more"]
    rest = (
        await server.client.get("/v1/streams/s/events", params={"after": first["cursor"]})
    ).json()
    assert [e["payload"]["text"] for e in rest["events"]] == ["c"] and not rest["more"]
    # a cursor naming no event of the stream is a mistake to report, not a restart
    unknown = await server.client.get("/v1/streams/s/events", params={"after": "999"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "UnknownCursorError"


async def test_idempotent_retry_returns_the_original_positions(
    server: Running, journal: cf.Journal
) -> None:
    body = {"events": _events("once"), "idempotency_key": "req-1"}
    first = await _post(server.client, "s", body)
    retry = await _post(server.client, "s", body)
    assert first.status_code == 201 and retry.status_code == 200
    assert retry.json()["positions"] == first.json()["positions"] == [1]
    assert retry.json()["deduplicated"] is True
    assert await journal.version("s") == 1

    other = await _post(server.client, "s", {"events": _events("else"), "idempotency_key": "req-1"})
    assert other.status_code == 409
    assert other.json()["error"]["type"] == "IdempotencyConflictError"
    assert await journal.version("s") == 1


async def test_wrong_expected_version_is_a_conflict(server: Running, journal: cf.Journal) -> None:
    await _post(server.client, "s", {"events": _events("a", "b")})
    wrong = await _post(server.client, "s", {"events": _events("c"), "expected_version": 1})
    assert wrong.status_code == 409
    error = wrong.json()["error"]
    assert error["type"] == "WrongExpectedVersionError" and "'s'" in error["message"]
    assert await journal.version("s") == 2
    right = await _post(server.client, "s", {"events": _events("c"), "expected_version": 2})
    assert right.status_code == 201 and right.json()["positions"] == [3]
    fresh = await _post(server.client, "new", {"events": _events("x"), "expected_version": 0})
    assert fresh.status_code == 201


async def test_namespaces_are_isolated(server: Running, journal: cf.Journal) -> None:
    tenant = {"X-Contextfold-Namespace": "tenant-a"}
    assert (await _post(server.client, "s", {"events": _events("a")}, **tenant)).status_code == 201
    assert (await server.client.get("/v1/streams")).json() == {"streams": [], "next": None}
    listed = (await server.client.get("/v1/streams", headers=tenant)).json()
    assert listed == {"streams": [{"stream": "s", "version": 1}], "next": None}
    assert await journal.with_namespace("tenant-a").version("s") == 1
    assert await journal.version("s") == 0
    # the query parameter is the fallback for EventSource; it must agree with the header
    by_query = await server.client.get("/v1/streams", params={"namespace": "tenant-a"})
    assert by_query.json() == listed
    clash = await server.client.get("/v1/streams", params={"namespace": "tenant-b"}, headers=tenant)
    assert clash.status_code == 400
    bad = await server.client.get("/v1/streams", params={"namespace": "a\x01b"})
    assert bad.status_code == 400 and "control character" in bad.json()["error"]["message"]


async def test_prefix_and_limit_of_the_stream_list(server: Running) -> None:
    for name in ("a/1", "a/2", "b/1"):
        await _post(server.client, name, {"events": _events("x")})
    listed = await server.client.get("/v1/streams", params={"prefix": "a/", "limit": 1})
    assert listed.json() == {"streams": [{"stream": "a/1", "version": 1}], "next": "a/1"}
    rest = await server.client.get("/v1/streams", params={"prefix": "a/", "after": "a/1"})
    assert rest.json() == {"streams": [{"stream": "a/2", "version": 1}], "next": None}
    for limit in ("0", "1001", "x"):
        bad = await server.client.get("/v1/streams", params={"limit": limit})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "InvalidInputError"
        assert f"limit={limit!r}" in bad.json()["error"]["message"]


async def test_the_stream_list_pages_past_a_thousand_streams_with_its_next_cursor(
    server: Running, journal: cf.Journal
) -> None:
    names = sorted(f"s/{n:04}" for n in range(1003))
    for name in names:
        await journal.append(name, cf.RawEvent("note", {}))
    first = (await server.client.get("/v1/streams")).json()
    assert len(first["streams"]) == 1000 and first["next"] == names[999]
    listed = [info["stream"] for info in first["streams"]]
    after: str | None = first["next"]
    while after is not None:
        page = (await server.client.get("/v1/streams", params={"after": after, "limit": 2})).json()
        listed += [info["stream"] for info in page["streams"]]
        after = page["next"]
    assert listed == names
    # a cursor whose stream was deleted meanwhile still goes on from its place
    await journal.delete_stream(names[500])
    gone = await server.client.get("/v1/streams", params={"after": names[500], "limit": 1})
    assert gone.json() == {"streams": [{"stream": names[501], "version": 1}], "next": names[501]}


async def test_the_stream_list_refuses_a_malformed_cursor_and_unknown_parameters(
    server: Running,
) -> None:
    await _post(server.client, "s", {"events": _events("x")})
    queries: list[tuple[tuple[tuple[str, str], ...], str]] = [
        ((("after", " s"),), "after=' s'"),
        ((("after", "a\x01b"),), "control character"),
        ((("cursor", "s"),), "'cursor'"),
        ((("prefx", "s"),), "'prefx'"),
        ((("limit", "1"), ("limit", "2")), "'limit' is given twice"),
    ]
    for query, named in queries:
        refused = await server.client.get("/v1/streams", params=query)
        assert refused.status_code == 400, (query, refused.text)
        assert refused.json()["error"]["type"] == "InvalidInputError"
        assert named in refused.json()["error"]["message"], refused.text
