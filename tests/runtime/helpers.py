"""Helpers of the runtime tests: journals and queries, the charging tool, the loopback model
server, workers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import contextfold as cf
from contextfold.context.events import (
    Actor,
    ContextAdded,
    LlmRequestInterrupted,
    LlmRequestPolicy,
    LlmRequestRequested,
    LlmResponse,
)
from contextfold.context.projection import AgentContext
from contextfold.context.rebuild import RequestRecorded
from contextfold.events import Event, StoredEvent
from contextfold.journal import Journal, open_journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.events import LoopEvent, RequestSent
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.scheduling import AgentHalted, Scheduler, TurnBudgets, decide
from contextfold.runtime.worker import Worker
from contextfold.wire import NeutralRequest, RenderedRequest

__all__ = [
    "CALL",
    "STREAM",
    "Charges",
    "Loopback",
    "Observer",
    "Received",
    "answered",
    "anthropic_text_stream",
    "anthropic_tool_stream",
    "assistant_texts",
    "charge_tool",
    "charging_model",
    "echo_app",
    "events_of",
    "eventually",
    "fixed_clock",
    "loopback",
    "memory_journal",
    "new_agent_stream",
    "openai_responses_text_stream",
    "openai_text_stream",
    "openai_tool_stream",
    "requests_of",
    "running",
    "text_of",
    "user",
]


# --- journals, items, an observer and journal queries ---


STREAM = "agents/test"


def fixed_clock(start: datetime | None = None) -> Any:
    """A deterministic journal clock: one millisecond further at every call."""
    state = {"now": start or datetime(2026, 1, 1, tzinfo=UTC)}

    def clock() -> datetime:
        state["now"] += timedelta(milliseconds=1)
        return state["now"]

    return clock


async def memory_journal(**options: Any) -> AsyncIterator[Journal]:
    journal = open_journal("memory://", **options)
    async with journal:
        yield journal


def user(text: str, behaviour: str | None = None) -> ContextAdded:
    """A human message, optionally with an explicit request policy."""
    policy = None if behaviour is None else LlmRequestPolicy(behaviour=behaviour)
    return ContextAdded(
        role="user", actor=Actor(type="user"), content=text, llm_request_policy=policy
    )


def text_of(request: NeutralRequest) -> str:
    """Every message of a neutral request joined: for "does the request include X" checks."""
    return "\n".join(m.content for m in request.messages)


async def events_of(journal: Journal, stream: str, cls: type[Event]) -> list[tuple[int, Any]]:
    """(position, decoded payload) of every event of one type, in stream order."""
    found: list[tuple[int, Any]] = []
    async for stored in journal.read_all(stream):
        if stored.type == cls.event_type:
            found.append((stored.position, stored.decode(cls)))
    return found


async def stored_of(journal: Journal, stream: str, cls: type[Event]) -> list[StoredEvent]:
    return [s async for s in journal.read_all(stream) if s.type == cls.event_type]


async def requests_of(journal: Journal, stream: str) -> list[int]:
    return [p for p, _ in await events_of(journal, stream, LlmRequestRequested)]


async def recorded_of(journal: Journal, stream: str) -> dict[int, list[str]]:
    """Request offset -> every recorded sha256 (a retry records again)."""
    recorded: dict[int, list[str]] = {}
    for _, record in await events_of(journal, stream, RequestRecorded):
        recorded.setdefault(record.request_offset, []).append(record.sha256)
    return recorded


async def interrupted_of(journal: Journal, stream: str) -> list[int]:
    return [e.request_offset for _, e in await events_of(journal, stream, LlmRequestInterrupted)]


async def halts_of(journal: Journal, stream: str) -> list[AgentHalted]:
    return [e for _, e in await events_of(journal, stream, AgentHalted)]


async def assistant_texts(journal: Journal, stream: str) -> list[str]:
    return [e.text for _, e in await events_of(journal, stream, LlmResponse)]


_E = TypeVar("_E")


class Observer:
    """Records every loop event; ``sent`` maps request offset to the bodies sent for it."""

    def __init__(self) -> None:
        self.events: list[LoopEvent] = []
        self.sent: dict[int, list[RenderedRequest]] = {}
        self.neutral: dict[int, list[NeutralRequest]] = {}

    async def on_event(self, event: LoopEvent) -> None:
        self.events.append(event)
        if isinstance(event, RequestSent):
            self.sent.setdefault(event.offset, []).append(event.rendered)
            self.neutral.setdefault(event.offset, []).append(event.neutral)

    def of(self, kind: type[_E]) -> list[_E]:
        """The recorded events of one class, in order."""
        return [event for event in self.events if isinstance(event, kind)]


# --- a side-effecting tool for the at-most-once tests ---
def lookup(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


def lookup_then_answer(request: NeutralRequest) -> cf.ModelOutput | str:
    """A model that calls ``lookup`` once per user message, then answers ``done``."""
    if request.messages[-2].role == "tool":
        return "done"
    n = len(request.messages)
    return cf.ModelOutput(tool_calls=(cf.ToolCall(id=f"c{n}", name="lookup", arguments="{}"),))


# ``charge`` appends a line to a marker file (the side effect a payment API would make),
# then answers or blocks until killed.


CALL = cf.ToolCall(id="call-1", name="charge", arguments='{"amount": 100}')


def charging_model(request: cf.NeutralRequest) -> cf.ModelOutput | str:
    """Call ``charge`` once, then say what the tool answered."""
    last = request.messages[-2]  # the last message is the request's timestamp tail
    if last.role == "tool":
        return f"tool said: {last.content.splitlines()[-1]}"
    return cf.ModelOutput(tool_calls=(CALL,))


class Charges:
    """The marker file: one line per side effect, ``call_id key resumed amount``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[list[str]]:
        if not self.path.exists():
            return []
        return [line.split() for line in self.path.read_text().splitlines()]


