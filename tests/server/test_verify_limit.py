"""``GET …/verify`` answers in a bounded size: the first ``limit`` drifts (100 unless
asked), ``drift_count`` counting them all; a limit out of range is a 400."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import contextfold as cf
from tests.server.helpers import Running, Serve, raw

HEADER = cf.RequestHeader(transport="openai-chat", model="gpt-4o", max_tokens=256)
WRONG = "0" * 64


@pytest.fixture
async def server(serve: Serve) -> AsyncIterator[Running]:
    """A trusted writer's server: these tests append the agent's own request events."""
    async with serve(trusted_writer=True) as srv:
        yield srv


async def _post(server: Running, events: list[cf.Event]) -> int:
    response = await server.client.post(
        "/v1/streams/agent/events", json={"events": [raw(e) for e in events]}
    )
    assert response.status_code == 201, response.text
    last: int = response.json()["last_position"]
    return last


async def test_verify_lists_the_first_drifts_up_to_the_limit(
    server: Running, journal: cf.Journal
) -> None:
    await _post(server, [cf.ContextAdded(role="system", content="Be brief.", key="agent/p")])
    offsets = []
    for turn in range(5):
        question = cf.ContextAdded(role="user", content=f"q{turn}", actor=cf.Actor(type="user"))
        offset = await _post(server, [question, cf.LlmRequestRequested(header=HEADER)])
        record = cf.RequestRecorded(
            request_offset=offset, transport="openai-chat", sha256=WRONG, size=1
        )
        await _post(server, [record])
        offsets.append(offset)
    full = (await server.client.get("/v1/streams/agent/verify")).json()
    assert full["ok"] is False and full["requests"] == 5 and full["drift_count"] == 5
    assert [d["request_offset"] for d in full["drifts"]] == offsets
    assert [d["recorded_at"] for d in full["drifts"]] == [n + 1 for n in offsets]
    rebuilt = [(await cf.rebuild_request(journal, "agent", n)).sha256 for n in offsets]
    assert [d["rebuilt"] for d in full["drifts"]] == rebuilt

    cut = (await server.client.get("/v1/streams/agent/verify?limit=2")).json()
    assert cut["drift_count"] == 5 and cut["requests"] == 5 and cut["ok"] is False
    assert cut["drifts"] == full["drifts"][:2]

    for bad in ("0", "1001", "x"):
        response = await server.client.get(f"/v1/streams/agent/verify?limit={bad}")
        assert response.status_code == 400, bad
        error = response.json()["error"]
        assert error["type"] == "InvalidInputError" and "limit" in error["message"]
