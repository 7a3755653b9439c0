"""Worker throughput on PostgreSQL, measured in one run: turns per second of the worker pool.

Each run loads ``--streams`` agent streams (a system prompt and one user message each) into
a fresh namespace, starts the worker processes, and measures the time from the moment they
are all ready until every stream is answered by an instant model (a turn: claim the
stream, record and send the request, record the answer, hand the lease back). The
configurations, interleaved and repeated (``--repeats``), medians compared:

- ``leased_1``: one worker process, leases on (what ``contextfold worker`` runs);
- ``leased_2``: two worker processes on the same namespace, leases on;
- ``unleased_1``: one worker process with the lease off (``Worker(lease=False)``).

Each worker is warm before the clock starts (its pool connected, one turn of its own
served), and the tables are vacuumed between runs. With the rates it prints the CPU per
turn of the workers and of the server's PostgreSQL processes (when it runs on this
machine; other servers are left out): one worker bound by its own CPU leaves the
database the other core, so on 2 cores two workers reach at most ``2 * w / (w + p)`` times
one, a bound it prints too.

It prints ``RATIO workers_2_vs_1`` (target >= 1.6 on a 2-core machine) and
``RATIO workers_leased_vs_unleased`` (target >= 0.8). Usage::

    python benchmarks/workers.py [--streams N] [--repeats N] [--concurrency K]

PostgreSQL: ``$CONTEXTFOLD_BENCH_PG_DSN`` names an existing database, otherwise a throwaway
server is started with ``tests/pgserver.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import contextfold as cf

REPO = Path(__file__).resolve().parent.parent
TARGETS = {"workers_2_vs_1": 1.6, "workers_leased_vs_unleased": 0.8}
RESPONSE = "contextfold.agent/llm-response"


def build(journal: cf.Journal, stream: str) -> cf.Agent:
    """The app of every worker: an agent answering at once."""
    return cf.Agent(journal, stream, cf.FunctionModel(lambda request: "ok"))


async def child(dsn: str, namespace: str, lease: bool, concurrency: int) -> None:
    """A worker process: ready once warm (its pool connected, one turn of its own served),
    serving from "go" on stdin until SIGTERM (or stdin closes)."""
    import signal

    size = concurrency + 4
    async with cf.open_journal(dsn, namespace=namespace, min_size=size, max_size=size) as journal:
        await warm_up(journal.with_namespace(f"{namespace}-warm-{os.getpid()}"), lease)
        worker = cf.Worker(journal, build, concurrency=concurrency, lease=lease)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, worker.stop)
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        began = time.process_time()
        await worker.run()
        print(f"cpu {time.process_time() - began}", flush=True)


async def warm_up(journal: cf.Journal, lease: bool) -> None:
    """One turn served in a namespace of the process's own, before the clock starts: a
    long-running worker has its imports, caches and prepared statements warm."""
    await journal.append(
        "warm", [cf.system_prompt("You answer."), cf.ContextAdded(role="user", content="hi")]
    )
    worker = cf.Worker(journal, build, lease=lease, poll_interval=0.01)
    task = asyncio.create_task(worker.run())
    while not await journal.latest("warm", [RESPONSE]):
        await asyncio.sleep(0.01)
    worker.stop()
    await task
    await journal.delete_stream("warm")


@contextmanager
def postgres_dsn() -> Iterator[str]:
    """``$CONTEXTFOLD_BENCH_PG_DSN``, or a fresh database on a throwaway server."""
    external = os.environ.get("CONTEXTFOLD_BENCH_PG_DSN")
    if external:
        yield external
        return
    sys.path.insert(0, str(REPO))
    from tests.pgserver import TemporaryPostgres

    with TemporaryPostgres() as server:
        yield server.dsn


async def load(dsn: str, namespace: str, streams: int) -> None:
    async with cf.open_journal(dsn, namespace=namespace) as journal:
        for n in range(streams):
            stream = f"bench/{n:05d}"
            await journal.append(
                stream,
                [
                    cf.system_prompt("You answer."),
                    cf.ContextAdded(role="user", content=f"question {n}"),
                ],
            )


def answers(conn: Any, namespace: str) -> int:
    """How many answers the namespace holds (one connection for every poll: a connection
    per poll would cost the server a process each)."""
    row = conn.execute(
        "SELECT count(*) FROM cf_events WHERE namespace = %s AND type = %s",
        (namespace, RESPONSE),
    ).fetchone()
    return int(row[0]) if row else 0


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def postmaster_of(conn: Any) -> int | None:
    """The process id of the server's postmaster, when it runs on this machine: the parent
    of this connection's backend (None when /proc does not show it)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    fields = _stat(row[0]) if row else None
    return int(fields[1]) if fields else None


