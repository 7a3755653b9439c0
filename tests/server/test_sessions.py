"""The transcript routes over real HTTP: paged rows, the compacted view, the live bus."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import contextfold as cf
from contextfold.server import create_app
from contextfold.transcript import (
    CompactionPart,
    Message,
    PartDelta,
    SQLiteTranscriptStore,
    TextPart,
    TranscriptBus,
    TranscriptStore,
)
from tests.server.helpers import Running, SseReader, running

T0 = "2026-01-01T00:00:0{}+00:00"


@pytest.fixture
async def rows(tmp_path: Path) -> AsyncIterator[TranscriptStore]:
    store = SQLiteTranscriptStore(tmp_path / "transcript.db")
    async with store:
        yield store


@pytest.fixture
async def srv(
    journal: cf.Journal, rows: TranscriptStore
) -> AsyncIterator[tuple[Running, TranscriptBus]]:
    bus = TranscriptBus()
    async with running(create_app(journal, transcript=rows, bus=bus)) as served:
        yield served, bus


def _message(n: int, role: str = "user", **fields: object) -> Message:
    return Message.model_validate(
        {"id": f"m{n}", "session": "chat", "role": role, "created": T0.format(n), **fields}
    )


def _text(n: int, text: str) -> TextPart:
    return TextPart(id=f"p{n}", session="chat", message_id=f"m{n}", text=text)


async def test_transcript_rows_page_to_the_end(
    srv: tuple[Running, TranscriptBus], rows: TranscriptStore
) -> None:
    server, _ = srv
    await rows.write(
        messages=[_message(1), _message(2, "assistant", completed=T0.format(3), finish="stop")],
        parts=[_text(1, "hi <b>there</b>"), _text(2, "hello")],
    )
    first = (await server.client.get("/v1/sessions/chat/transcript", params={"limit": 1})).json()
    assert first["more"] is True
    [entry] = first["messages"]
    assert entry["message"]["id"] == "m1"
    assert entry["parts"] == [_text(1, "hi <b>there</b>").model_dump(mode="json")]
    rest = (
        await server.client.get("/v1/sessions/chat/transcript", params={"after": first["cursor"]})
    ).json()
    assert [e["message"]["id"] for e in rest["messages"]] == ["m2"] and rest["more"] is False
    bad = await server.client.get("/v1/sessions/chat/transcript", params={"after": "nope"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "InvalidCursorError"


async def test_the_compacted_view_drops_history_before_the_boundary(
    srv: tuple[Running, TranscriptBus], rows: TranscriptStore
) -> None:
    server, _ = srv
    done = {"completed": T0.format(9), "finish": "stop"}
    await rows.write(
        messages=[
            _message(1),
            _message(2, "assistant", **done),
            _message(3),
            _message(4, "assistant", parent_id="m3", summary=True, **done),
            _message(5),
        ],
        parts=[CompactionPart(id="c3", session="chat", message_id="m3")],
    )
    full = (await server.client.get("/v1/sessions/chat/transcript")).json()
    assert [e["message"]["id"] for e in full["messages"]] == ["m1", "m2", "m3", "m4", "m5"]
    view = (
        await server.client.get("/v1/sessions/chat/transcript", params={"view": "compacted"})
    ).json()
    assert [e["message"]["id"] for e in view["messages"]] == ["m3", "m4", "m5"]
    bad = await server.client.get("/v1/sessions/chat/transcript", params={"view": "odd"})
    assert bad.status_code == 400


async def test_live_streams_bus_events_published_after_subscribing(
    srv: tuple[Running, TranscriptBus],
) -> None:
    server, bus = srv
    async with server.client.stream("GET", "/v1/sessions/chat/live") as response:
        assert response.status_code == 200
        reader = SseReader(response)
        assert await reader.next_comment() == "stream open"  # subscribed: now start the turn
        assert bus.subscribers("chat") == 1
        for piece in ("Hel", "lo"):
            bus.publish(
                PartDelta(
                    namespace="default",
                    session="chat",
                    message_id="m2",
                    part_id="p2",
                    part_kind="text",
                    delta=piece,
                )
            )
        bus.publish(  # another namespace's session of the same name is not this one
            PartDelta(
                namespace="other",
                session="chat",
                message_id="x",
                part_id="x",
                part_kind="text",
                delta="leak",
            )
        )
        frames = [json.loads((await reader.next()).data) for _ in range(2)]
        assert [f["delta"] for f in frames] == ["Hel", "lo"]
        assert frames[0]["type"] == "part-delta" and frames[0]["part_id"] == "p2"
    for _ in range(100):  # the disconnect closes the subscription
        if bus.subscribers("chat") == 0:
            break
        await asyncio.sleep(0.02)
    assert bus.subscribers("chat") == 0


async def test_sessions_routes_need_their_surface(journal: cf.Journal) -> None:
    async with running(create_app(journal)) as server:
        for path in ("/v1/sessions/chat/transcript", "/v1/sessions/chat/live"):
            response = await server.client.get(path)
            assert response.status_code == 404
            assert response.json()["error"]["type"] == "NotFoundError"


async def test_a_head_request_does_not_keep_a_subscription(
    srv: tuple[Running, TranscriptBus],
) -> None:
    server, bus = srv
    response = await server.client.head("/v1/sessions/chat/live")
    assert response.status_code == 200 and response.content == b""
    assert bus.subscribers("chat") == 0
    tail = await server.client.head("/v1/streams/s/tail")
    assert tail.status_code == 200 and tail.content == b""
