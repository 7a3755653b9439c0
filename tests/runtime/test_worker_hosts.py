"""Many hosts on one PostgreSQL, simulated: two worker processes, each with its own
connection pool and its own clock (the real time moved by an offset of its own), serve a
namespace of streams that receive user messages, answered by a model that calls a
side-effecting tool.

Within the lease's clock bound (hosts' clocks apart by less than a third of the ttl), no
live holder is ever taken over; a host paused past its lease's expiry is, and the other
re-sends its unanswered request byte for byte (a recorded retry) while the paused host's
answer, once it wakes, is refused. Beyond the bound, a host whose clock runs ahead takes
live holders' leases over: clocks decide liveness only, so even then no two holders
append, no request is sent more often than recorded, no tool runs twice and every request
rebuilds with drift 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from contextfold.context.events import LlmResponse, ToolCallResult
from contextfold.context.rebuild import RequestRecorded, verify_requests
from contextfold.journal import Journal, open_journal
from contextfold.runtime.lease import StreamLeased, lease_table
from contextfold.runtime.loop import system_prompt
from tests.runtime.helpers import answered, eventually, user

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="needs SIGSTOP"),
]

NAMESPACE = "hosts"
STREAMS = [f"host/{n:02d}" for n in range(12)]
MESSAGES = 3
TTL = 3.0
SLOW = 2.0  # seconds a "slow" message's model call takes: long enough to pause its host in

# A host: the app (a model that calls the side-effecting ``charge`` once per user message,
# then answers; every send and every run logged before it happens, one O_APPEND write
# each) served by a Worker whose journal reads a clock ``skew`` seconds off the real one.
HOST = '''
import asyncio
import dataclasses
import json
import os
import random
import signal
import sys
from datetime import UTC, datetime, timedelta

import contextfold as cf
from contextfold.wire import render_request

URL, NAMESPACE, NAME = sys.argv[1:4]
SKEW, TTL, SLOW = (float(x) for x in sys.argv[4:7])
_LOGS = os.environ["HOST_LOGS"]
_SENDS = os.open(os.path.join(_LOGS, "sends"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
_RUNS = os.open(os.path.join(_LOGS, "runs"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)


def clock():
    return datetime.now(UTC) + timedelta(seconds=SKEW)


def model_of(stream):
    async def model(request):
        sha = render_request(request, "openai-chat").sha256
        os.write(_SENDS, f"{NAME} {stream} {sha}\\n".encode())
        users = [m.content for m in request.messages if m.role == "user"]
        slow = any("slow" in text for text in users[-2:])
        await asyncio.sleep(SLOW if slow else random.uniform(0.01, 0.1))
        last = request.messages[-2]  # the last message is the request's timestamp tail
        if last.role == "tool":
            return "done"
        call = cf.ToolCall(id=f"call-{len(request.messages)}", name="charge", arguments="{}")
        return cf.ModelOutput(tool_calls=(call,))

    return cf.FunctionModel(model)


async def charge(ctx: cf.ToolContext) -> str:
    """Charge the customer's card (a side effect: never run twice silently)."""
    os.write(_RUNS, f"{ctx.stream} {ctx.call_id}\\n".encode())
    return "charged"


TOOLS = [cf.Tool.from_function(charge)]


def build(journal, stream):
    return cf.Agent(journal, stream, model_of(stream), tools=TOOLS)


async def main():
    async with cf.open_journal(URL, namespace=NAMESPACE, clock=clock, max_size=6) as journal:
        worker = cf.Worker(journal, build, concurrency=16, ttl=TTL, holder=NAME)
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, worker.stop)
        print("serving", flush=True)
        await worker.run()
    print(json.dumps(dataclasses.asdict(worker.stats)), flush=True)


