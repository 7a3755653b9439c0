"""The test PostgreSQL infrastructure works against a real server."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.pgserver import (
    EXTERNAL_DSN_ENV,
    PG_BIN_ENV,
    PostgresNotFoundError,
    TemporaryPostgres,
    dsn_with_dbname,
    find_pg_bin,
)

psycopg = pytest.importorskip("psycopg")


def test_select_one_in_fresh_database(pg_dsn: str) -> None:
    assert pg_dsn.startswith("postgresql://")
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
        (dbname,) = conn.execute("select current_database()").fetchone()
        assert dbname.startswith("cf_")
        (tables,) = conn.execute(
            "select count(*) from pg_tables where schemaname = 'public'"
        ).fetchone()
        assert tables == 0


def test_listen_notify_between_two_connections(pg_dsn: str) -> None:
    received: list[tuple[str, str]] = []
    with (
        psycopg.connect(pg_dsn, autocommit=True) as listener,
        psycopg.connect(pg_dsn, autocommit=True) as sender,
    ):
        listener.add_notify_handler(lambda n: received.append((n.channel, n.payload)))
        listener.execute("LISTEN cf_events")
        sender.execute("SELECT pg_notify('cf_events', 'hello')")
        deadline = time.monotonic() + 10
        while not received and time.monotonic() < deadline:
            listener.execute("SELECT 1")  # notifications are delivered with query results
            time.sleep(0.01)
    assert received == [("cf_events", "hello")]


def test_session_server_has_test_database(pg_server: TemporaryPostgres) -> None:
    if pg_server.external:
        pytest.skip(f"using external server from {EXTERNAL_DSN_ENV}")
    assert pg_server.dsn == f"postgresql://postgres@127.0.0.1:{pg_server.port}/contextfold_test"
    assert pg_server.url == pg_server.dsn
    with psycopg.connect(pg_server.dsn) as conn:
        assert conn.execute("select current_database()").fetchone() == ("contextfold_test",)
        (max_conn,) = conn.execute("show max_connections").fetchone()
        assert max_conn == "200"


def test_lifecycle_stops_server_and_removes_directory(
    pg_server: TemporaryPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    # pg_server only gates on availability (skip locally / fail in CI); this starts its own.
    monkeypatch.delenv(EXTERNAL_DSN_ENV, raising=False)
    try:
        find_pg_bin()
    except PostgresNotFoundError as exc:
        pytest.skip(str(exc))
    with TemporaryPostgres() as pg:
        base = pg.base_dir
        assert base is not None
        pid = int((pg.data_dir / "postmaster.pid").read_text().splitlines()[0])
        with psycopg.connect(pg.dsn) as conn:
            assert conn.execute("select 1").fetchone() == (1,)
    assert not base.exists()
    deadline = time.monotonic() + 10
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(pid)


def _running(pid: int) -> bool:
    """True unless ``pid`` is gone or a zombie (its reaper is PID 1, not us)."""
    if not Path("/proc/self").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def test_finds_debian_binaries_without_path(monkeypatch: pytest.MonkeyPatch) -> None:
    if not list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
        pytest.skip("no /usr/lib/postgresql/<ver>/bin on this machine")
    monkeypatch.delenv(PG_BIN_ENV, raising=False)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    if (Path("/usr/bin/pg_ctl")).exists():
        pytest.skip("pg_ctl is on the stripped PATH")
    assert find_pg_bin().parent.parent == Path("/usr/lib/postgresql")


def test_bin_override_without_binaries_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(PG_BIN_ENV, str(tmp_path))
    with pytest.raises(PostgresNotFoundError, match=PG_BIN_ENV):
        find_pg_bin()


def test_dsn_with_dbname() -> None:
    assert (
        dsn_with_dbname("postgresql://u:p@h:5433/old?sslmode=disable", "cf_1")
        == "postgresql://u:p@h:5433/cf_1?sslmode=disable"
    )
    assert (
        dsn_with_dbname("host=/tmp/s port=5 user=me dbname=x", "cf_2")
        == "postgresql://me@%2Ftmp%2Fs:5/cf_2"
    )
