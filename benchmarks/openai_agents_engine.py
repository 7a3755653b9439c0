"""Benchmark: contextfold's context engine inside the OpenAI Agents SDK's model call.

(a) Overhead. One Agent holds a conversation of ``--turns`` turns (a tool call, then an
answer, per user message; each run's input is the previous run's ``to_input_list()`` and the
new message), once on a plain instant model (an SDK ``Model`` returning canned responses)
and once through ``JournalModel`` with a budget, recording on a SQLite journal, answered by
an instant ``cf.FunctionModel``, in the same run:

  openai_agents_model_overhead   CPU seconds per model call (the process's, store thread
                                 included) through JournalModel against the plain
                                 instant model (<= 1.2)

A real model call takes 300 ms to 30 s; the instant model makes the SDK's own work the
whole of the baseline, so this is the worst case. The CPU inside ``JournalModel`` and in the
garbage collector is printed beside it, to say where the difference goes.

(b) One long tool-heavy session, ``--session-turns`` user turns of a tool call (returning
2,000 characters) and an answer, side by side:

- contextfold: ``JournalModel(compact_at=...)`` (compaction by cutoff, a summary written by
  the same instant model, deterministic) over a ``JournalCompactionSession`` (the session
  compacted by summary as a journal event), on a SQLite journal;
- the SDK: its ``OpenAIResponsesModel`` against a loopback Responses endpoint answering the
  same script, over ``OpenAIResponsesCompactionSession(SQLiteSession)`` whose compaction
  endpoint (``/v1/responses/compact`` on the same loopback server) answers as OpenAI's
  does: the user messages, then one opaque compaction item. Both compact at the same
  token threshold.

  openai_agents_pairs_split               tool calls without their result (or results
                                          without their call) in any request (== 0; the
                                          SDK's count is printed)
  openai_agents_prompt_cache_vs_sdk       the share of a request's bytes that repeat the
                                          previous request's prefix, the mean over
                                          requests, contextfold / SDK (>= 1.0; the share
                                          of all request bytes is printed too)
  openai_agents_originals_recoverable     of the items the Runner gave the session, the
                                          share still readable after compaction, exactly
                                          (== 1.0; the SDK's share is printed)

Run: .venv/bin/python benchmarks/openai_agents_engine.py [--turns N] [--session-turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
from agents import (
    Agent,
    Model,
    ModelResponse,
    OpenAIResponsesCompactionSession,
    OpenAIResponsesModel,
    Runner,
    SQLiteSession,
    Usage,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

import contextfold as cf
from contextfold import telemetry as tm
from contextfold.context.compaction import COMPACTION_INSTRUCTION
from contextfold.integrations.openai_agents import (
    JournalCompactionSession,
    JournalModel,
    JournalSession,
)

TARGET = 1.2
INSTRUCTIONS = "Read the files the user names with read_file, then report."
set_tracing_disabled(True)  # the SDK traces to OpenAI by default: this stays offline

OUTPUT = 2_000


def file_text(path: str, size: int) -> str:
    return f"{path}: " + "x" * size


@function_tool
def read_file(path: str) -> str:
    """Read a file of the workspace."""
    return file_text(path, OUTPUT)


def canonical(item: Any) -> bytes:
    return orjson.dumps(item, option=orjson.OPT_SORT_KEYS)


# -- (a) overhead -----------------------------------------------------------------------------


class Instant(Model):
    """A tool call per user message, then an answer; costs nothing."""

    def __init__(self) -> None:
        self.calls = 0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        self.calls += 1
        items = args[1] if len(args) > 1 else kwargs["input"]
        last = items[-1] if isinstance(items, list) else {"role": "user"}
        output: list[Any]
        if last.get("type") == "function_call_output":
            text = ResponseOutputText(type="output_text", text="done", annotations=[])
            output = [
                ResponseOutputMessage(
                    id=f"msg_{self.calls}",
                    type="message",
                    role="assistant",
                    status="completed",
                    content=[text],
                )
            ]
        else:
            output = [
                ResponseFunctionToolCall(
                    type="function_call",
                    name="read_file",
                    arguments='{"path": "a.py"}',
                    call_id=f"call_{self.calls}",
                )
            ]
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError


class Script:
    """The same script as :class:`Instant`, as a contextfold function model, and the
    deterministic summarizer of compactions. Call ids are unique over the conversation,
    as the SDK requires of a model."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, request: cf.NeutralRequest) -> cf.ModelOutput | str:
        last = request.messages[-1]
        if last.content == COMPACTION_INSTRUCTION:
            return SUMMARY
        before = request.messages[-2] if len(request.messages) > 1 else last
        if before.role == "tool":
            return "done"
        self.calls += 1
        arguments = f'{{"path": "f{self.calls}.py"}}'
        call = cf.ToolCall(id=f"call_{self.calls}", name="read_file", arguments=arguments)
        return cf.ModelOutput(tool_calls=(call,))