asyncio.run(main())
'''


@dataclass(frozen=True)
class Hosts:
    """The skew of each host's clock (seconds), and whether one host is paused past its
    lease's expiry halfway."""

    skews: dict[str, float]
    pause: bool


WITHIN = Hosts({"host-a": 0.4, "host-b": -0.4}, pause=True)  # 0.8 s apart: under TTL / 3
BEYOND = Hosts({"host-a": 0.0, "host-b": TTL + 0.5}, pause=False)  # b sees every lease lapsed


def _start(tmp_path: Path, url: str, name: str, skew: float) -> subprocess.Popen[str]:
    script = tmp_path / "host.py"
    script.write_text(HOST)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HOST_LOGS": str(tmp_path)}
    return subprocess.Popen(
        [sys.executable, str(script), url, NAMESPACE, name, str(skew), str(TTL), str(SLOW)],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )


async def _all_answered(journal: Journal) -> bool:
    return all([await answered(journal, s) for s in STREAMS])


def _sent(logs: Path) -> list[tuple[str, str, str]]:
    """Every send so far: host, stream, sha256."""
    path = logs / "sends"
    lines = path.read_text().splitlines() if path.exists() else []
    return [(host, stream, sha) for host, stream, sha in (line.split() for line in lines)]


@pytest.mark.parametrize("hosts", [WITHIN, BEYOND], ids=["within-the-bound", "beyond-it"])
async def test_hosts_with_skewed_clocks_never_append_as_two_holders(
    pg_dsn: str, tmp_path: Path, hosts: Hosts
) -> None:
    async with open_journal(pg_dsn, namespace=NAMESPACE) as journal:
        for stream in STREAMS:
            await journal.append(stream, system_prompt("You charge cards with charge."))
        children: dict[str, subprocess.Popen[str]] = {}
        try:
            # host-a serves the first messages alone (so it holds every stream), then
            # host-b joins: a slow request of host-a's is taken over (after host-a's pause
            # past its expiry, or at once by host-b's clock beyond the bound), and both
            # serve one more message on every stream.
            for name in ("host-a", "host-b"):
                children[name] = child = _start(tmp_path, pg_dsn, name, hosts.skews[name])
                assert child.stdout is not None and child.stdout.readline().strip() == "serving"
                if name == "host-a":
                    await _messages(journal, range(MESSAGES))
            slow, began = await _slow_turn(journal, children["host-a"], tmp_path, hosts.pause)
            await _messages(journal, [MESSAGES])
            for child in children.values():
                child.send_signal(signal.SIGTERM)
            stats = {
                name: json.loads((await asyncio.to_thread(child.communicate, timeout=60))[0])
                for name, child in children.items()
            }
        finally:
            for child in children.values():
                if child.poll() is None:
                    child.send_signal(signal.SIGCONT)
                    child.kill()
                    child.wait()
                if child.stdout is not None:
                    child.stdout.close()
        takeovers = await _check(journal, tmp_path, hosts)
        # host-a's slow request was re-sent by host-b, byte for byte, as a recorded retry,
        # and host-a's own answer to it refused.
        retried = [shas for shas in (await _recorded(journal, slow)).values() if len(shas) > 1]
        assert len(retried) == 1 and len(set(retried[0])) == 1
        senders = {host for host, stream, sha in _sent(tmp_path) if sha == retried[0][0]}
        assert senders == {"host-a", "host-b"}
    assert stats["host-a"]["lost"] >= 1
    assert takeovers and all(t[1:] == ("host-b", "host-a") for _, t in takeovers)
    if hosts.pause:
        # Within the bound no live holder was ever taken over: only the paused host's
        # stream, after it was paused.
        assert {stream for stream, _ in takeovers} == {slow}
        assert all(at >= began for _, (at, _, _) in takeovers), (takeovers, began)


async def _messages(journal: Journal, rounds: Iterable[int]) -> None:
    """A message on every stream per round, then until every one is answered."""
    for k in rounds:
        for stream in STREAMS:
            await journal.append(stream, user(f"charge {stream} #{k}"))
            await asyncio.sleep(0.03)
    await eventually(lambda: _all_answered(journal), what="every message answered")


async def _slow_turn(
    journal: Journal, host: subprocess.Popen[str], logs: Path, pause: bool
) -> tuple[str, datetime]:
    """Send a stream host-a holds a message its model takes ``SLOW`` seconds over; once
    host-a sent the request, stop it (``pause``) until host-b took the stream over and
    answered, else just wait for that. Returns the stream and when the request was sent
    (the real time)."""
    leases = {r.stream: r.holder for r in await lease_table(journal, prefix="host/")}
    stream = next(s for s in STREAMS if leases.get(s) == "host-a")
    before = len(_sent(logs))
    await journal.append(stream, user(f"charge {stream} slow"))

    async def sent_by_a() -> bool:
        return any(h == "host-a" and s == stream for h, s, _ in _sent(logs)[before:])

    await eventually(sent_by_a, what="host-a sends the slow request")
    if pause:
        host.send_signal(signal.SIGSTOP)
    began = journal.clock()
    try:
        await eventually(lambda: answered(journal, stream), what="host-b takes over and answers")
    finally:
        host.send_signal(signal.SIGCONT)
    await asyncio.sleep(SLOW)  # host-a's model call returns; its answer is refused
    return stream, began


async def _recorded(journal: Journal, stream: str) -> dict[int, list[str]]:
    recorded: dict[int, list[str]] = {}
    async for stored in journal.read_all(stream, types=[RequestRecorded]):
        record = stored.decode(RequestRecorded)
        assert isinstance(record, RequestRecorded)
        recorded.setdefault(record.request_offset, []).append(record.sha256)
    return recorded


async def _check(
    journal: Journal, logs: Path, hosts: Hosts
) -> list[tuple[str, tuple[datetime, str, str]]]:
    """Every message answered once, every request sent at most as often as recorded and
    rebuilt with drift 0, no tool run twice; returns each takeover of a held lease: its
    stream, and the real time it landed, its holder and the holder it took over from."""
    sends = Counter(sha for _, _, sha in _sent(logs))
    runs = Counter(tuple(line.split()) for line in (logs / "runs").read_text().splitlines())
    recorded: Counter[str] = Counter()
    takeovers: list[tuple[str, tuple[datetime, str, str]]] = []
    for stream in STREAMS:
        assert await answered(journal, stream), stream
        offsets: Counter[int] = Counter()
        answers: Counter[int] = Counter()
        previous: StreamLeased | None = None
        async for stored in journal.read_all(stream):
            event = stored.decode()
            if isinstance(event, RequestRecorded):
                recorded[event.sha256] += 1
                offsets[event.request_offset] += 1
            elif isinstance(event, LlmResponse):
                answers[event.request_offset] += 1
            elif isinstance(event, ToolCallResult):
                assert runs[(stream, event.tool_call_id)] <= 1, (stream, event.tool_call_id)
            elif isinstance(event, StreamLeased):
                taken = previous is not None and previous.token != event.token
                if taken and previous is not None and previous.state == "held":
                    real = datetime.fromisoformat(stored.meta.time) - timedelta(
                        seconds=hosts.skews[event.holder]
                    )
                    takeovers.append((stream, (real, event.holder, previous.holder)))
                previous = event
        assert set(answers) == set(offsets) and set(answers.values()) == {1}, stream
        assert await verify_requests(journal, stream) == (), stream
    extra = {sha: n for sha, n in sends.items() if n > recorded[sha]}
    assert extra == {}  # no request sent more often than recorded (retries included)
    return takeovers
