"""Worker throughput on PostgreSQL, measured in one run: turns per second of the worker pool.

Each run loads ``--streams`` agent streams (a system prompt and one user message each) into
a fresh namespace, starts the worker processes, and measures the time from the moment they
are all ready until every stream is answered by an instant model (a turn: claim the
stream, record and send the request, record the answer, hand the lease back). The
configurations, interleaved and repeated (``--repeats``), medians compared:

- ``leased_1``: one worker process, leases on (what ``contextfold worker`` runs);
- ``leased_2``: two worker processes on the same namespace, leases on;
- ``unleased_1``: one worker process with the lease off (``Worker(lease=False)``).

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
        await worker.run()


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


def run_once(dsn: str, processes: int, lease: bool, streams: int, concurrency: int) -> float:
    """Turns per second of ``processes`` workers answering ``streams`` fresh streams."""
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
            began = time.perf_counter()
            for worker in children:
                assert worker.stdin is not None
                worker.stdin.write("go\n")
                worker.stdin.flush()
            while answers(conn, namespace) < streams:
                time.sleep(0.05)
            elapsed = time.perf_counter() - began
    finally:
        for worker in children:
            worker.terminate()
        for worker in children:
            worker.wait(60)
    asyncio.run(drop(dsn, namespace))
    return streams / elapsed


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
    with postgres_dsn() as dsn:
        asyncio.run(load(dsn, "bench-warmup", 1))  # the schema, before processes race for it
        asyncio.run(drop(dsn, "bench-warmup"))
        for _ in range(args.repeats):
            for name, (processes, lease) in configs.items():
                rate = run_once(dsn, processes, lease, args.streams, args.concurrency)
                rates[name].append(rate)
                print(f"  {name:<11} {rate:8.1f} turns/s", flush=True)
    median = {name: statistics.median(values) for name, values in rates.items()}
    print(f"\n== workers: {args.streams} streams, concurrency {args.concurrency} per process")
    for name, value in median.items():
        print(f"  {name:<11} median {value:8.1f} turns/s")
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
