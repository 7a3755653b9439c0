"""Shared helpers of the OpenAI Agents SDK tests: journals per backend and a scripted model."""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from adk_helpers import ProbeStore
from agents import Model, ModelResponse, ModelSettings, Tool, Usage, set_tracing_disabled
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import ModelTracing
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from contextfold.errors import StoreUnavailableError
from contextfold.events import Event, NewEvent, StoredEvent
from contextfold.store.base import AppendResult, Store

__all__ = [
    "BACKENDS",
    "Call",
    "HookedStore",
    "Received",
    "ResponsesServer",
    "ScriptedModel",
    "backend_url",
    "decoded",
    "function_call",
    "response_json",
    "responses_server",
    "text_message",
]

E = TypeVar("E", bound=Event)


def decoded(stored: StoredEvent, cls: type[E]) -> E:
    """The stored event's payload as ``cls``."""
    return cast(E, stored.decode(cls))


# The SDK traces runs to OpenAI by default: these tests send nothing anywhere.
set_tracing_disabled(True)

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The journal URL of ``request.param``: memory, a real SQLite file or a fresh PostgreSQL
    database of the suite's server."""
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'journal.db'}"
    return str(request.getfixturevalue("pg_dsn"))


def text_message(text: str, id: str = "msg_1") -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def function_call(name: str, arguments: str, call_id: str = "call_1") -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", name=name, arguments=arguments, call_id=call_id
    )


@dataclass(frozen=True)
class Call:
    """One request the scripted model got."""

    instructions: str | None
    input: list[TResponseInputItem]
    tools: tuple[str, ...]


class ScriptedModel(Model):
    """A model that answers each request with the next scripted output (no network)."""

    def __init__(self, *outputs: list[Any]) -> None:
        self.outputs = list(outputs)
        self.calls: list[Call] = []

    def enqueue(self, output: list[Any]) -> None:
        self.outputs.append(output)

    def _answer(
        self, instructions: str | None, input: str | list[TResponseInputItem], tools: list[Tool]
    ) -> list[TResponseOutputItem]:
        items: list[TResponseInputItem] = (
            [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        )
        self.calls.append(Call(instructions, items, tuple(tool.name for tool in tools)))
        if not self.outputs:
            raise AssertionError("the scripted model got a request it has no answer for")
        return self.outputs.pop(0)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        output = self._answer(system_instructions, input, tools)
        response_id = f"resp_{len(self.calls)}"
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=response_id)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        output = self._answer(system_instructions, input, tools)
        response = Response(
            id=f"resp_{len(self.calls)}",
            created_at=0,
            model="scripted",
            object="response",
            output=output,
            tool_choice="auto",
            tools=[],
            parallel_tool_calls=False,
            status="completed",
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )


class HookedStore(ProbeStore):
    """A probing store (reads recorded) whose appends can be preceded by another writer's
    (``before``, called once per append with the events' types) or lose their outcome after
    committing (``lose``: the append is stored, then the call fails as a lost connection)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.before: Callable[[str, tuple[str, ...]], Awaitable[None]] | None = None
        self.lose: Callable[[tuple[str, ...]], bool] = lambda types: False

    async def append(
        self,
        namespace: str,
        stream: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int | None,
        idempotency_key: str | None,
    ) -> AppendResult:
        types = tuple(event.type for event in events)
        hook, self.before = self.before, None
        if hook is not None:
            await hook(stream, types)
        done = await super().append(
            namespace,
            stream,
            events,
            expected_version=expected_version,
            idempotency_key=idempotency_key,
        )
        if self.lose(types):
            self.lose = lambda types: False
            raise StoreUnavailableError(f"injected: the answer to an append to {stream!r} was lost")
        return done


@dataclass(frozen=True)
class Received:
    """One request the loopback server got: its path and exact body bytes."""

    path: str
    body: bytes


class ResponsesServer(ThreadingHTTPServer):
    """An OpenAI Responses endpoint on 127.0.0.1 answering each POST with the next scripted
    ``Response`` JSON, recording the exact bytes it got."""

    daemon_threads = True

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        super().__init__(("127.0.0.1", 0), _ResponsesHandler)
        self.replies = list(replies)
        self.received: list[Received] = []
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/v1"


class _ResponsesHandler(BaseHTTPRequestHandler):
    server: ResponsesServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.server.lock:
            self.server.received.append(Received(self.path, body))
            reply = self.server.replies.pop(0) if self.server.replies else None
        if reply is None:
            self.send_error(500, "no scripted reply left")
            return
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass


@contextmanager
def responses_server(replies: list[dict[str, Any]]) -> Iterator[ResponsesServer]:
    """Serve ``replies`` (one per request, in order) on a free loopback port."""
    server = ResponsesServer(replies)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def response_json(*output: dict[str, Any]) -> dict[str, Any]:
    """A whole Responses API answer with these output items."""
    return {
        "id": "resp_loopback",
        "object": "response",
        "created_at": 0,
        "model": "gpt-4.1",
        "status": "completed",
        "output": list(output),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 20,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 25,
        },
    }