SUMMARY = "Summary: the files read so far, each as the user asked."


def summarizer() -> cf.FunctionModel:
    """The session's summarizer: deterministic."""
    return cf.FunctionModel(lambda request: SUMMARY, transport="openai-responses", model="gpt-4.1")


@dataclass
class Spent:
    """CPU seconds per model call of one conversation: in all, in the garbage collector,
    and inside the model's ``get_response``."""

    total: float
    gc: float
    model: float


class TimedModel(JournalModel):
    """JournalModel, counting the CPU its calls take (the store's thread included)."""

    spent = 0.0

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        start = time.process_time()
        try:
            return await super().get_response(*args, **kwargs)
        finally:
            self.spent += time.process_time() - start


async def conversation(agent: Agent[Any], turns: int) -> Spent:
    """CPU per model call over ``turns`` turns (two model calls each): the process's, so
    another process's load on the machine does not count."""
    collecting: list[float] = []
    collected = 0.0

    def clock(phase: str, info: dict[str, Any]) -> None:
        nonlocal collected
        if phase == "start":
            collecting.append(time.process_time())
        elif collecting:
            collected += time.process_time() - collecting.pop()

    items: list[Any] = []
    gc.callbacks.append(clock)
    start = time.process_time()
    try:
        for n in range(turns):
            result = await Runner.run(agent, [*items, {"role": "user", "content": f"read f{n}"}])
            items = result.to_input_list()
    finally:
        gc.callbacks.remove(clock)
    calls = 2 * turns
    model = agent.model.spent if isinstance(agent.model, TimedModel) else 0.0
    return Spent((time.process_time() - start) / calls, collected / calls, model / calls)


async def overhead(turns: int, directory: Path) -> float:
    alone: list[Spent] = []
    through: list[Spent] = []
    async with cf.open_journal(f"sqlite:///{directory / 'overhead.db'}") as journal:
        for round_ in range(3):  # interleaved: the machine's noise hits both sides
            plain = Agent(name="a", instructions=INSTRUCTIONS, model=Instant(), tools=[read_file])
            alone.append(await conversation(plain, turns))
            client = cf.FunctionModel(Script(), transport="openai-responses", model="gpt-4.1")
            model = TimedModel(client, journal, f"overhead/{round_}", budget=8_000)
            ours = Agent(name="a", instructions=INSTRUCTIONS, model=model, tools=[read_file])
            through.append(await conversation(ours, turns))
    base = statistics.median(spent.total for spent in alone)
    ours_ = statistics.median(spent.total for spent in through)
    print(
        f"(a) CPU per model call: plain instant model {base * 1e3:.2f} ms (garbage "
        f"collection {statistics.median(s.gc for s in alone) * 1e3:.2f}), through JournalModel "
        f"{ours_ * 1e3:.2f} ms (garbage collection "
        f"{statistics.median(s.gc for s in through) * 1e3:.2f}, inside JournalModel "
        f"{statistics.median(s.model for s in through) * 1e3:.2f})"
    )
    return ours_ / base


# -- (b) a long session, side by side ---------------------------------------------------------


def split_pairs(calls: Sequence[str], answers: Sequence[str]) -> int:
    """Calls without their result plus results without their call."""
    made, answered = Counter(calls), Counter(answers)
    return sum((made - answered).values()) + sum((answered - made).values())


def cache_share(bodies: Sequence[bytes]) -> tuple[float, float]:
    """The mean over requests (the first left out) of the share of a request's bytes that
    repeat the previous request's prefix exactly (what a provider's prompt cache can
    serve), and the same share of all their bytes together."""
    shared = [tm.shared_prefix(a, b) for a, b in itertools.pairwise(bodies)]
    sizes = [len(body) for body in bodies[1:]]
    mean = statistics.fmean(s / max(n, 1) for s, n in zip(shared, sizes, strict=True))
    return mean, sum(shared) / max(sum(sizes), 1)


