"""Rendered bodies sent through the official SDKs reach the wire unchanged.

A loopback HTTP server records each request body and replies with a minimal valid
response (JSON or server-sent events), so the SDK must both accept our body as keyword
arguments and parse the reply. The received JSON must equal our body: any field an SDK
added would show up in the assertion message.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anthropic
import openai
import pytest

from contextfold.wire import (
    NeutralMessage,
    NeutralRequest,
    ToolCall,
    ToolDefinition,
    Transport,
    render_request,
)

# -- loopback server ------------------------------------------------------------------

_CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": "gpt-test",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "ok"},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}

_RESPONSE = {
    "id": "resp_1",
    "object": "response",
    "created_at": 0,
    "model": "gpt-test",
    "status": "completed",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "ok", "annotations": []}],
        }
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 3,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 1,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 4,
    },
}

_MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-test",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 1},
}


def _chat_events() -> Iterator[str]:
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    deltas: list[dict[str, Any]] = [
        {"index": 0, "delta": {"role": "assistant", "content": "o"}, "finish_reason": None},
        {"index": 0, "delta": {"content": "k"}, "finish_reason": None},
        {"index": 0, "delta": {}, "finish_reason": "stop"},
    ]
    for choice in deltas:
        yield f"data: {json.dumps({**chunk, 'choices': [choice]})}\n\n"
    usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    yield f"data: {json.dumps({**chunk, 'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


def _responses_events() -> Iterator[str]:
    in_progress = {**_RESPONSE, "status": "in_progress", "output": []}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "sequence_number": 0, "response": in_progress},
        {
            "type": "response.output_text.delta",
            "sequence_number": 1,
            "item_id": "msg_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "ok",
            "logprobs": [],
        },
        {"type": "response.completed", "sequence_number": 2, "response": _RESPONSE},
    ]
    for event in events:
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


def _anthropic_events() -> Iterator[str]:
    start = {**_MESSAGE, "content": [], "stop_reason": None}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": start},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 1},
        },
        {"type": "message_stop"},
    ]
    for event in events:
        yield f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"


class _Recorder(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[tuple[str, Any]] = []


class _Handler(BaseHTTPRequestHandler):
    server: _Recorder

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        body = json.loads(self.rfile.read(length))
        self.server.received.append((self.path, body))
        routes = {
            "/v1/chat/completions": (_CHAT, _chat_events),
            "/v1/responses": (_RESPONSE, _responses_events),
            "/v1/messages": (_MESSAGE, _anthropic_events),
        }
        if self.path not in routes:
            self.send_error(404)
            return
        reply, events = routes[self.path]
        if body.get("stream"):
            data = "".join(events()).encode()
            content_type = "text/event-stream"
        else:
            data = json.dumps(reply).encode()
            content_type = "application/json"
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass


@pytest.fixture
def server() -> Iterator[_Recorder]:
    recorder = _Recorder()
    thread = threading.Thread(target=recorder.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield recorder
    finally:
        recorder.shutdown()
        recorder.server_close()
        thread.join(timeout=5)


def _base(server: _Recorder) -> str:
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"


# -- the request ----------------------------------------------------------------------


def _request(*, stream: bool) -> NeutralRequest:
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}},
        "required": ["path"],
    }
    return NeutralRequest(
        model="test-model",
        system="You read context items; the first line of each is its header.",
        messages=(
            NeutralMessage(role="developer", content="@3\nSkills catalog", cache_breakpoint=True),
            NeutralMessage(role="user", content="@5\nRead a and b."),
            NeutralMessage(
                role="assistant",
                content="Reading both.",
                tool_calls=(
                    ToolCall(id="call_a", name="read", arguments='{"path":"a"}'),
                    ToolCall(id="call_b", name="read", arguments='{"path":"b"}'),
                ),
            ),
            NeutralMessage(role="tool", content="A", tool_call_id="call_a"),
            NeutralMessage(role="tool", content="B", tool_call_id="call_b"),
            NeutralMessage(role="developer", content="@9\nCI finished."),
            NeutralMessage(role="user", content="@11\nThanks, now summarize."),
        ),
        tools=(
            ToolDefinition.from_schema(name="read", description="Read a file", parameters=schema),
        ),
        max_tokens=512,
        temperature=0.0,
        stream=stream,
    )


def _sent(server: _Recorder, transport: Transport, stream: bool) -> tuple[dict[str, Any], Any]:
    body = render_request(_request(stream=stream), transport).json()
    assert len(server.received) == 1, server.received
    path, received = server.received[0]
    return body, (path, received)


def _assert_same(body: dict[str, Any], received: dict[str, Any]) -> None:
    added = sorted(set(received) - set(body))
    assert not added, f"the SDK added fields {added}"
    assert received == body


# -- tests ----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_chat_completions_sends_body_unchanged(server: _Recorder, stream: bool) -> None:
    body = render_request(_request(stream=stream), "openai-chat").json()
    with openai.OpenAI(base_url=_base(server) + "/v1", api_key="test", max_retries=0) as client:
        if stream:
            chunks = list(client.chat.completions.create(**body))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert text == "ok"
            assert chunks[-1].usage is not None
        else:
            completion = client.chat.completions.create(**body)
            assert completion.choices[0].message.content == "ok"
    path, received = server.received[0]
    assert path == "/v1/chat/completions"
    _assert_same(body, received)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_responses_sends_body_unchanged(server: _Recorder, stream: bool) -> None:
    body = render_request(_request(stream=stream), "openai-responses").json()
    with openai.OpenAI(base_url=_base(server) + "/v1", api_key="test", max_retries=0) as client:
        if stream:
            events = list(client.responses.create(**body))
            assert [e.type for e in events] == [
                "response.created",
                "response.output_text.delta",
                "response.completed",
            ]
        else:
            response = client.responses.create(**body)
            assert response.output_text == "ok"
    path, received = server.received[0]
    assert path == "/v1/responses"
    _assert_same(body, received)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_anthropic_messages_sends_body_unchanged(server: _Recorder, stream: bool) -> None:
    body = render_request(_request(stream=stream), "anthropic").json()
    with anthropic.Anthropic(base_url=_base(server), api_key="test", max_retries=0) as client:
        if stream:
            events = list(client.messages.create(**body))
            assert events[0].type == "message_start"
            assert events[-1].type == "message_stop"
            deltas = [e for e in events if e.type == "content_block_delta"]
            assert len(deltas) == 1
        else:
            message = client.messages.create(**body)
            assert message.content[0].type == "text"
            assert message.stop_reason == "end_turn"
    path, received = server.received[0]
    assert path == "/v1/messages"
    _assert_same(body, received)


def test_anthropic_stream_helper_accepts_the_body(server: _Recorder) -> None:
    # messages.stream() sets "stream" itself; the rest of the body must pass as is.
    body = render_request(_request(stream=False), "anthropic").json()
    with (
        anthropic.Anthropic(base_url=_base(server), api_key="test", max_retries=0) as client,
        client.messages.stream(**body) as stream,
    ):
        assert stream.get_final_text() == "ok"
    _, received = server.received[0]
    _assert_same({**body, "stream": True}, received)


def test_equal_requests_render_equal_bodies() -> None:
    request = _request(stream=False)
    again = replace(request, messages=tuple(request.messages))
    for transport in ("openai-chat", "openai-responses", "anthropic"):
        assert render_request(request, transport) == render_request(again, transport)
