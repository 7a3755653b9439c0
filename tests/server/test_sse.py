"""Server-sent events over real HTTP: the journal tail, resuming, heartbeats, disconnects."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import contextfold as cf
from contextfold.server.sse import WRITE_CHUNK, EventStreamResponse, SSEMessage
from tests.server.helpers import Running, Serve, SseFrame, SseReader, running


def _note(text: str) -> cf.RawEvent:
    return cf.RawEvent("note", {"text": text})


async def test_the_tail_delivers_an_event_appended_after_connecting(
    server: Running, journal: cf.Journal
) -> None:
    await journal.append("s", _note("before"))
    async with server.client.stream("GET", "/v1/streams/s/tail") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        reader = SseReader(response)
        first = await reader.next()
        assert json.loads(first.data)["payload"] == {"text": "before"}

        # subscribed first, appended after: over HTTP like any client
        posted = await server.client.post(
            "/v1/streams/s/events", json={"events": [{"type": "note", "payload": {"text": "new"}}]}
        )
        frame = await reader.next()
        event = json.loads(frame.data)
        assert event["payload"] == {"text": "new"} and event["position"] == 2
        assert frame.id == event["cursor"] == posted.json()["cursor"]
        assert frame.event == "message"

        await journal.append("s", [_note("a"), _note("b")])
        texts = [json.loads((await reader.next()).data)["payload"]["text"] for _ in range(2)]
        assert texts == ["a", "b"]


async def test_the_tail_resumes_after_last_event_id(server: Running, journal: cf.Journal) -> None:
    results = [await journal.append("s", _note(t)) for t in ("one", "two", "three")]
    resume = {"Last-Event-ID": results[0].cursor}
    async with server.client.stream("GET", "/v1/streams/s/tail", headers=resume) as response:
        reader = SseReader(response)
        frames = [await reader.next() for _ in range(2)]
    assert [json.loads(f.data)["payload"]["text"] for f in frames] == ["two", "three"]
    assert [f.id for f in frames] == [results[1].cursor, results[2].cursor]

    # Last-Event-ID (sent by a reconnecting EventSource) wins over the URL's ?after=
    params = {"after": results[0].cursor}
    headers = {"Last-Event-ID": results[1].cursor}
    async with server.client.stream(
        "GET", "/v1/streams/s/tail", params=params, headers=headers
    ) as response:
        reader = SseReader(response)
        frame = await reader.next()
        assert json.loads(frame.data)["payload"]["text"] == "three"
        await journal.append("s", _note("four"))
        assert json.loads((await reader.next()).data)["payload"]["text"] == "four"

    async with server.client.stream(
        "GET", "/v1/streams/s/tail", params={"after": results[2].cursor}
    ) as response:
        reader = SseReader(response)
        await journal.append("s", _note("five"))
        texts = [json.loads((await reader.next()).data)["payload"]["text"] for _ in range(2)]
        assert texts == ["four", "five"]


async def test_an_unknown_cursor_resets_the_tail(server: Running, journal: cf.Journal) -> None:
    await journal.append("s", [_note("a"), _note("b")])
    other = await journal.append("other", _note("x"))
    for cursor in (other.cursor, "12345", "garbage"):
        headers = {"Last-Event-ID": cursor}
        async with server.client.stream("GET", "/v1/streams/s/tail", headers=headers) as response:
            reader = SseReader(response)
            reset = await reader.next()
            assert reset.event == "reset"
            assert json.loads(reset.data) == {"stream": "s", "after": cursor}
            texts = [json.loads((await reader.next()).data)["payload"]["text"] for _ in range(2)]
            assert texts == ["a", "b"]


async def test_a_stream_deleted_and_recreated_under_an_open_tail_resets_it(
    server: Running, journal: cf.Journal
) -> None:
    await journal.append("s", [_note("a"), _note("b")])
    async with server.client.stream("GET", "/v1/streams/s/tail") as response:
        reader = SseReader(response)
        frames = [await reader.next() for _ in range(2)]
        assert [json.loads(f.data)["payload"]["text"] for f in frames] == ["a", "b"]
        await journal.delete_stream("s")
        await journal.append("s", _note("new life"))
        reset = await reader.next()
        assert reset.event == "reset"
        assert json.loads(reset.data) == {"stream": "s", "after": frames[-1].id}
        fresh = await reader.next()
        assert json.loads(fresh.data)["payload"]["text"] == "new life"
        assert json.loads(fresh.data)["position"] == 1


async def test_idle_streams_send_heartbeats(serve: Serve, journal: cf.Journal) -> None:
    async with (
        serve(heartbeat=0.05) as srv,
        srv.client.stream("GET", "/v1/streams/s/tail") as response,
    ):
        reader = SseReader(response)
        assert await reader.next_comment() == "stream open"
        assert await reader.next_comment() == "heartbeat"
        assert await reader.next_comment() == "heartbeat"
        await journal.append("s", _note("still live"))
        assert json.loads((await reader.next()).data)["payload"]["text"] == "still live"


async def test_the_tail_rejects_a_bad_stream_before_streaming(server: Running) -> None:
    async with server.client.stream("GET", "/v1/streams/%20x/tail") as response:
        assert response.status_code == 400
        await response.aread()
        assert response.json()["error"]["type"] == "InvalidStreamNameError"


async def test_a_disconnect_closes_an_idle_source() -> None:
    opened = asyncio.Event()
    closed = asyncio.Event()

    async def idle() -> AsyncIterator[SSEMessage]:
        opened.set()
        try:
            await asyncio.Event().wait()  # never sends: only the disconnect can end it
            yield SSEMessage("unreachable")
        finally:
            closed.set()

    async def endpoint(request: Request) -> Response:
        return EventStreamResponse(idle(), heartbeat=60)

    async with running(Starlette(routes=[Route("/sse", endpoint)])) as srv:
        async with srv.client.stream("GET", "/sse") as response:
            reader = SseReader(response)
            assert await reader.next_comment() == "stream open"
            await asyncio.wait_for(opened.wait(), 5)
        await asyncio.wait_for(closed.wait(), 5)


async def test_a_failing_source_ends_with_an_error_frame() -> None:
    async def failing() -> AsyncIterator[SSEMessage]:
        yield SSEMessage("line one\nline two", id="1", event="greeting")
        raise cf.StoreUnavailableError("the store went away")

    async def endpoint(request: Request) -> Response:
        return EventStreamResponse(failing())

    async with (
        running(Starlette(routes=[Route("/sse", endpoint)])) as srv,
        srv.client.stream("GET", "/sse") as response,
    ):
        reader = SseReader(response)
        greeting = await reader.next()
        assert greeting == SseFrame("line one\nline two", id="1", event="greeting")
        error = await reader.next()
        assert error.event == "error"
        assert json.loads(error.data) == {
            "error": {"type": "StoreUnavailableError", "message": "the store went away"}
        }
        assert await reader.rest() == []  # and the stream ends


def test_sse_frames_refuse_line_breaks_in_ids() -> None:
    assert SSEMessage("x", id="7").encode() == b"id: 7\ndata: x\n\n"
    assert SSEMessage("a\r\nb\rc").encode() == b"data: a\ndata: b\ndata: c\n\n"
    for bad in ("1\n2", "1\r", "\0"):
        with pytest.raises(ValueError, match="CR, LF or NUL"):
            SSEMessage("x", id=bad).encode()


def test_bytes_data_is_sent_as_is_and_split_like_text() -> None:
    body = b'{"text":"\xc3\xa9"}' * 10_000
    message = SSEMessage(body, id="7", event="e")
    assert message.encode() == SSEMessage(body.decode(), id="7", event="e").encode()
    assert any(piece is body for piece in message.pieces())  # not copied
    assert SSEMessage(b"a\r\nb").encode() == b"data: a\ndata: b\n\n"


async def test_a_frame_larger_than_a_write_chunk_arrives_whole(server: Running) -> None:
    text = "é" * (3 * WRITE_CHUNK)
    body = {"events": [{"type": "note", "payload": {"text": text}}]}
    assert (await server.client.post("/v1/streams/big/events", json=body)).status_code == 201
    async with server.client.stream("GET", "/v1/streams/big/tail") as response:
        frame = await SseReader(response).next()
    assert json.loads(frame.data)["payload"] == {"text": text}