def recoverable(originals: Sequence[Any], stored: Sequence[Any]) -> float:
    """The share of ``originals`` still among ``stored``, exactly (as a multiset)."""
    left = Counter(canonical(item) for item in stored)
    found = 0
    for item in originals:
        key = canonical(item)
        if left[key]:
            left[key] -= 1
            found += 1
    return found / max(len(originals), 1)


@dataclass(frozen=True)
class Side:
    """What one side of (b) measured."""

    split: int
    cache: float
    cache_bytes: float
    recovered: float
    compactions: int


class Recorder:
    """A contextfold model client that keeps the bodies it sends (an instant model)."""

    def __init__(self) -> None:
        self.inner = cf.FunctionModel(Script(), transport="openai-responses", model="gpt-4.1")
        self.transport = self.inner.transport
        self.model = self.inner.model
        self.requests: list[tuple[cf.NeutralRequest, bytes]] = []

    async def complete(
        self, request: cf.NeutralRequest, rendered: cf.RenderedRequest, **kwargs: Any
    ) -> cf.ModelOutput:
        if request.messages[-1].content != COMPACTION_INSTRUCTION:
            self.requests.append((request, rendered.body))
        return await self.inner.complete(request, rendered)


def tracked(session: Any, originals: list[Any]) -> Any:
    """``session`` with every item the Runner adds noted in ``originals``."""
    add = session.add_items

    async def add_items(items: list[Any]) -> None:
        originals.extend(json.loads(json.dumps(items)))
        await add(items)

    session.add_items = add_items
    return session


