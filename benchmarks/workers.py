"""The worker pool on PostgreSQL at a real model's latency, measured in one run.

Streams receive user messages over time (``_workers_users``): each one's first message
comes during the first ``--ramp`` seconds (new conversations race the workers for their
first claim), its next a think time after its previous answer (exponential, mean
``--think`` seconds).
Every message is answered by the agent of ``_workers_app``: a model call that asks for a
tool, the tool's run, a model call that answers, the model answering after a lognormal
delay (median 400 ms, p99 3 s, seeded: every configuration meets the same delays). A
turn is one model call. Two configurations at latency, each with a PostgreSQL server the
benchmark starts (``_workers_pg``), measured over a window after a warm-up:

- ``one``: one worker process, ``--streams`` streams, concurrency ``--streams``;
- ``two``: two worker processes, twice the streams, concurrency ``--streams`` each.

For each it prints turns per second against the ideal (the streams busy, a message
unanswered, on average, over the model's mean delay: what workers of zero cost would
make), the wait from a message landing to its first request going out (p50, p99), what
PostgreSQL did per turn (statements, of them appends and wake-ups, WAL flushes, and the
connections opened), the CPU per turn of the workers and of PostgreSQL, and per worker
process its resident memory, the most connections it had open, its event loop's lag and
its counts. Then the same CPU per turn as a bound: the turns per second the machine's cores
carry at most. The machine's load average is printed too: on a shared machine the other
work's CPU is in every number.

The memory a stream costs a worker once served (``idle``): one worker process serves
``--idle-streams`` streams three messages each, then as many more; the growth of its RSS
over the streams added (a slope: what any worker holds cancels out). The lease's cost
where nothing hides it (``instant``): one worker process with leases and one without
answer a message on each of ``--instant-streams`` streams from an instant model,
interleaved and repeated, medians compared.

RATIO lines: ``workers_1_vs_ideal`` (>= 0.9), ``workers_2_vs_1`` (>= 1.8),
``workers_trigger_to_request_p99_ms`` (<= 100, the worse of both configurations),
``workers_idle_stream_kb`` (<= ``IDLE_STREAM_KB``) and ``workers_leased_vs_unleased``
(>= 0.8). Usage::

    python benchmarks/workers.py [--streams N] [--think S] [--warm S] [--measure S]
                                 [--only latency|idle|instant] [--verbose]

``$CONTEXTFOLD_BENCH_PG_DSN`` names an existing database instead of a started server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from _workers_app import RESPONSE, SYSTEM_PROMPT, ChildConfig, message_text, run_child
from _workers_pg import Counters, Server, postgres_server, rss_of
from _workers_users import Conversation, Measured, converse, measure

import contextfold as cf

IDLE_STREAM_KB = 48
"""The bound on a worker's resident memory per stream it served and that now waits for
its next message, for this benchmark's streams (three messages, about 10 KB stored): its
two fold states in the journal's fold cache, about three times its stored bytes, and the
worker's record of it (see the README's scale-out section)."""
TARGETS = {
    "workers_1_vs_ideal": (">=", 0.9),
    "workers_2_vs_1": (">=", 1.8),
    "workers_trigger_to_request_p99_ms": ("<=", 100.0),
    "workers_idle_stream_kb": ("<=", float(IDLE_STREAM_KB)),
    "workers_leased_vs_unleased": (">=", 0.8),
}
SEED = 25
IDLE_MESSAGES = 3


@dataclass(frozen=True, slots=True)
class Outcome:
    """One configuration's run."""

    name: str
    processes: int
    streams: int
    measured: Measured
    calls: int
    """Model calls over the whole run (the costs below are per call)."""
    counters: Counters
    worker_cpu: float
    rss: tuple[tuple[int, int, int], ...]
    """Per worker process: resident bytes when ready, at the peak, idle at the end."""
    connections: tuple[int, ...]
    """Per worker process: the most connections it had open at once."""
    lags: tuple[tuple[float, float], ...]
    """Per worker process: its event loop's lag, p50 and p99 (seconds)."""
    stats: tuple[dict[str, int], ...]
    load: tuple[float, float]
    """The machine's load average (1 minute) when the window began and ended."""

    def per_turn(self, value: float) -> float:
        return value / self.calls if self.calls else float("nan")


