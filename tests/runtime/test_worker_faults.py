"""Proof by faults: 3 ``contextfold worker`` processes serve 100 streams on PostgreSQL that
receive user messages over time (a third through each of two ``contextfold serve``
replicas, a third straight into the journal), answered with a tool-calling model whose
tool has a side effect. Every few seconds a random worker is killed with SIGKILL and a new
one started; once, the database server itself is restarted.

At the end: every trigger is answered; no request was sent more often than the journal
records it (a second send is a recorded retry); no side-effecting tool ran twice, and
one that may have run is recorded so; every stream's requests rebuild with drift 0; no
claim took over a lease before it expired, and no lease of a dead worker is still held.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import random
import signal
import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from contextfold.context.events import ContextAdded, ToolCallResult, ToolCallStarted
from contextfold.context.rebuild import RequestRecorded, verify_requests
from contextfold.errors import StoreError
from contextfold.journal import Journal, open_journal
from contextfold.runtime.lease import StreamLeased, lease_table
from contextfold.runtime.loop import system_prompt
from contextfold.runtime.tool_runs import NOT_RERUN
from tests.runtime.helpers import answered, eventually, user

if TYPE_CHECKING:
    from tests.pgserver import TemporaryPostgres

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL"),
]

NAMESPACE = "fault"
STREAMS = [f"fault/{n:03d}" for n in range(100)]
MESSAGES = 3  # per stream, spread over the feeding time
FEEDING = 30.0  # seconds over which the messages arrive
WORKERS = 3
KILL_EVERY = 3.0
TTL = 2.0

# The app every worker process serves: a model that calls the side-effecting ``charge``
# tool once per user message, then answers. Every send and every tool run is logged (one
# O_APPEND write each, so a SIGKILL never leaves half a line) before it happens.
APP = '''
import asyncio
import os
import random

import contextfold as cf
from contextfold.wire import render_request

_LOGS = os.environ["FAULT_LOGS"]
_SENDS = os.open(os.path.join(_LOGS, "sends"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
_RUNS = os.open(os.path.join(_LOGS, "runs"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)


async def model(request):
    os.write(_SENDS, (render_request(request, "openai-chat").sha256 + "\\n").encode())
    await asyncio.sleep(random.uniform(0.01, 0.2))  # long enough to be killed in it
    last = request.messages[-2]  # the last message is the request's timestamp tail
    if last.role == "tool":
        return "done: " + last.content.splitlines()[-1]
    call = cf.ToolCall(id=f"call-{len(request.messages)}", name="charge", arguments="{}")
    return cf.ModelOutput(tool_calls=(call,))


async def charge(ctx: cf.ToolContext) -> str:
    """Charge the customer's card (a side effect: never run twice silently)."""
    os.write(_RUNS, f"{ctx.stream} {ctx.call_id}\\n".encode())
    await asyncio.sleep(random.uniform(0.01, 0.2))
    return "charged"


MODEL = cf.FunctionModel(model)
TOOLS = [cf.Tool.from_function(charge)]


def build(journal, stream):
    return cf.Agent(journal, stream, MODEL, tools=TOOLS)