def tokens(items: Sequence[Any]) -> int:
    return sum(len(canonical(item)) // 4 for item in items)


class Loopback(ThreadingHTTPServer):
    """OpenAI's Responses API on 127.0.0.1 for the SDK side: the same script as
    :class:`Script`, and ``/responses/compact`` answering as OpenAI does."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.bodies: list[bytes] = []
        self.compactions = 0
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/v1"


_USAGE = {
    "input_tokens": 1,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 1,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 2,
}


def _user_text(item: dict[str, Any]) -> str:
    content = item.get("content")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


class _Handler(BaseHTTPRequestHandler):
    server: Loopback

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        request = json.loads(body)
        with self.server.lock:
            if self.path.endswith("/compact"):
                self.server.compactions += 1
                reply = self._compacted(request, self.server.compactions)
            else:
                self.server.bodies.append(body)
                reply = self._answer(request, len(self.server.bodies))
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    @staticmethod
    def _answer(request: dict[str, Any], n: int) -> dict[str, Any]:
        last = request["input"][-1]
        if last.get("type") == "function_call_output":
            content = [{"type": "output_text", "text": "done", "annotations": []}]
            item: dict[str, Any] = {
                "type": "message",
                "id": f"msg_{n}",
                "role": "assistant",
                "status": "completed",
                "content": content,
            }
        else:
            item = {
                "type": "function_call",
                "id": f"fc_{n}",
                "call_id": f"call_{n}",
                "name": "read_file",
                "arguments": f'{{"path": "f{n}.py"}}',
                "status": "completed",
            }
        return {
            "id": f"resp_{n}",
            "object": "response",
            "created_at": 0,
            "model": request["model"],
            "status": "completed",
            "output": [item],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": _USAGE,
        }

    @staticmethod
    def _compacted(request: dict[str, Any], n: int) -> dict[str, Any]:
        users = [
            {
                "type": "message",
                "id": f"msg_user_{n}_{i}",
                "role": "user",
                "status": "completed",
                "content": [{"type": "input_text", "text": _user_text(item)}],
            }
            for i, item in enumerate(request.get("input", []))
            if item.get("role") == "user"
        ]
        compaction = {"type": "compaction", "id": f"cmp_{n}", "encrypted_content": f"opaque-{n}"}
        return {
            "id": f"resp_compact_{n}",
            "object": "response.compaction",
            "created_at": 0,
            "output": [*users, compaction],
            "usage": _USAGE,
        }

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def loopback() -> Iterator[Loopback]:
    server = Loopback()
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


async def contextfold_side(turns: int, compact_at: int, directory: Path) -> Side:
    """Pairs split, cache share and originals recovered through contextfold; compactions."""
    client = Recorder()
    originals: list[Any] = []
    async with cf.open_journal(f"sqlite:///{directory / 'session.db'}") as journal:
        session = JournalCompactionSession(
            JournalSession(journal, "long"), summarizer=summarizer(), compact_at=compact_at
        )
        tracked(session, originals)
        model = JournalModel(client, journal, "long/model", compact_at=compact_at)
        agent = Agent(name="reader", instructions=INSTRUCTIONS, model=model, tools=[read_file])
        for n in range(turns):
            await Runner.run(agent, f"read f{n}", session=session)
        split = sum(
            split_pairs(
                [call.id for m in request.messages for call in m.tool_calls],
                [m.tool_call_id for m in request.messages if m.tool_call_id is not None],
            )
            for request, _ in client.requests
        )
        recovered = recoverable(originals, await session.history())
        state = await journal.fold(cf.AgentContext, "long/model")
        compacted = sum(1 for _ in await _compactions(journal, "long/model"))
        assert state.compacted_through > 0 and await cf.verify_requests(journal, "long/model") == ()
    return Side(split, *cache_share([body for _, body in client.requests]), recovered, compacted)


async def _compactions(journal: cf.Journal, stream: str) -> list[int]:
    found = []
    async for event in journal.read_all(stream, types=[cf.ContextAdded]):
        item = event.decode(cf.ContextAdded)
        assert isinstance(item, cf.ContextAdded)
        if item.compaction is not None:
            found.append(event.position)
    return found


async def sdk_side(turns: int, compact_at: int, directory: Path) -> Side:
    """The same through the SDK's own compaction session."""
    originals: list[Any] = []
    with loopback() as server:
        openai = AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        underlying = SQLiteSession("long", directory / "sdk.db")
        session = OpenAIResponsesCompactionSession(
            "long",
            underlying,
            client=openai,
            model="gpt-4.1",
            compaction_mode="input",
            should_trigger_compaction=lambda context: tokens(context["session_items"]) > compact_at,
        )
        tracked(session, originals)
        model = OpenAIResponsesModel(model="gpt-4.1", openai_client=openai)
        agent = Agent(name="reader", instructions=INSTRUCTIONS, model=model, tools=[read_file])
        for n in range(turns):
            await Runner.run(agent, f"read f{n}", session=session)
        await openai.close()
        bodies = list(server.bodies)
        compactions = server.compactions
        stored = await underlying.get_items()
    split = 0
    for body in bodies:
        items = json.loads(body)["input"]
        split += split_pairs(
            [i["call_id"] for i in items if i.get("type") == "function_call"],
            [i["call_id"] for i in items if i.get("type") == "function_call_output"],
        )
    return Side(split, *cache_share(bodies), recoverable(originals, stored), compactions)


async def main_async(turns: int, session_turns: int, compact_at: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        ratio = await overhead(turns, directory)
        print(f"RATIO openai_agents_model_overhead {ratio:.2f} target <= {TARGET}")
        ours = await contextfold_side(session_turns, compact_at, directory)
        theirs = await sdk_side(session_turns, compact_at, directory)
    print(
        f"(b) {session_turns} tool turns ({OUTPUT:,}-character outputs), compaction over "
        f"{compact_at:,} tokens: contextfold compacted {ours.compactions} times, "
        f"the SDK {theirs.compactions} times"
    )
    print(f"  pairs split in requests: contextfold {ours.split}, the SDK {theirs.split}")
    print(f"RATIO openai_agents_pairs_split {ours.split} target == 0")
    print(
        f"  prompt-cache share, mean over requests: contextfold {ours.cache:.3f}, the SDK "
        f"{theirs.cache:.3f} (of all request bytes: {ours.cache_bytes:.3f} and "
        f"{theirs.cache_bytes:.3f})"
    )
    cache = ours.cache / theirs.cache if theirs.cache else float("inf")
    print(f"RATIO openai_agents_prompt_cache_vs_sdk {cache:.2f} target >= 1.0")
    print(
        f"  originals recoverable after compaction: contextfold {ours.recovered:.3f}, "
        f"the SDK {theirs.recovered:.3f}"
    )
    print(f"RATIO openai_agents_originals_recoverable {ours.recovered:.2f} target == 1.0")
    held = ratio <= TARGET and ours.split == 0 and cache >= 1.0 and ours.recovered == 1.0
    return 0 if held else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40, help="turns of the overhead run")
    parser.add_argument("--session-turns", type=int, default=200, help="tool turns of (b)")
    parser.add_argument("--compact-at", type=int, default=12_000, help="tokens, both sides")
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args.turns, args.session_turns, args.compact_at))


if __name__ == "__main__":
    sys.exit(main())