def postgres_cpu(postmaster: int | None) -> float:
    """CPU seconds used so far by the server's processes: the postmaster, its children, and
    the children it has reaped (0 where /proc cannot tell: the split below then shows the
    workers only). Other servers on the machine (other test runs) are left out."""
    own = _stat(postmaster) if postmaster is not None else None
    if own is None:
        return 0.0
    total = sum(int(tick) for tick in own[11:15])  # utime, stime, cutime, cstime
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(entry.name)
        if fields is not None and fields[1] == str(postmaster):
            total += int(fields[11]) + int(fields[12])  # in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def run_once(
    dsn: str, processes: int, lease: bool, streams: int, concurrency: int
) -> tuple[float, float, float]:
    """Turns per second of ``processes`` workers answering ``streams`` fresh streams, and
    the CPU seconds per turn of the workers and of PostgreSQL meanwhile."""
    import psycopg

    namespace = f"bench-{secrets.token_hex(4)}"
    asyncio.run(load(dsn, namespace, streams))
    command = [sys.executable, __file__, "--child", dsn, namespace, str(lease), str(concurrency)]
    children = [
        subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    try:
        for worker in children:
            assert worker.stdout is not None and worker.stdout.readline().strip() == "ready"
        with psycopg.connect(dsn, autocommit=True) as conn:
            postmaster = postmaster_of(conn)
            database = postgres_cpu(postmaster)
            began = time.perf_counter()
            for worker in children:
                assert worker.stdin is not None
                worker.stdin.write("go\n")
                worker.stdin.flush()
            while answers(conn, namespace) < streams:
                time.sleep(0.05)
            elapsed = time.perf_counter() - began
            database = postgres_cpu(postmaster) - database
    finally:
        for worker in children:
            worker.terminate()
        for worker in children:
            worker.wait(60)
    # A worker's CPU runs until its SIGTERM: a little past the last answer.
    used = sum(float(w.stdout.read().split()[-1]) for w in children if w.stdout is not None)
    asyncio.run(drop(dsn, namespace))
    with psycopg.connect(dsn, autocommit=True) as conn:  # no autovacuum in the next run
        conn.execute("VACUUM (ANALYZE) cf_events, cf_streams, cf_idempotency")
    return streams / elapsed, used / streams, database / streams


async def drop(dsn: str, namespace: str) -> None:
    async with cf.open_journal(dsn, namespace=namespace) as journal:
        for info in await journal.list_streams():
            await journal.delete_stream(info.stream)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=400)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        dsn, namespace, lease, concurrency = args.child
        asyncio.run(child(dsn, namespace, lease == "True", int(concurrency)))
        return 0
    configs = {"leased_1": (1, True), "leased_2": (2, True), "unleased_1": (1, False)}
    rates: dict[str, list[float]] = {name: [] for name in configs}
    cpu: dict[str, list[tuple[float, float]]] = {name: [] for name in configs}
    with postgres_dsn() as dsn:
        asyncio.run(load(dsn, "bench-warmup", 1))  # the schema, before processes race for it
        asyncio.run(drop(dsn, "bench-warmup"))
        for _ in range(args.repeats):
            for name, (processes, lease) in configs.items():
                rate, workers, database = run_once(
                    dsn, processes, lease, args.streams, args.concurrency
                )
                rates[name].append(rate)
                cpu[name].append((workers, database))
                print(f"  {name:<11} {rate:8.1f} turns/s", flush=True)
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\n== workers: {args.streams} streams, concurrency {args.concurrency} per process")
    for name, value in median.items():
        workers = statistics.median(w for w, _ in cpu[name]) * 1000
        database = statistics.median(d for _, d in cpu[name]) * 1000
        print(
            f"  {name:<11} median {value:8.1f} turns/s; CPU per turn: workers {workers:.2f} ms,"
            f" PostgreSQL {database:.2f} ms"
        )
    # One worker bound by its own CPU (w per turn) leaves PostgreSQL (p) the other cores;
    # two workers share the cores with it: at most cores * w / (w + p) times one.
    w, p = (statistics.median(x[k] for x in cpu["leased_1"]) for k in (0, 1))
    cores = min(2, os.cpu_count() or 1)
    print(f"  two workers can reach at most {cores * w / (w + p):.2f}x one on {cores} cores")
    ratios = {
        "workers_2_vs_1": median["leased_2"] / median["leased_1"],
        "workers_leased_vs_unleased": median["leased_1"] / median["unleased_1"],
    }
    print()
    for name, ratio in ratios.items():
        print(f"RATIO {name} {ratio:.2f} target >= {TARGETS[name]}")
    return 0 if all(ratios[n] >= TARGETS[n] for n in ratios) else 1


if __name__ == "__main__":
    sys.exit(main())
