"""The journal's overhead over its raw driver, measured in one run.

For each backend the library and the bare driver (``sqlite3`` / ``psycopg``) do the same work
on equivalent tables with the same durability settings (SQLite: WAL, synchronous=NORMAL;
PostgreSQL: the same server), interleaved and repeated, and the median times are compared:

- ``single_append``: single-event appends, one transaction each;
- ``batch_append``: 100-event batch appends, one transaction each;
- ``full_read``: reading a whole 100,000-event stream (library: ``read`` pages of 10,000;
  raw: one ``SELECT`` ordered by position, ``fetchall``, a tuple per row).

The raw appends do what a hand-written store needs to produce the same rows: encode the payload
with orjson, make an event id and a time, lock/read the stream version, insert, bump the
version, commit. Each uses the best plain-driver shape, the store's own: on SQLite an append
of up to 16 events is one ``INSERT`` whose rowid is its last row's (no ``last_insert_rowid()``
round trip); on PostgreSQL one autocommit statement, one multi-row ``INSERT ... SELECT FROM
unnest``. So the ratio is the library's own overhead, not a difference of SQL strategy.
Ratio = library time / raw time. Usage::

    python benchmarks/journal.py [--backend sqlite|postgres|all] [--repeats N] [--profile]

PostgreSQL: ``$CONTEXTFOLD_BENCH_PG_DSN`` names an existing database, otherwise a throwaway
server is started with ``tests/pgserver.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import secrets
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import orjson

import contextfold as cf

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "bench"
EVENT_TYPE = "bench.message"
TARGETS = {"single_append": 1.5, "batch_append": 1.5, "full_read": 1.5}


@dataclass(frozen=True)
class Sizes:
    """How much work one timed run does, and how many timed runs there are."""

    singles: int = 2_000
    batches: int = 200
    batch_size: int = 100
    read_events: int = 100_000
    read_page: int = 10_000
    repeats: int = 5


def payload(i: int) -> dict[str, Any]:
    """A small chat-like payload (about 120 bytes of JSON)."""
    return {"role": "user", "n": i, "text": f"message {i}: the quick brown fox jumps over the dog"}


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _events(payloads: list[dict[str, Any]]) -> list[cf.RawEvent]:
    return [cf.RawEvent(EVENT_TYPE, p) for p in payloads]


# -- raw drivers ---------------------------------------------------------------------------


class Raw(Protocol):
    """The bare-driver side: one transaction per append, no contextfold code."""

    def append(self, stream: str, payloads: list[dict[str, Any]]) -> int: ...
    def read(self, stream: str) -> int: ...
    def close(self) -> None: ...


_SQLITE_RAW_SCHEMA = """
CREATE TABLE IF NOT EXISTS raw_events (
    global_position INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace TEXT NOT NULL, stream TEXT NOT NULL, position INTEGER NOT NULL,
    type TEXT NOT NULL, data BLOB NOT NULL, event_id TEXT NOT NULL, time TEXT NOT NULL,
    run_id TEXT, actor TEXT, idempotency_key TEXT, channels TEXT NOT NULL DEFAULT '',
    UNIQUE (namespace, stream, position)
);
CREATE INDEX IF NOT EXISTS raw_events_by_type ON raw_events (namespace, stream, type, position);
CREATE TABLE IF NOT EXISTS raw_streams (
    namespace TEXT NOT NULL, stream TEXT NOT NULL, version INTEGER NOT NULL,
    PRIMARY KEY (namespace, stream)
) WITHOUT ROWID;
"""
_COLUMNS = (
    "global_position, position, type, data, event_id, time, run_id, actor,"
    " idempotency_key, channels"
)


class RawSQLite:
    """sqlite3 on its own file with the library's table shape and pragmas."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None)
        self.conn.execute("PRAGMA busy_timeout = 30000")
        self.conn.execute("PRAGMA journal_mode = WAL")
        self.conn.execute("PRAGMA synchronous = NORMAL")
        self.conn.executescript(_SQLITE_RAW_SCHEMA)

    def append(self, stream: str, payloads: list[dict[str, Any]]) -> int:
        conn, now = self.conn, _now()
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(
            "SELECT version FROM raw_streams WHERE namespace = ? AND stream = ?",
            (NAMESPACE, stream),
        ).fetchone()
        version = row[0] if row else 0
        rows = [
            (
                NAMESPACE,
                stream,
                version + i,
                EVENT_TYPE,
                orjson.dumps(p),
                uuid.uuid4().hex,
                now,
                None,
                None,
                None,
                "main",
            )
            for i, p in enumerate(payloads, start=1)
        ]
        insert = (
            "INSERT INTO raw_events (namespace, stream, position, type, data, event_id, time,"
            " run_id, actor, idempotency_key, channels) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
        )
        last_global: int | None
        if len(rows) == 1:  # one statement: its rowid is the last row's (the store's shape)
            last_global = conn.execute(insert, rows[0]).lastrowid
        elif len(rows) <= 16:
            values = [value for row in rows for value in row]
            more = ", (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)" * (len(rows) - 1)
            last_global = conn.execute(insert + more, values).lastrowid
        else:
            conn.executemany(insert, rows)
            last_global = conn.execute("SELECT last_insert_rowid()").fetchone()[0]
        conn.execute(
            "INSERT INTO raw_streams VALUES (?, ?, ?)"
            " ON CONFLICT (namespace, stream) DO UPDATE SET version = excluded.version",
            (NAMESPACE, stream, version + len(payloads)),
        )
        conn.execute("COMMIT")
        assert last_global is not None
        return last_global

    def read(self, stream: str) -> int:
        rows = self.conn.execute(
            f"SELECT {_COLUMNS} FROM raw_events WHERE namespace = ? AND stream = ?"
            " ORDER BY position",
            (NAMESPACE, stream),
        ).fetchall()
        events = [(NAMESPACE, stream, *row) for row in rows]
        return len(events)

    def close(self) -> None:
        self.conn.close()