class Workers:
    """The worker processes of one configuration."""

    def __init__(self, configs: list[ChildConfig]) -> None:
        script = os.path.abspath(__file__)
        self.names = [f"cf-worker-{n}" for n in range(len(configs))]
        self.children = [
            subprocess.Popen(
                [sys.executable, script, "--child", json.dumps(asdict(config))],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            for config in (
                replace(c, dsn=_named(c.dsn, name))
                for c, name in zip(configs, self.names, strict=True)
            )
        ]
        self.connections = [0] * len(configs)
        for child in self.children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        self.ready = [rss_of(child.pid) for child in self.children]
        self.peak = list(self.ready)

    def go(self) -> None:
        for child in self.children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()

    def sample(self, server: Server) -> list[int]:
        """Their resident memory now (the peaks and connections noted)."""
        now = [rss_of(child.pid) for child in self.children]
        self.peak = [max(p, n) for p, n in zip(self.peak, now, strict=True)]
        open_now = server.connections()
        self.connections = [
            max(most, open_now.get(name, 0))
            for most, name in zip(self.connections, self.names, strict=True)
        ]
        return now

    def stop(self) -> list[dict[str, Any]]:
        """SIGTERM each, and its report (a graceful stop: leases handed back)."""
        for child in self.children:
            child.terminate()
        reports = []
        for child in self.children:
            out, _ = child.communicate(timeout=120)
            reports.append(json.loads(out.strip().splitlines()[-1]))
        return reports

    def kill(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()
                child.wait()


def _named(dsn: str, name: str) -> str:
    """``dsn`` with its connections named ``name`` (as pg_stat_activity shows them)."""
    return f"{dsn}{'&' if '?' in dsn else '?'}application_name={name}"


def _quantiles(values: list[float]) -> tuple[float, float]:
    """p50 and p99 of ``values`` (NaN when empty)."""
    if len(values) < 2:
        return (float("nan"), float("nan"))
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[98]


def _load_average() -> float:
    return os.getloadavg()[0]


async def load(dsn: str, namespace: str, streams: list[str], first: bool) -> None:
    """The streams, each with its system prompt (and its first message when ``first``)."""
    async with cf.open_journal(dsn, namespace=namespace) as journal:
        for stream in streams:
            events: list[cf.Event] = [cf.system_prompt(SYSTEM_PROMPT)]
            if first:
                events.append(cf.ContextAdded(role="user", content=message_text(0, stream)))
            await journal.append(stream, events)


def drop(server: Server, namespace: str) -> None:
    for table in ("cf_events", "cf_streams", "cf_idempotency"):
        server.execute(f"DELETE FROM {table} WHERE namespace LIKE %s", (f"{namespace}%",))
    server.execute("VACUUM (ANALYZE) cf_events, cf_streams, cf_idempotency")


def at_latency(
    server: Server, name: str, processes: int, per_process: int, args: argparse.Namespace
) -> Outcome:
    namespace = f"bench-{secrets.token_hex(4)}"
    streams = [f"user/{n:05d}" for n in range(per_process * processes)]
    asyncio.run(load(server.dsn, namespace, streams, first=False))
    config = ChildConfig(
        server.dsn, namespace, per_process, True, True, SEED, args.pool, len(streams)
    )
    workers = Workers([config] * processes)
    try:
        server.reset_statements()
        before = server.counters()
        workers.go()
        start = time.time()
        begin, end = start + args.warm, start + args.warm + args.measure
        loads: list[float] = []

        async def run() -> Conversation:
            async def sampling() -> None:
                while True:
                    workers.sample(server)
                    if not loads and time.time() >= begin:
                        loads.append(_load_average())
                    await asyncio.sleep(1.0)

            sampler = asyncio.create_task(sampling())
            try:
                return await converse(
                    server.dsn,
                    namespace,
                    streams,
                    think=args.think,
                    ramp=args.ramp,
                    seed=SEED,
                    until=end,
                )
            finally:
                sampler.cancel()

        done = asyncio.run(run())
        loads.append(_load_average())
        time.sleep(1.5)  # the server's statistics catch up; the workers settle idle
        idle = workers.sample(server)
        after = server.counters()
        top = server.top_statements()
        reports = workers.stop()
    except BaseException:
        workers.kill()
        raise
    calls = [
        (str(s), int(k), int(step), float(t), float(d))
        for r in reports
        for s, k, step, t, d in r["calls"]
    ]
    outcome = Outcome(
        name=name,
        processes=processes,
        streams=len(streams),
        measured=measure(done, calls, begin, end),
        calls=len(calls),
        counters=after.minus(before),
        worker_cpu=sum(float(r["cpu"]) for r in reports),
        rss=tuple(zip(workers.ready, workers.peak, idle, strict=True)),
        connections=tuple(workers.connections),
        lags=tuple(_quantiles(r["lags"]) for r in reports),
        stats=tuple(r["stats"] for r in reports),
        load=(loads[0], loads[-1]),
    )
    report(outcome, top, args.verbose)
    drop(server, namespace)
    return outcome


def report(o: Outcome, top: list[tuple[int, str]], verbose: bool) -> None:
    m = o.measured
    mib = 1 << 20
    print(
        f"\n== {o.name}: {o.processes} worker process(es), {o.streams} streams, "
        f"{m.seconds:.0f} s measured (load average {o.load[0]:.1f} to {o.load[1]:.1f})"
    )
    print(
        f"  turns/s {m.rate:.1f}, ideal {m.ideal:.1f} ({m.busy:.1f} streams busy on average,"
        f" mean model delay {m.mean_delay * 1000:.0f} ms): {m.rate / m.ideal:.3f} of ideal"
    )
    print(
        f"  trigger to request: p50 {m.wait(0.5) * 1000:.1f} ms, p99 {m.wait(0.99) * 1000:.1f}"
        f" ms over {len(m.waits)} messages"
    )
    c = o.counters

    def each(value: int | None) -> str:
        return "n/a" if value is None else f"{o.per_turn(value):.2f}"

    print(
        f"  PostgreSQL per turn ({o.calls} model calls in the run): statements"
        f" {each(c.statements)} (appends {each(c.appends)}, wake-ups {each(c.wakeups)}),"
        f" WAL flushes {each(c.wal_syncs)}, connections opened {c.sessions}"
    )
    print(
        f"  CPU per turn: workers {o.per_turn(o.worker_cpu) * 1000:.2f} ms,"
        f" PostgreSQL {o.per_turn(c.cpu) * 1000:.2f} ms"
    )
    for n, (ready, peak, idle) in enumerate(o.rss):
        print(
            f"  worker {n}: RSS ready {ready / mib:.1f} MiB, peak {peak / mib:.1f} MiB, idle at"
            f" the end {idle / mib:.1f} MiB; at most {o.connections[n]} connections; event"
            f" loop lag p50 {o.lags[n][0] * 1000:.1f} ms, p99 {o.lags[n][1] * 1000:.1f} ms;"
            f" {o.stats[n]}"
        )
    if verbose:
        for calls, query in top:
            print(f"    {o.per_turn(calls):6.2f}/turn  {query[:200]}")


def instant(server: Server, lease: bool, streams: int, args: argparse.Namespace) -> float:
    """Messages answered per second by one worker process from an instant model, every
    stream with one message waiting when it starts."""
    namespace = f"bench-{secrets.token_hex(4)}"
    names = [f"instant/{n:05d}" for n in range(streams)]
    asyncio.run(load(server.dsn, namespace, names, first=True))
    config = ChildConfig(
        server.dsn, namespace, args.instant_concurrency, lease, False, SEED, 12, streams
    )
    workers = Workers([config])
    try:
        began = time.perf_counter()
        workers.go()
        while _responses(server, namespace) < 2 * streams:
            time.sleep(0.05)
        elapsed = time.perf_counter() - began
        workers.stop()
    except BaseException:
        workers.kill()
        raise
    drop(server, namespace)
    return streams / elapsed


def idle_memory(server: Server, args: argparse.Namespace) -> float:
    """KB of resident memory per idle stream a worker process served: the growth of its RSS
    from serving ``--idle-streams`` streams to serving twice as many (each three messages,
    from an instant model, at the same concurrency), over the streams added. A slope: what
    the process holds whatever it serves (code, pools, the high-water mark of the turns in
    flight) is in both and cancels out."""
    n: int = args.idle_streams
    namespace = f"bench-{secrets.token_hex(4)}"
    names = [f"idle/{i:05d}" for i in range(2 * n)]
    asyncio.run(load(server.dsn, namespace, names, first=False))
    config = ChildConfig(
        server.dsn, namespace, args.instant_concurrency, True, False, SEED, 12, len(names)
    )
    workers = Workers([config])
    answers = 0
    try:
        workers.go()
        rss: list[int] = []
        for half in (names[:n], names[n:]):
            for k in range(IDLE_MESSAGES):
                asyncio.run(_send(server.dsn, namespace, half, k))
                answers += 2 * len(half)
                while _responses(server, namespace) < answers:
                    time.sleep(0.05)
            time.sleep(1.0)  # the last hand-backs land
            rss.append(workers.sample(server)[0])
        workers.stop()
    except BaseException:
        workers.kill()
        raise
    [(stored,)] = server.execute(
        "SELECT sum(octet_length(data)) FROM cf_events WHERE namespace = %s", (namespace,)
    )
    drop(server, namespace)
    per_stream = float(rss[1] - rss[0]) / n / 1024
    print(
        f"\n== idle streams: one worker process served {n}, then {2 * n} streams ({IDLE_MESSAGES}"
        f" messages each, {int(stored) / len(names) / 1024:.1f} KB stored per stream): RSS"
        f" {rss[0] / (1 << 20):.1f} MiB, then {rss[1] / (1 << 20):.1f} MiB: {per_stream:.1f} KB"
        " per idle stream"
    )
    return per_stream


async def _send(dsn: str, namespace: str, streams: list[str], k: int) -> None:
    async with cf.open_journal(dsn, namespace=namespace) as journal:
        for stream in streams:
            await journal.append(
                stream, cf.ContextAdded(role="user", content=message_text(k, stream))
            )


def _responses(server: Server, namespace: str) -> int:
    [(count,)] = server.execute(
        "SELECT count(*) FROM cf_events WHERE namespace = %s AND type = %s", (namespace, RESPONSE)
    )
    return int(count)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=500, help="streams per process")
    parser.add_argument("--think", type=float, default=30.0, help="mean think time (s)")
    parser.add_argument(
        "--ramp", type=float, default=60.0, help="seconds over which the first messages come"
    )
    parser.add_argument("--warm", type=float, default=75.0, help="seconds before measuring")
    parser.add_argument("--measure", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--pool", type=int, default=16, help="connections per worker")
    parser.add_argument("--instant-streams", type=int, default=300)
    parser.add_argument("--instant-concurrency", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3, help="of the instant part")
    parser.add_argument("--idle-streams", type=int, default=500)
    parser.add_argument("--only", choices=("latency", "idle", "instant"))
    parser.add_argument("--verbose", action="store_true", help="the top statements too")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        run_child(args.child)
        return 0
    ratios: dict[str, float] = {}
    with postgres_server() as server:
        asyncio.run(load(server.dsn, "bench-schema", ["s"], first=False))  # before any race
        drop(server, "bench-schema")
        if args.only in (None, "latency"):
            one = at_latency(server, "one", 1, args.streams, args)
            two = at_latency(server, "two", 2, args.streams, args)
            cpu_bound(one)
            ratios["workers_1_vs_ideal"] = one.measured.rate / one.measured.ideal
            ratios["workers_2_vs_1"] = two.measured.rate / one.measured.rate
            ratios["workers_trigger_to_request_p99_ms"] = 1000 * max(
                o.measured.wait(0.99) for o in (one, two)
            )
        if args.only in (None, "idle"):
            ratios["workers_idle_stream_kb"] = idle_memory(server, args)
        if args.only in (None, "instant"):
            rates: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(args.repeats):
                for lease in (True, False):
                    rates[lease].append(instant(server, lease, args.instant_streams, args))
            leased, unleased = (statistics.median(rates[k]) for k in (True, False))
            print(
                f"\n== instant model, one process, {args.instant_streams} streams: leased"
                f" {leased:.1f} messages/s, unleased {unleased:.1f} (medians)"
            )
            ratios["workers_leased_vs_unleased"] = leased / unleased
    print()
    held = True
    for name, value in ratios.items():
        op, target = TARGETS[name]
        print(f"RATIO {name} {value:.2f} target {op} {target:g}")
        held &= value >= target if op == ">=" else value <= target
    return 0 if held else 1


def cpu_bound(one: Outcome) -> None:
    """The turns per second this machine's cores carry at most at the CPU per turn the
    ``one`` configuration measured (workers and PostgreSQL), and what the ideal asks."""
    per_turn = one.per_turn(one.worker_cpu + one.counters.cpu)
    cores = os.cpu_count() or 1
    print(
        f"\n  CPU per turn (workers + PostgreSQL) {per_turn * 1000:.2f} ms: {cores} cores carry"
        f" at most {cores / per_turn:.0f} turns/s, one worker process (one core) at most"
        f" {1 / one.per_turn(one.worker_cpu):.0f}"
    )


if __name__ == "__main__":
    sys.exit(main())