'''


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Children:
    """The child processes of the test (workers and replicas), each with its log."""

    def __init__(self, tmp_path: Path, url: str) -> None:
        self.tmp_path = tmp_path
        self.url = url
        self.env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(sys.path),
            "FAULT_LOGS": str(tmp_path),
        }
        self.workers: list[subprocess.Popen[bytes]] = []
        self.logs: dict[int, Path] = {}
        self.replicas: list[tuple[subprocess.Popen[bytes], str]] = []
        self._started = 0

    def _spawn(self, *command: str) -> subprocess.Popen[bytes]:
        self._started += 1
        path = self.tmp_path / f"child-{self._started}.log"
        with path.open("wb") as log:  # the child holds its own copy
            child = subprocess.Popen(
                [sys.executable, "-m", "contextfold", *command],
                cwd=self.tmp_path,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        self.logs[child.pid] = path
        return child

    async def serving(self, worker: subprocess.Popen[bytes]) -> bool:
        """Whether the worker is up (its SIGTERM handler installed)."""
        assert worker.poll() is None, self.logs[worker.pid].read_text()
        return "serving namespace" in self.logs[worker.pid].read_text()

    def start_worker(self) -> subprocess.Popen[bytes]:
        worker = self._spawn(
            "worker",
            *("--url", self.url, "--namespace", NAMESPACE, "--app", "fault_app:build"),
            *("--concurrency", "8", "--ttl", str(TTL)),
        )
        self.workers.append(worker)
        return worker

    def start_replica(self) -> str:
        port = _free_port()
        replica = self._spawn("serve", "--url", self.url, "--port", str(port))
        base = f"http://127.0.0.1:{port}"
        self.replicas.append((replica, base))
        return base

    def live_workers(self) -> list[subprocess.Popen[bytes]]:
        return [w for w in self.workers if w.poll() is None]

    def close(self) -> None:
        for child in [*self.workers, *(r for r, _ in self.replicas)]:
            if child.poll() is None:
                child.kill()
                child.wait()


async def _ready(base: str) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        for _ in range(1200):
            with contextlib.suppress(httpx.TransportError):
                await client.get("/v1/streams")
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"replica {base} never answered")


async def _post_until_stored(client: httpx.AsyncClient, base: str, stream: str, k: int) -> None:
    body = {
        "events": [
            {
                "type": ContextAdded.event_type,
                "payload": {"role": "user", "content": f"charge for {stream} #{k}"},
            }
        ],
        "idempotency_key": f"{stream}#{k}",  # a retry after a lost answer stores nothing twice
    }
    headers = {"X-Contextfold-Namespace": NAMESPACE}
    while True:
        try:
            posted = await client.post(
                f"{base}/v1/streams/{stream}/events", json=body, headers=headers
            )
            if posted.status_code in (200, 201):
                return
            assert posted.status_code >= 500, posted.text  # only the server's trouble is retried
        except httpx.TransportError:
            pass  # the database restarting under the replica: try again
        await asyncio.sleep(0.2)


async def _append_until_stored(journal: Journal, stream: str, k: int) -> None:
    while True:
        try:
            await journal.append(
                stream, user(f"charge for {stream} #{k}"), idempotency_key=f"{stream}#{k}"
            )
            return
        except StoreError:
            await asyncio.sleep(0.2)


async def _feed(journal: Journal, bases: list[str]) -> int:
    """Send every stream its messages over :data:`FEEDING` seconds; returns how many."""
    plan = [(stream, k) for k in range(MESSAGES) for stream in STREAMS]
    loop = asyncio.get_running_loop()
    start, pause = loop.time(), FEEDING / len(plan)
    async with httpx.AsyncClient(timeout=10) as client:
        for index, (stream, k) in enumerate(plan):
            route = index % 3
            if route == 2:
                await _append_until_stored(journal, stream, k)
            else:
                await _post_until_stored(client, bases[route], stream, k)
            await asyncio.sleep(max(start + index * pause - loop.time(), 0))  # pacing only
    return len(plan)


async def _faults(children: Children, pg_server: TemporaryPostgres, stop: asyncio.Event) -> int:
    """Kill a random worker every few seconds (and start another); restart the database
    once. Returns the number of kills."""
    kills, restarted, rng = 0, False, random.Random(13)
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), KILL_EVERY)
        if stop.is_set():
            break
        if kills == 3 and not restarted:
            restarted = True
            await asyncio.to_thread(pg_server.restart)
            continue
        victim = rng.choice(children.live_workers())
        victim.send_signal(signal.SIGKILL)
        await asyncio.to_thread(victim.wait)
        kills += 1
        children.start_worker()
    assert restarted, "the test ended before the database restart"
    return kills


async def test_workers_survive_kills_and_a_database_restart(
    pg_dsn: str, pg_server: TemporaryPostgres, tmp_path: Path
) -> None:
    (tmp_path / "fault_app.py").write_text(APP)
    async with open_journal(pg_dsn, namespace=NAMESPACE) as journal:
        for stream in STREAMS:
            await journal.append(stream, system_prompt("You charge cards with charge."))
        children = Children(tmp_path, pg_dsn)
        try:
            bases = [children.start_replica(), children.start_replica()]
            for _ in range(WORKERS):
                children.start_worker()
            await asyncio.gather(*(_ready(base) for base in bases))
            stop = asyncio.Event()
            faults = asyncio.create_task(_faults(children, pg_server, stop))
            triggers = await _feed(journal, bases)

            async def all_answered() -> bool:
                try:
                    return all([await answered(journal, s) for s in STREAMS])
                except StoreError:
                    return False

            try:
                await eventually(all_answered, what="every trigger answered", limit=120)
            except AssertionError:
                raise AssertionError(await _unanswered(journal)) from None
            stop.set()
            kills = await faults
            for worker in children.live_workers():
                await eventually(functools.partial(children.serving, worker), what="up")
                worker.send_signal(signal.SIGTERM)  # graceful: hands its leases back
            codes = [await asyncio.to_thread(w.wait, 60) for w in children.live_workers()]
            assert set(codes) <= {0}, codes
            counts = await _check(journal, tmp_path, triggers)
        finally:
            children.close()
    print(
        "FAULTS "
        + " ".join(f"{name}={value}" for name, value in {"kills": kills, **counts}.items())
    )


async def _unanswered(journal: Journal) -> str:
    """What a failure says: each stream left unanswered, with its newest events."""
    lines = []
    for stream in STREAMS:
        if await answered(journal, stream):
            continue
        events = [stored async for stored in journal.read_all(stream)][-6:]
        lines.append(f"{stream}:")
        lines += [f"  @{e.position} {e.meta.time} {e.type} {e.data[:160]!r}" for e in events]
    return "never happened: every trigger answered\n" + "\n".join(lines)


async def _check(journal: Journal, logs: Path, triggers: int) -> dict[str, Any]:
    sends = Counter((logs / "sends").read_text().split())
    runs = Counter(tuple(line.split()) for line in (logs / "runs").read_text().splitlines())
    recorded: Counter[str] = Counter()
    requests = retries = possibly_run = takeovers = users = 0
    for stream in STREAMS:
        assert await answered(journal, stream), stream
        by_offset: dict[int, int] = {}
        started: set[str] = set()
        previous: tuple[StreamLeased, datetime] | None = None
        async for stored in journal.read_all(stream):
            event = stored.decode()
            if isinstance(event, RequestRecorded):
                recorded[event.sha256] += 1
                by_offset[event.request_offset] = by_offset.get(event.request_offset, 0) + 1
            elif isinstance(event, ToolCallStarted):
                started.add(event.tool_call_id)
            elif isinstance(event, ToolCallResult):
                ran = runs[(stream, event.tool_call_id)]
                assert ran <= 1, (stream, event.tool_call_id, ran)  # never twice
                if event.content == NOT_RERUN:
                    assert event.tool_call_id in started  # the record says it may have run
                    possibly_run += 1
                else:
                    assert ran == 1, (stream, event.tool_call_id)
            elif isinstance(event, ContextAdded) and event.role == "user":
                users += 1
            elif isinstance(event, StreamLeased):
                at = datetime.fromisoformat(stored.meta.time)
                if previous is not None and previous[0].token != event.token:
                    before, _ = previous
                    if before.state != "released" and before.holder != event.holder:
                        # A takeover of another worker's lease: only once it expired.
                        assert at >= before.expires_at, (stream, stored.position)
                        takeovers += 1
                previous = (event, at)
        requests += len(by_offset)
        retries += sum(n - 1 for n in by_offset.values())
        assert await verify_requests(journal, stream) == (), stream
    assert users == triggers  # every message the feeder was told is stored, once
    extra = {sha: n for sha, n in sends.items() if n > recorded[sha]}
    assert extra == {}  # no request sent more often than recorded (retries included)
    assert set(sends) <= set(recorded)

    async def unheld() -> bool:
        now = journal.clock()
        return all(r.status(now) in ("released", "expired") for r in await lease_table(journal))

    # The live workers handed theirs back; a dead one's lapses within its ttl.
    await eventually(unheld, what="no lease held by a dead worker past its expiry", limit=TTL * 5)
    stale = 0
    return {
        "streams": len(STREAMS),
        "triggers": triggers,
        "requests": requests,
        "sends": sum(sends.values()),
        "retries": retries,
        "tool_runs": sum(runs.values()),
        "possibly_run": possibly_run,
        "takeovers": takeovers,
        "db_restarts": 1,
        "drift": 0,
        "stale_leases": stale,
    }
