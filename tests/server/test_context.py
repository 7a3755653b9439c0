"""The agent context over HTTP: lanes with headers and trust, rebuilt request bytes, verify."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import pytest

import contextfold as cf
from contextfold.canonical import sha256_hex
from tests.server.helpers import Running, Serve, raw

HEADER = cf.RequestHeader(transport="openai-chat", model="gpt-4o", max_tokens=256)
HOSTILE = "<img src=x onerror=alert(1)>"


@pytest.fixture
async def server(serve: Serve) -> AsyncIterator[Running]:
    """A trusted writer's server: these tests append the agent's own request events."""
    async with serve(trusted_writer=True) as srv:
        yield srv


async def _conversation(server: Running, stream: str = "agent") -> int:
    """System prompt, a webhook item, a user item and one request; returns the request's offset."""
    events = [
        cf.ContextAdded(role="system", content="You are careful.", key=cf.SYSTEM_PROMPT_KEY),
        cf.ContextAdded(
            role="developer", content=HOSTILE, actor=cf.Actor(type="webhook", id="hook-7")
        ),
        cf.ContextAdded(role="user", content="Summarise the hook.", actor=cf.Actor(type="user")),
        cf.LlmRequestRequested(header=HEADER),
    ]
    response = await server.client.post(
        f"/v1/streams/{stream}/events", json={"events": [raw(e) for e in events]}
    )
    assert response.status_code == 201, response.text
    last: int = response.json()["last_position"]
    return last


async def test_context_lanes_carry_headers_and_trust(server: Running) -> None:
    await _conversation(server)
    pending = cf.ContextAdded(role="developer", content="later", key="status")
    await server.client.post("/v1/streams/agent/events", json={"events": [raw(pending)]})
    context = (await server.client.get("/v1/streams/agent/context")).json()
    assert context["version"] == 5 and context["published_through"] == 4
    assert context["request_offsets"] == [4] and context["header"]["model"] == "gpt-4o"
    [system] = context["system"]
    assert system["header"] == '@1 key="agent/system-prompt"' and system["wire_role"] == "system"
    hook, user, later = context["history"]
    assert hook["header"] == '@2 actor=webhook actor_id="hook-7"'
    assert hook["content"] == HOSTILE and hook["external"] is True
    assert hook["role"] == "developer" and hook["wire_role"] == "user"  # never instructions
    assert user["external"] is True and user["wire_role"] == "user"
    assert later["external"] is False and later["wire_role"] == "developer"
    assert [hook["published"], later["published"]] == [True, False]


async def test_rebuilt_request_bytes_equal_the_journal_rebuild(
    server: Running, journal: cf.Journal
) -> None:
    offset = await _conversation(server)
    response = await server.client.get(f"/v1/streams/agent/requests/{offset}")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    expected = await cf.rebuild_request(journal, "agent", offset)
    assert response.content == expected.body
    assert response.headers["x-contextfold-sha256"] == hashlib.sha256(response.content).hexdigest()
    assert response.headers["x-contextfold-transport"] == "openai-chat"

    # whatever is appended later, request @offset is the same bytes
    more = [cf.ContextAdded(role="user", content="again"), cf.LlmRequestRequested()]
    await server.client.post("/v1/streams/agent/events", json={"events": [raw(e) for e in more]})
    again = await server.client.get(f"/v1/streams/agent/requests/{offset}")
    assert again.content == expected.body
    newer = await server.client.get(f"/v1/streams/agent/requests/{offset + 2}")
    assert newer.status_code == 200 and newer.content != expected.body


async def test_an_offset_that_is_no_request_is_404(server: Running) -> None:
    await _conversation(server)
    for offset in (1, 0, 99):
        response = await server.client.get(f"/v1/streams/agent/requests/{offset}")
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "RebuildError"


async def test_verify_reports_drifts(server: Running, journal: cf.Journal) -> None:
    offset = await _conversation(server)
    body = (await cf.rebuild_request(journal, "agent", offset)).body
    good = cf.RequestRecorded(
        request_offset=offset, transport="openai-chat", sha256=sha256_hex(body), size=len(body)
    )
    await server.client.post("/v1/streams/agent/events", json={"events": [raw(good)]})
    assert (await server.client.get("/v1/streams/agent/verify")).json() == {
        "stream": "agent",
        "ok": True,
        "requests": 1,
        "drift_count": 0,
        "drifts": [],
        "corrupt": [],
    }
    bad = good.model_copy(update={"sha256": "0" * 64})
    posted = await server.client.post("/v1/streams/agent/events", json={"events": [raw(bad)]})
    report = (await server.client.get("/v1/streams/agent/verify")).json()
    assert report["ok"] is False
    assert report["drifts"] == [
        {
            "request_offset": offset,
            "recorded": "0" * 64,
            "rebuilt": sha256_hex(body),
            "error": None,
            "recorded_at": posted.json()["first_position"],
        }
    ]


async def test_a_stream_without_events_has_no_context(server: Running) -> None:
    for route in ("context", "verify", "events", "requests/1"):
        response = await server.client.get(f"/v1/streams/nobody/{route}")
        assert response.status_code == 404, route
        error = response.json()["error"]
        assert error["type"] == "UnknownStreamError" and "'nobody'" in error["message"]