def charge_tool(
    marker: Path,
    *,
    idempotent: bool | None = None,
    block: threading.Event | None = None,
    printed: bool = False,
) -> cf.Tool:
    """The ``charge`` tool writing to ``marker``; with ``block`` it waits on it after the
    side effect (forever, when nothing sets it: the process is killed there)."""

    def charge(amount: int, ctx: cf.ToolContext) -> str:
        """Charge the customer's card."""
        with marker.open("a") as out:
            out.write(f"{ctx.call_id} {ctx.idempotency_key} {ctx.resumed} {amount}\n")
            out.flush()
            os.fsync(out.fileno())
        if printed:
            print("charged", flush=True)
        if block is not None:
            block.wait()
        return f"charged {amount}"

    return cf.Tool.from_function(charge, idempotent=idempotent)


# --- a loopback HTTP server speaking the providers' protocols ---
# Just enough of the OpenAI Chat Completions and Responses and the Anthropic Messages
# protocols for end-to-end tests through the official SDKs. It records every request (path,
# raw body bytes, parsed JSON) and answers each one with the next scripted reply: a list of
# server-sent event payloads (a stream) or a JSON object. Helpers build the streamed chunks
# of a tool call and of text for each protocol.


@dataclass(frozen=True)
class Received:
    path: str
    raw: bytes
    body: dict[str, Any]


@dataclass(frozen=True)
class _Stream:
    events: list[tuple[str | None, Any]]  # (SSE event name, data: JSON value or a raw str)


class Loopback(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, replies: list[Any]) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[Received] = []
        self.replies = list(replies)
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def next_reply(self) -> Any:
        with self.lock:
            if not self.replies:
                return None
            return self.replies.pop(0)


class _Handler(BaseHTTPRequestHandler):
    server: Loopback

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        raw = self.rfile.read(length)
        self.server.received.append(Received(self.path, raw, json.loads(raw)))
        reply = self.server.next_reply()
        if reply is None:
            self.send_error(500, "no scripted reply left")
            return
        if isinstance(reply, _Stream):
            data = "".join(
                (f"event: {name}\n" if name else "")
                + f"data: {value if isinstance(value, str) else json.dumps(value)}\n\n"
                for name, value in reply.events
            ).encode()
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


@contextmanager
def loopback(replies: list[Any]) -> Iterator[Loopback]:
    """Serve ``replies`` (one per request, in order) on 127.0.0.1 on a free port."""
    server = Loopback(replies)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# -- OpenAI Chat Completions streams ----------------------------------------------------------

_CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "created": 0,
    "model": "gpt-4o-mini",
}


def _chat(choices: list[dict[str, Any]], **extra: Any) -> tuple[None, dict[str, Any]]:
    return (None, {**_CHUNK, "choices": choices, **extra})


def _chat_end(finish: str, usage: tuple[int, int]) -> list[tuple[str | None, Any]]:
    prompt, completion = usage
    return [
        _chat([{"index": 0, "delta": {}, "finish_reason": finish}]),
        _chat(
            [],
            usage={
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            },
        ),
        (None, "[DONE]"),
    ]


