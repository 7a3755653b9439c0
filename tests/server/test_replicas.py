"""Two ``contextfold serve`` processes on one PostgreSQL database: an append through either
reaches the live tails of both, ``Last-Event-ID`` resumes a tail on the other replica, and
a replica killed with SIGKILL mid-stream loses nothing it acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import contextfold as cf
from tests.server.helpers import SseFrame, SseReader

pytestmark = pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")

STREAM = "replicated"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Replica:
    """``contextfold serve`` on the database in a child process, with its log."""

    def __init__(self, url: str, log_path: Path) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.child = subprocess.Popen(
            [sys.executable, "-m", "contextfold", "serve", "--url", url, "--port", str(self.port)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )

    async def ready(self) -> None:
        async with httpx.AsyncClient(base_url=self.base, timeout=5) as client:
            for _ in range(600):  # up to 30 s: slow machines take a while to import and bind
                with contextlib.suppress(httpx.TransportError):
                    await client.get("/v1/streams")
                    return
                assert self.child.poll() is None, self.log_path.read_text()
                await asyncio.sleep(0.05)
        raise AssertionError(f"serve never answered:\n{self.log_path.read_text()}")

    def kill(self) -> None:
        self.child.send_signal(signal.SIGKILL)
        self.child.wait()

    def close(self) -> None:
        if self.child.poll() is None:
            self.child.terminate()
            try:
                self.child.wait(15)
            except subprocess.TimeoutExpired:
                self.child.kill()
                self.child.wait()
        self._log.close()


@pytest.fixture
async def replicas(pg_dsn: str, tmp_path: Path) -> AsyncIterator[tuple[Replica, Replica]]:
    async with cf.open_journal(pg_dsn):  # the schema once, before two processes race for it
        pass
    pair = (Replica(pg_dsn, tmp_path / "a.log"), Replica(pg_dsn, tmp_path / "b.log"))
    try:
        await asyncio.gather(*(replica.ready() for replica in pair))
        yield pair
    finally:
        for replica in pair:
            replica.close()


def note(n: int) -> dict[str, Any]:
    return {"events": [{"type": "replica.note", "payload": {"n": n}}]}


@contextlib.asynccontextmanager
async def tail(base: str, last_event_id: str | None = None) -> AsyncIterator[SseReader]:
    headers = {"Last-Event-ID": last_event_id} if last_event_id else {}
    timeout = httpx.Timeout(10, read=None)
    async with (
        httpx.AsyncClient(base_url=base, timeout=timeout) as client,
        client.stream("GET", f"/v1/streams/{STREAM}/tail", headers=headers) as response,
    ):
        assert response.status_code == 200
        yield SseReader(response)


def n_of(frame: SseFrame) -> int:
    value: int = json.loads(frame.data)["payload"]["n"]
    return value


async def test_an_append_through_either_replica_reaches_the_tails_of_both(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    async with (
        tail(a.base) as on_a,
        tail(b.base) as on_b,
        httpx.AsyncClient(timeout=10) as client,
    ):
        for n, through in enumerate((a, b, a, b)):
            posted = await client.post(f"{through.base}/v1/streams/{STREAM}/events", json=note(n))
            assert posted.status_code == 201
        seen_a = [await on_a.next(timeout=30) for _ in range(4)]
        seen_b = [await on_b.next(timeout=30) for _ in range(4)]
    assert [n_of(f) for f in seen_a] == [n_of(f) for f in seen_b] == [0, 1, 2, 3]
    assert [f.id for f in seen_a] == [f.id for f in seen_b]  # one cursor, whichever replica


async def test_last_event_id_resumes_a_tail_on_the_other_replica(
    replicas: tuple[Replica, Replica],
) -> None:
    a, b = replicas
    async with httpx.AsyncClient(timeout=10) as client:
        for n in range(5):
            await client.post(f"{a.base}/v1/streams/{STREAM}/events", json=note(n))
    async with tail(a.base) as on_a:
        first = [await on_a.next(timeout=30) for _ in range(2)]
    async with tail(b.base, last_event_id=first[-1].id) as on_b:
        rest = [await on_b.next(timeout=30) for _ in range(3)]
    assert [n_of(f) for f in first + rest] == [0, 1, 2, 3, 4]


async def test_a_replica_killed_mid_stream_loses_nothing_it_acknowledged(
    replicas: tuple[Replica, Replica], pg_dsn: str
) -> None:
    a, b = replicas
    acknowledged: list[int] = []
    frames: list[SseFrame] = []
    enough = asyncio.Event()

    async def write() -> None:
        async with httpx.AsyncClient(base_url=a.base, timeout=10) as client:
            for n in range(10_000):
                try:
                    posted = await client.post(f"/v1/streams/{STREAM}/events", json=note(n))
                except httpx.TransportError:
                    return  # the replica is gone: what it answered 201 for must be stored
                assert posted.status_code == 201
                acknowledged.append(n)
                if len(acknowledged) == 50:
                    enough.set()

    async def follow() -> None:
        with contextlib.suppress(httpx.HTTPError):
            async with tail(a.base) as on_a:
                while True:
                    frames.append(await on_a.next(timeout=60))

    writer, follower = asyncio.create_task(write()), asyncio.create_task(follow())
    await asyncio.wait_for(enough.wait(), 60)
    a.kill()  # SIGKILL while appends and the tail are in flight
    await asyncio.wait_for(writer, 30)
    await asyncio.wait_for(follower, 30)
    async with cf.open_journal(pg_dsn) as journal:
        stored = [e async for e in journal.read_all(STREAM)]
    written = [e.payload["n"] for e in stored]
    assert [e.position for e in stored] == list(range(1, len(stored) + 1))
    assert len(written) == len(set(written))
    assert set(acknowledged) <= set(written)  # an append in flight may have landed too
    # The killed replica's tail resumes on the other one: no event lost or repeated.
    resumed: list[SseFrame] = []
    async with tail(b.base, last_event_id=frames[-1].id if frames else None) as on_b:
        while len(frames) + len(resumed) < len(stored):
            resumed.append(await on_b.next(timeout=30))
    assert [n_of(f) for f in frames + resumed] == written
