"""The PostgreSQL side of ``benchmarks/workers.py``: the server it starts, and what the
server did meanwhile (statements, commits, WAL flushes, CPU of its processes).

The server is a throwaway one (``tests/pgserver.py``) restarted once with
``pg_stat_statements`` loaded, so statements are counted by the server itself;
``$CONTEXTFOLD_BENCH_PG_DSN`` names an existing database instead (statements are then
counted only if that server has the extension).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DRIVER", "Counters", "Server", "postgres_server", "rss_of"]

REPO = Path(__file__).resolve().parent.parent
DRIVER = "/* workers-bench */"
"""Marks the benchmark's own statements (its polls and counters): never counted."""


@dataclass(frozen=True, slots=True)
class Counters:
    """What the server did so far for the workload (the benchmark's own statements left
    out): statements run, of them appends and wake-ups (NOTIFY), None each without
    pg_stat_statements; WAL flushes; connections opened; CPU seconds of its processes (0
    where /proc does not show them)."""

    statements: int | None
    appends: int | None
    wakeups: int | None
    wal_syncs: int
    sessions: int
    cpu: float

    def minus(self, before: Counters) -> Counters:
        def less(now: int | None, then: int | None) -> int | None:
            return None if now is None or then is None else now - then

        return Counters(
            less(self.statements, before.statements),
            less(self.appends, before.appends),
            less(self.wakeups, before.wakeups),
            self.wal_syncs - before.wal_syncs,
            self.sessions - before.sessions,
            self.cpu - before.cpu,
        )


class Server:
    """The database the benchmark runs on, and its counters."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.dsn = dsn
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.postmaster = _postmaster_of(self.conn)
        try:
            self.conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            self.conn.execute("SELECT count(*) FROM pg_stat_statements").fetchone()
            self.statements = True
        except psycopg.Error:
            self.statements = False

    def close(self) -> None:
        self.conn.close()

    def counters(self) -> Counters:
        """The counters now (connections and WAL flushes reach the server's statistics
        within a second: read them after a quiet second for exact deltas)."""
        statements = appends = wakeups = None
        if self.statements:
            [(statements, appends, wakeups)] = self.execute(
                "SELECT coalesce(sum(calls), 0),"
                " coalesce(sum(calls) FILTER (WHERE query LIKE '%%INSERT INTO cf_events%%'), 0),"
                " coalesce(sum(calls) FILTER (WHERE query LIKE '%%pg_notify%%'), 0)"
                " FROM pg_stat_statements WHERE query NOT LIKE %s"
                " AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
                (f"%{DRIVER}%",),
            )
        [(sessions,)] = self.execute(
            "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
        )
        [(syncs,)] = self.execute("SELECT wal_sync FROM pg_stat_wal")
        return Counters(
            None if statements is None else int(statements),
            None if appends is None else int(appends),
            None if wakeups is None else int(wakeups),
            int(syncs),
            int(sessions),
            _postgres_cpu(self.postmaster),
        )

    def connections(self) -> dict[str, int]:
        """The connections open now, by application name."""
        rows = self.execute(
            "SELECT application_name, count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() GROUP BY 1"
        )
        return {str(name): int(count) for name, count in rows}

    def top_statements(self, limit: int = 8) -> list[tuple[int, str]]:
        """The statements run most often since the last reset: calls and text."""
        if not self.statements:
            return []
        rows = self.conn.execute(
            f"SELECT {DRIVER} calls, query FROM pg_stat_statements WHERE query NOT LIKE %s"
            " AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " ORDER BY calls DESC LIMIT %s",
            (f"%{DRIVER}%", limit),
        ).fetchall()
        return [(int(calls), " ".join(str(query).split())) for calls, query in rows]

    def reset_statements(self) -> None:
        if self.statements:
            self.execute("SELECT pg_stat_statements_reset()")

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """One of the benchmark's own statements (marked, so never counted)."""
        verb, _, rest = sql.partition(" ")  # after the verb: a leading comment is not kept
        cur = self.conn.execute(f"{verb} {DRIVER} {rest}", args)
        return cur.fetchall() if cur.description else []


@contextmanager
def postgres_server() -> Iterator[Server]:
    """``$CONTEXTFOLD_BENCH_PG_DSN``, or a throwaway server with ``pg_stat_statements``."""
    external = os.environ.get("CONTEXTFOLD_BENCH_PG_DSN")
    if external:
        server = Server(external)
        try:
            yield server
        finally:
            server.close()
        return
    sys.path.insert(0, str(REPO))
    import psycopg

    from tests.pgserver import TemporaryPostgres

    with TemporaryPostgres() as pg:
        with psycopg.connect(pg.admin_dsn, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
            conn.execute("ALTER SYSTEM SET max_connections = 400")
        pg.restart()
        server = Server(pg.dsn)
        try:
            yield server
        finally:
            server.close()


def _stat(pid: int | str) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _postmaster_of(conn: Any) -> int | None:
    """The process id of the server's postmaster, when it runs on this machine: the parent
    of this connection's backend (None when /proc does not show it)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    fields = _stat(row[0]) if row else None
    return int(fields[1]) if fields else None


def _postgres_cpu(postmaster: int | None) -> float:
    """CPU seconds used so far by the server's processes: the postmaster, its children, and
    the children it has reaped (0 where /proc cannot tell). Other servers on the machine
    (other test runs) are left out."""
    own = _stat(postmaster) if postmaster is not None else None
    if own is None:
        return 0.0
    total = sum(int(tick) for tick in own[11:15])  # utime, stime, cutime, cstime
    for entry in Path("/proc").glob("[0-9]*"):
        fields = _stat(entry.name)
        if fields is not None and fields[1] == str(postmaster):
            total += int(fields[11]) + int(fields[12])  # in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def rss_of(pid: int) -> int:
    """The resident memory of a process, in bytes (0 when /proc does not show it)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0
