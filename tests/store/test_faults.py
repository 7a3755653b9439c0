"""Store faults tried for real: kill -9, racing processes, corrupt rows.

Every concurrency test runs the journal in child processes (never threads), on SQLite and on
PostgreSQL. A child is ``_CHILD`` below, written to a file and run with ``sys.executable``; it
speaks JSON lines: one reply per line on stdout, commands on stdin. Barriers are the parent
holding back a command until every child has answered the previous one.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, NoReturn

import pytest

import contextfold as cf

pytestmark = pytest.mark.slow

STREAM = "faults"

_CHILD = r'''
"""A journal in a child process, driven by JSON lines (see tests/store/test_faults.py)."""
import asyncio
import json
import sys

import contextfold as cf


def out(value):
    sys.stdout.write(json.dumps(value) + "\n")
    sys.stdout.flush()  # the parent counts a reply only once this returns


def command():
    line = sys.stdin.readline()
    return json.loads(line) if line else None


async def kill_loop(j, stream, first_batch):
    """Append batches of 5 forever, reporting each one after append() returned."""
    batch = first_batch
    while True:
        events = [cf.RawEvent("fault.batch", {"batch": batch, "index": i}) for i in range(5)]
        r = await j.append(stream, events)
        out([batch, r.first_position, r.last_position])
        batch += 1


async def singles(j, stream, writer, count):
    """On "go", append ``count`` single events; report their positions."""
    command()
    positions = []
    for i in range(count):
        r = await j.append(stream, cf.RawEvent("fault.single", {"writer": writer, "i": i}))
        positions.append(r.last_position)
    out({"positions": positions})


async def free_race(j, stream, writer, target):
    """On "go": read the version v, append expecting v, report; until the stream holds target."""
    command()
    while True:
        v = await j.version(stream)
        if v >= target:
            break
        event = cf.RawEvent("fault.round", {"writer": writer, "v": v})
        try:
            r = await j.append(stream, event, expected_version=v)
        except cf.WrongExpectedVersionError as exc:
            out({"v": v, "outcome": "conflict", "expected": exc.expected, "actual": exc.actual})
        except Exception as exc:
            out({"v": v, "outcome": "error", "error": f"{type(exc).__name__}: {exc}"})
        else:
            out({"v": v, "outcome": "win", "position": r.last_position})
    out({"done": True})


async def serve(j, stream, writer):
    """Run commands until stdin closes: {"op": "version"} or {"op": "append", ...}."""
    while (cmd := command()) is not None:
        if cmd["op"] == "version":
            out({"version": await j.version(stream)})
            continue
        events = [cf.RawEvent("fault.served", p) for p in cmd["payloads"]]
        replies = []
        for _ in range(cmd.get("times", 1)):
            try:
                r = await j.append(
                    stream,
                    events,
                    expected_version=cmd.get("expected_version"),
                    idempotency_key=cmd.get("idempotency_key"),
                )
            except cf.WrongExpectedVersionError as exc:
                replies.append(
                    {"outcome": "conflict", "expected": exc.expected, "actual": exc.actual}
                )
            except Exception as exc:
                replies.append({"outcome": "error", "error": f"{type(exc).__name__}: {exc}"})
            else:
                span = [r.first_position, r.last_position]
                replies.append({"outcome": "ok", "span": span, "dedup": r.deduplicated})
        out(replies)


async def main():
    mode, url, stream, writer, number = sys.argv[1:6]
    async with cf.open_journal(url) as journal:
        out({"ready": writer})
        if mode == "kill-loop":
            await kill_loop(journal, stream, int(number))
        elif mode == "singles":
            await singles(journal, stream, writer, int(number))
        elif mode == "free-race":
            await free_race(journal, stream, writer, int(number))
        elif mode == "serve":
            await serve(journal, stream, writer)
        else:
            raise SystemExit(f"unknown mode {mode!r}")


asyncio.run(main())
'''


class Child:
    """One child process running ``_CHILD``; reads its JSON-line replies with a deadline."""

    def __init__(
        self, script: Path, log_dir: Path, mode: str, url: str, writer: str, number: int
    ) -> None:
        self.name = f"{mode}:{writer}"
        self.stderr_path = log_dir / f"child-{mode}-{writer}-{time.monotonic_ns()}.stderr"
        # stderr goes to a file: an unread pipe could fill and stall the child.
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), mode, url, STREAM, writer, str(number)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
            )
        self._buffer = b""

    def _stdout(self) -> IO[bytes]:
        assert self.proc.stdout is not None
        return self.proc.stdout

    def send(self, value: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(value).encode() + b"\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 60.0) -> Any:
        """The next JSON line; fails the test (with the child's stderr) on timeout or exit."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.fail(f"no reply within {timeout}s")
            ready, _, _ = select.select([self._stdout()], [], [], remaining)
            if ready:
                chunk = os.read(self._stdout().fileno(), 65536)
                if not chunk:
                    self.fail("exited before replying")
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def kill_and_drain(self) -> list[Any]:
        """SIGKILL the child, then return every complete line it had written before dying."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._buffer += self._stdout().read()
        # A line without its newline was cut by the kill: not a completed report.
        *lines, _partial = self._buffer.split(b"\n")
        self._buffer = b""
        return [json.loads(line) for line in lines]

    def finish(self, timeout: float = 30.0) -> None:
        """Close stdin and wait for a clean exit."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.fail("did not exit")
        if code != 0:
            self.fail(f"exited with {code}")

    def fail(self, why: str) -> NoReturn:
        err = self.stderr_path.read_text(errors="replace")[-4000:]
        pytest.fail(f"child {self.name} {why}; stderr:\n{err}", pytrace=False)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        # pg_dsn is requested dynamically, so the conftest hook cannot see it: mark by hand.
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def journal_url(request: pytest.FixtureRequest, sqlite_path: str) -> str:
    """The URL of a fresh journal on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{Path(sqlite_path).resolve()}"
    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn


Spawn = Callable[..., Child]


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """``spawn(mode, url, writer, number)`` starts a Child; all are SIGKILLed at teardown."""
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    children: list[Child] = []

    def start(mode: str, url: str, writer: str = "w", number: int = 0) -> Child:
        child = Child(script, tmp_path, mode, url, writer, number)
        children.append(child)
        return child

    yield start
    for child in children:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait(timeout=30)
        for pipe in (child.proc.stdin, child.proc.stdout):
            if pipe is not None:
                pipe.close()


def read_events(url: str) -> list[cf.StoredEvent]:
    """Every event of STREAM, read by a fresh journal in this process."""

    async def main() -> list[cf.StoredEvent]:
        async with cf.open_journal(url) as journal:
            return [e async for e in journal.read_all(STREAM, page_size=5000)]

    return asyncio.run(main())


def create_journal(url: str) -> None:
    """Open (and so create) the journal once, so a test about appends is not about set-up."""

    async def main() -> None:
        async with cf.open_journal(url) as journal:
            await journal.version(STREAM)

    asyncio.run(main())


def ready(*children: Child) -> None:
    for child in children:
        assert "ready" in child.reply(), child.name


def send_all(children: list[Child], value: Any, round_no: int) -> None:
    """Send to every child, alternating who hears first so neither is always ahead."""
    ordered = children if round_no % 2 == 0 else children[::-1]
    for child in ordered:
        child.send(value)


# -- kill -9 -------------------------------------------------------------------------------


def test_returned_appends_survive_kill_9(journal_url: str, spawn: Spawn) -> None:
    """Kill a writer mid-stream three times: every reported batch is there, whole and in order."""
    reported: list[list[int]] = []
    # Three kills, each a little later after the 20th report, to land at varied points of
    # the next append (before, inside, just after its commit).
    for kill_round, delay in enumerate((0.0, 0.003, 0.011)):
        first_batch = len(read_events(journal_url)) // 5
        child = spawn("kill-loop", journal_url, f"killed-{kill_round}", first_batch)
        ready(child)
        lines = [child.reply() for _ in range(20)]
        time.sleep(delay)
        lines += child.kill_and_drain()
        reported.extend(lines)

        events = read_events(journal_url)
        n = len(events)
        assert [e.position for e in events] == list(range(1, n + 1)), "gap or duplicate position"
        assert n % 5 == 0, f"a partial batch was stored: {n} events"
        for start in range(0, n, 5):
            batch = [e.payload for e in events[start : start + 5]]
            assert batch == [{"batch": start // 5, "index": i} for i in range(5)]
        for batch_no, first, last in reported:
            assert (first, last) == (5 * batch_no + 1, 5 * batch_no + 5)
            assert last <= n, f"batch {batch_no} was reported appended but is lost"
        # At most the one append in flight at the kill committed without being reported.
        assert n - reported[-1][2] in (0, 5)


# -- racing writers ------------------------------------------------------------------------


def test_two_processes_appending_leave_no_gap_or_duplicate(journal_url: str, spawn: Spawn) -> None:
    """200 single appends from each of two processes at once: positions 1..400, each in order."""
    create_journal(journal_url)
    children = [spawn("singles", journal_url, w, 200) for w in ("a", "b")]
    ready(*children)
    send_all(children, "go", 0)
    reported = {c.name.split(":")[1]: c.reply()["positions"] for c in children}
    for child in children:
        child.finish()

    events = read_events(journal_url)
    assert [e.position for e in events] == list(range(1, 401))
    assert sorted(reported["a"] + reported["b"]) == list(range(1, 401))
    for writer, positions in reported.items():
        assert positions == sorted(positions)
        assert [events[p - 1].payload for p in positions] == [
            {"writer": writer, "i": i} for i in range(200)
        ]


def test_expected_version_free_race(journal_url: str, spawn: Spawn) -> None:
    """Two processes loop read-version/append-expecting-it until 50: every version won once."""
    create_journal(journal_url)
    children = [spawn("free-race", journal_url, w, 50) for w in ("a", "b")]
    ready(*children)
    send_all(children, "go", 0)
    outcomes: dict[str, list[dict[str, Any]]] = {}
    for child in children:
        writer = child.name.split(":")[1]
        outcomes[writer] = []
        while "done" not in (reply := child.reply()):
            outcomes[writer].append(reply)
        child.finish()

    errors = [o for outs in outcomes.values() for o in outs if o["outcome"] == "error"]
    assert errors == [], "a conflict surfaced as another error type"
    wins = {w: [o["v"] for o in outs if o["outcome"] == "win"] for w, outs in outcomes.items()}
    assert sorted(wins["a"] + wins["b"]) == list(range(50)), "a version was won twice or never"
    for outs in outcomes.values():
        for o in outs:
            if o["outcome"] == "conflict":
                assert o["expected"] == o["v"] and o["actual"] > o["v"]
    events = read_events(journal_url)
    assert len(events) == 50 == len(wins["a"]) + len(wins["b"])
    for writer, vs in wins.items():
        for v in vs:
            assert events[v].payload == {"writer": writer, "v": v}


def test_expected_version_lockstep_rounds(journal_url: str, spawn: Spawn) -> None:
    """Both processes read the same version, then append expecting it at once: one wins."""
    create_journal(journal_url)
    children = [spawn("serve", journal_url, w) for w in ("a", "b")]
    ready(*children)
    for r in range(50):
        send_all(children, {"op": "version"}, r)
        assert [c.reply()["version"] for c in children] == [r, r]
        # The barrier: nobody appends until both have read version r.
        for child in children if r % 2 == 0 else children[::-1]:
            child.send(
                {
                    "op": "append",
                    "payloads": [{"writer": child.name, "r": r}],
                    "expected_version": r,
                }
            )
        (a,), (b,) = (c.reply() for c in children)
        outcomes = sorted([a["outcome"], b["outcome"]])
        assert outcomes == ["conflict", "ok"], f"round {r}: {a} {b}"
        loser = a if a["outcome"] == "conflict" else b
        assert (loser["expected"], loser["actual"]) == (r, r + 1)
    for child in children:
        child.finish()
    events = read_events(journal_url)
    assert [e.payload["r"] for e in events] == list(range(50))


def test_idempotent_append_raced_from_two_processes_is_stored_once(
    journal_url: str, spawn: Spawn
) -> None:
    """30 keys, each appended and retried by two processes at once: one write per key."""
    create_journal(journal_url)
    children = [spawn("serve", journal_url, w) for w in ("a", "b")]
    ready(*children)
    size = 3
    for k in range(30):
        payloads = [{"key": k, "part": p} for p in range(size)]
        # Each process sends the append, then retries it once: four calls per key.
        send_all(
            children,
            {"op": "append", "payloads": payloads, "idempotency_key": f"req-{k}", "times": 2},
            k,
        )
        replies = [r for c in children for r in c.reply()]
        assert all(r["outcome"] == "ok" for r in replies), replies
        spans = {tuple(r["span"]) for r in replies}
        assert spans == {(k * size + 1, (k + 1) * size)}, f"key {k}: {replies}"
        assert sum(not r["dedup"] for r in replies) == 1, f"key {k} written more than once"
    for child in children:
        child.finish()
    events = read_events(journal_url)
    assert len(events) == 30 * size
    assert [e.payload for e in events] == [
        {"key": k, "part": p} for k in range(30) for p in range(size)
    ]
    assert {e.meta.idempotency_key for e in events[:size]} == {"req-0"}


def test_processes_opening_a_fresh_journal_at_once(journal_url: str, spawn: Spawn) -> None:
    """Set-up (tables, WAL) raced by three processes on a journal nobody created yet."""
    children = [spawn("singles", journal_url, w, 5) for w in ("a", "b", "c")]
    ready(*children)
    send_all(children, "go", 0)
    for child in children:
        child.reply()
        child.finish()
    assert [e.position for e in read_events(journal_url)] == list(range(1, 16))


# -- damaged rows (SQLite) -----------------------------------------------------------------


class _Ping(cf.Event, type="test-faults.ping"):
    n: int


def test_corrupt_row_and_unregistered_type_read_sqlite(sqlite_path: str) -> None:
    url = f"sqlite:///{sqlite_path}"

    async def write() -> None:
        async with cf.open_journal(url) as journal:
            await journal.append(STREAM, [_Ping(n=n) for n in range(1, 5)])

    asyncio.run(write())
    with sqlite3.connect(sqlite_path) as db:
        db.execute("UPDATE cf_events SET data = x'7b7b7b' WHERE position = 2")
        db.execute("UPDATE cf_events SET type = 'test-faults.never-registered' WHERE position = 3")
    db.close()

    events = read_events(url)
    assert [e.position for e in events] == [1, 2, 3, 4]
    corrupt = events[1]
    assert corrupt.data == b"{{{"
    with pytest.raises(cf.CorruptEventError) as info:
        _ = corrupt.payload
    assert f"stream {STREAM!r} position 2" in str(info.value)
    assert (info.value.stream, info.value.position) == (STREAM, 2)
    with pytest.raises(cf.CorruptEventError):
        corrupt.decode()

    assert events[0].decode() == _Ping(n=1) and events[3].decode() == _Ping(n=4)
    raw = events[2]
    assert raw.type == "test-faults.never-registered" and raw.payload == {"n": 3}
    with pytest.raises(cf.UnknownEventTypeError, match="never-registered"):
        raw.decode()
    assert raw.decode(_Ping) == _Ping(n=3)