class RawPostgres:
    """psycopg (sync) on tables shaped like the library's; one autocommit statement per append."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.psycopg = psycopg
        self.suffix = secrets.token_hex(4)
        self.events = f"raw_events_{self.suffix}"
        self.streams = f"raw_streams_{self.suffix}"
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.conn.execute(
            f"""
            CREATE TABLE {self.events} (
                global_position BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                namespace TEXT COLLATE "C" NOT NULL, stream TEXT COLLATE "C" NOT NULL,
                position BIGINT NOT NULL, type TEXT NOT NULL, data BYTEA NOT NULL,
                event_id TEXT NOT NULL, time TEXT NOT NULL, run_id TEXT, actor TEXT,
                idempotency_key TEXT, channels TEXT[] NOT NULL,
                UNIQUE (namespace, stream, position)
            );
            CREATE INDEX ON {self.events} (namespace, stream, type, position);
            CREATE TABLE {self.streams} (
                namespace TEXT COLLATE "C" NOT NULL, stream TEXT COLLATE "C" NOT NULL,
                version BIGINT NOT NULL, PRIMARY KEY (namespace, stream)
            );
            """
        )
        # One statement (the driver's best shape, as the store's own append): the stream row
        # is locked and bumped in the first CTE, which numbers the inserted events.
        self._append = f"""
            WITH cur AS (
                INSERT INTO {self.streams} AS t VALUES (%(ns)s, %(s)s, %(n)s)
                ON CONFLICT (namespace, stream) DO UPDATE SET version = t.version + %(n)s
                RETURNING version - %(n)s AS v
            ), ins AS (
                INSERT INTO {self.events} (namespace, stream, position, type, data, event_id,
                                           time, run_id, actor, idempotency_key, channels)
                SELECT %(ns)s, %(s)s, cur.v + u.n, u.type, u.data, u.id, u.time, u.run,
                       u.actor, u.key, string_to_array(u.chan, chr(31))
                FROM cur, unnest(%(types)s::text[], %(data)b::bytea[], %(ids)s::text[],
                                 %(times)s::text[], %(runs)s::text[], %(actors)s::text[],
                                 %(keys)s::text[], %(chans)s::text[])
                     WITH ORDINALITY AS u(type, data, id, time, run, actor, key, chan, n)
                ORDER BY u.n
                RETURNING global_position
            )
            SELECT max(global_position) FROM ins
            """

    def append(self, stream: str, payloads: list[dict[str, Any]]) -> int:
        conn, now, n = self.conn, _now(), len(payloads)
        args = {
            "ns": NAMESPACE,
            "s": stream,
            "n": n,
            "types": [EVENT_TYPE] * n,
            "data": [orjson.dumps(p) for p in payloads],
            "ids": [uuid.uuid4().hex for _ in payloads],
            "times": [now] * n,
            "runs": [None] * n,
            "actors": [None] * n,
            "keys": [None] * n,
            "chans": ["main"] * n,
        }
        got = conn.execute(self._append, args).fetchone()
        assert got is not None
        return int(got[0])

    def read(self, stream: str) -> int:
        cur = self.conn.cursor(binary=True)
        cur.execute(
            f"SELECT {_COLUMNS} FROM {self.events} WHERE namespace = %s AND stream = %s"
            " ORDER BY position",
            (NAMESPACE, stream),
        )
        events = [(NAMESPACE, stream, *row) for row in cur.fetchall()]
        return len(events)

    def close(self) -> None:
        self.conn.execute(f"DROP TABLE {self.events}, {self.streams}")
        self.conn.close()


# -- measuring -----------------------------------------------------------------------------


@dataclass
class Result:
    """The timed runs (seconds) of one measure, library and raw side."""

    name: str
    unit: str
    count: int
    lib: list[float]
    raw: list[float]
    profile: cProfile.Profile | None = None

    @property
    def ratio(self) -> float:
        return statistics.median(self.lib) / statistics.median(self.raw)


class Bench:
    """Runs the three measures of one backend, library and raw interleaved."""

    def __init__(self, journal: cf.Journal, raw: Raw, sizes: Sizes, profile: bool) -> None:
        self.journal = journal
        self.raw = raw
        self.sizes = sizes
        self.profile = profile
        self._streams = 0

    def stream(self, kind: str) -> str:
        self._streams += 1
        return f"{kind}-{self._streams}"

    async def pair(
        self,
        name: str,
        unit: str,
        count: int,
        lib: Callable[[str, int], Awaitable[Any]],
        raw: Callable[[str, int], Any],
        *,
        stream: str | None = None,
        warmup: int = 1,
    ) -> Result:
        """Warm up with ``warmup`` operations, then time lib and raw alternately ``repeats`` times.

        Each timed run gets a fresh stream unless ``stream`` names the one to use.
        """
        result = Result(name, unit, count, [], [])
        profiler = cProfile.Profile() if self.profile else None
        for attempt in range(self.sizes.repeats + 1):  # attempt 0 is the warm-up
            ops = count if attempt else warmup
            for side in ("lib", "raw") if attempt % 2 else ("raw", "lib"):
                target = stream or self.stream(f"{name}-{side}")
                if side == "raw":
                    start = time.perf_counter()
                    raw(target, ops)
                else:
                    if profiler is not None and attempt:
                        profiler.enable()
                    start = time.perf_counter()
                    await lib(target, ops)
                elapsed = time.perf_counter() - start
                if profiler is not None:
                    profiler.disable()
                if attempt:
                    (result.lib if side == "lib" else result.raw).append(elapsed)
        result.profile = profiler
        return result

    async def run(self) -> list[Result]:
        s = self.sizes
        # Both sides get their input ready-made: payload dicts for raw, RawEvents for the library.
        one = [payload(0)]
        batch = [payload(i) for i in range(s.batch_size)]
        lib_one, lib_batch = _events(one), _events(batch)

        async def lib_appends(stream: str, ops: int, events: list[cf.RawEvent]) -> None:
            for _ in range(ops):
                await self.journal.append(stream, events)

        def raw_appends(stream: str, ops: int, payloads: list[dict[str, Any]]) -> None:
            for _ in range(ops):
                self.raw.append(stream, payloads)

        results = [
            await self.pair(
                "single_append",
                "append",
                s.singles,
                lambda stream, ops: lib_appends(stream, ops, lib_one),
                lambda stream, ops: raw_appends(stream, ops, one),
                warmup=max(1, s.singles // 10),
            ),
            await self.pair(
                "batch_append",
                "event",
                s.batches * s.batch_size,
                lambda stream, ops: lib_appends(stream, ops // s.batch_size, lib_batch),
                lambda stream, ops: raw_appends(stream, ops // s.batch_size, batch),
                warmup=s.batches * s.batch_size // 10,
            ),
        ]

        # One big stream per side, written untimed in the largest batches the library takes.
        big = [payload(i) for i in range(s.read_events)]
        chunk = 10_000
        for start in range(0, s.read_events, chunk):
            await self.journal.append("big", _events(big[start : start + chunk]))
            self.raw.append("big", big[start : start + chunk])

        async def lib_read(stream: str, ops: int) -> None:
            count, cursor = 0, None
            while True:
                page = await self.journal.read(stream, after=cursor, limit=s.read_page)
                count += len(page.events)
                cursor = page.cursor
                if not page.more:
                    break
            assert count == s.read_events

        def raw_read(stream: str, ops: int) -> None:
            assert self.raw.read(stream) == s.read_events

        results.append(
            await self.pair("full_read", "event", s.read_events, lib_read, raw_read, stream="big")
        )
        return results


def report(backend: str, results: list[Result]) -> None:
    print(f"\n== {backend}: median of {len(results[0].lib)} runs (library vs raw driver)")
    for r in results:
        lib, raw = statistics.median(r.lib), statistics.median(r.raw)
        print(
            f"{r.name:14} {r.count:>7} {r.unit}s  library {lib * 1000:9.1f} ms "
            f"({lib / r.count * 1e6:7.1f} us/{r.unit})  raw {raw * 1000:9.1f} ms "
            f"({raw / r.count * 1e6:7.1f} us/{r.unit})  ratio {r.ratio:.2f}"
        )
    for r in results:
        if r.profile is not None:
            # cProfile sees this thread only: the SQLite store's statements run on its
            # worker thread and show up here as time waiting in the event loop.
            print(f"\n-- {backend} {r.name}: profile of the library side, by own time")
            pstats.Stats(r.profile, stream=sys.stdout).sort_stats("tottime").print_stats(20)


# -- backends ------------------------------------------------------------------------------


async def bench_sqlite(sizes: Sizes, profile: bool) -> list[Result]:
    with tempfile.TemporaryDirectory(prefix="cf-bench-") as tmp:
        journal = cf.open_journal(f"sqlite:///{tmp}/journal.db", namespace=NAMESPACE)
        raw = RawSQLite(Path(tmp) / "raw.db")
        try:
            return await Bench(journal, raw, sizes, profile).run()
        finally:
            raw.close()
            await journal.close()


class NoPostgresError(Exception):
    """Neither ``$CONTEXTFOLD_BENCH_PG_DSN`` nor a local PostgreSQL (or psycopg) is available."""


@contextmanager
def postgres_dsn() -> Iterator[str]:
    """``$CONTEXTFOLD_BENCH_PG_DSN``, or a fresh database on a throwaway server."""
    external = os.environ.get("CONTEXTFOLD_BENCH_PG_DSN")
    if external:
        yield external
        return
    sys.path.insert(0, str(REPO))
    try:
        import psycopg  # noqa: F401

        from tests.pgserver import PostgresNotFoundError, TemporaryPostgres
    except ImportError as exc:
        raise NoPostgresError(str(exc)) from exc
    server = TemporaryPostgres()
    try:
        server.start()
    except PostgresNotFoundError as exc:
        raise NoPostgresError(str(exc)) from exc
    with server:
        yield server.dsn


async def bench_postgres(dsn: str, sizes: Sizes, profile: bool) -> list[Result]:
    # A namespace of its own, so an external database's other data is left alone.
    namespace = f"{NAMESPACE}-{secrets.token_hex(4)}"
    journal = cf.open_journal(dsn, namespace=namespace)
    raw = RawPostgres(dsn)
    try:
        return await Bench(journal, raw, sizes, profile).run()
    finally:
        for info in await journal.list_streams():
            await journal.delete_stream(info.stream)
        raw.close()
        await journal.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("sqlite", "postgres", "all"), default="all")
    parser.add_argument("--repeats", type=int, default=Sizes.repeats)
    parser.add_argument(
        "--singles", type=int, help="single appends per run (default 2000; 1000 on PostgreSQL)"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the library side")
    args = parser.parse_args()

    ratios: list[tuple[str, float]] = []
    if args.backend in ("sqlite", "all"):
        sizes = Sizes(repeats=args.repeats, singles=args.singles or Sizes.singles)
        results = asyncio.run(bench_sqlite(sizes, args.profile))
        report("sqlite", results)
        ratios += [(f"sqlite_{r.name}", r.ratio) for r in results]
    if args.backend in ("postgres", "all"):
        # Each PostgreSQL commit waits for a WAL flush (milliseconds on most disks): fewer
        # single appends keep the run short without changing what is compared.
        sizes = Sizes(repeats=args.repeats, singles=args.singles or 1_000)
        try:
            with postgres_dsn() as dsn:
                results = asyncio.run(bench_postgres(dsn, sizes, args.profile))
        except NoPostgresError as exc:
            if args.backend == "postgres":
                raise
            print(f"\n== postgres: skipped ({exc})")
        else:
            report("postgres", results)
            ratios += [(f"postgres_{r.name}", r.ratio) for r in results]

    print()
    for name, ratio in ratios:
        target = TARGETS[name.split("_", 1)[1]]
        print(f"RATIO {name} {ratio:.2f} target <= {target}")


if __name__ == "__main__":
    main()