def openai_tool_stream(
    call_id: str, name: str, arguments: str, *, pieces: int = 3, usage: tuple[int, int] = (50, 9)
) -> _Stream:
    """A streamed tool call: the id and name first, then the arguments in ``pieces``."""
    size = max(1, -(-len(arguments) // pieces))
    first = {
        "index": 0,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": ""},
    }
    events = [
        _chat(
            [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": None, "tool_calls": [first]},
                    "finish_reason": None,
                }
            ]
        )
    ]
    for i in range(0, len(arguments), size):
        fragment = {"index": 0, "function": {"arguments": arguments[i : i + size]}}
        events.append(
            _chat([{"index": 0, "delta": {"tool_calls": [fragment]}, "finish_reason": None}])
        )
    return _Stream(events + _chat_end("tool_calls", usage))


def openai_text_stream(pieces: list[str], *, usage: tuple[int, int] = (80, 12)) -> _Stream:
    """Streamed text, one chunk per piece."""
    events = [
        _chat([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
    ]
    events += [
        _chat([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
        for piece in pieces
    ]
    return _Stream(events + _chat_end("stop", usage))


# -- OpenAI Responses streams ----------------------------------------------------------------


def openai_responses_text_stream(
    pieces: list[str], *, usage: tuple[int, int] = (80, 12)
) -> _Stream:
    """Streamed text: one ``response.output_text.delta`` per piece, then the whole response."""
    prompt, completion = usage
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "".join(pieces), "annotations": []}],
    }
    response = {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": "gpt-4o-mini",
        "status": "completed",
        "output": [message],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        },
    }
    events: list[tuple[str | None, Any]] = [
        (
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "delta": piece,
                "sequence_number": i,
                "logprobs": [],
            },
        )
        for i, piece in enumerate(pieces)
    ]
    events.append(
        (
            "response.completed",
            {"type": "response.completed", "response": response, "sequence_number": len(pieces)},
        )
    )
    return _Stream(events)


# -- Anthropic Messages streams ---------------------------------------------------------------


def _message_start(
    input_tokens: int, cache_read: int = 0, cache_write: int = 0
) -> tuple[str, dict[str, Any]]:
    usage = {"input_tokens": input_tokens, "output_tokens": 1}
    if cache_read or cache_write:
        usage |= {"cache_read_input_tokens": cache_read, "cache_creation_input_tokens": cache_write}
    message: dict[str, Any] = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return ("message_start", {"type": "message_start", "message": message})


def _anthropic_end(stop: str, output_tokens: int) -> list[tuple[str | None, Any]]:
    return [
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def anthropic_tool_stream(
    call_id: str, name: str, arguments: str, *, pieces: int = 3, input_tokens: int = 50
) -> _Stream:
    """A streamed tool_use block with its input JSON in ``pieces`` partial_json deltas."""
    size = max(1, -(-len(arguments) // pieces))
    block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    events: list[tuple[str | None, Any]] = [
        _message_start(input_tokens),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
    ]
    for i in range(0, len(arguments), size):
        delta = {"type": "input_json_delta", "partial_json": arguments[i : i + size]}
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        )
    events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    return _Stream(events + _anthropic_end("tool_use", 9))


def anthropic_text_stream(
    pieces: list[str], *, input_tokens: int = 80, cache_read: int = 0, cache_write: int = 0
) -> _Stream:
    """Streamed text; ``cache_read``/``cache_write`` add the prompt's cached token counts."""
    block = {"type": "text", "text": ""}
    events: list[tuple[str | None, Any]] = [
        _message_start(input_tokens, cache_read, cache_write),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": block},
        ),
    ]
    for piece in pieces:
        delta = {"type": "text_delta", "text": piece}
        events.append(
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        )
    events.append(("content_block_stop", {"type": "content_block_stop", "index": 0}))
    return _Stream(events + _anthropic_end("end_turn", 12))


# --- workers: agent streams, answered checks, waiting on conditions ---


async def new_agent_stream(journal: Journal, stream: str, text: str = "hello") -> None:
    await journal.append(stream, system_prompt("You answer."))
    await journal.append(stream, user(text))


async def answered(journal: Journal, stream: str) -> bool:
    """Whether the stream's agent has nothing left to do (every trigger answered)."""
    context = await journal.fold(AgentContext, stream)
    sched = await journal.fold(Scheduler, stream)
    return decide(sched, context, TurnBudgets()).action == "idle"


async def eventually(check: Callable[[], Awaitable[bool]], *, what: str, limit: float = 60) -> None:
    """Wait until ``check()`` holds; fail (naming ``what``) if it does not within ``limit``
    seconds, a bound against a hang, never a timing assertion."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.02)


def echo_app(answer: str = "ok") -> Callable[[Journal, str], Agent]:
    model = FunctionModel(lambda request: answer)

    def app(journal: Journal, stream: str) -> Agent:
        return Agent(journal, stream, model)

    return app


@contextlib.asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """The worker running in a task; stopped (gracefully) and awaited at the end."""
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, 60)
