"""Storage that refuses writes, for real: a full disk (a small tmpfs) and a file-size quota
(``RLIMIT_FSIZE`` on a ``contextfold serve`` process, which ignores ``SIGXFSZ`` as every
Python process does). Each refused append is a documented 507 with a clear body and one log
line, never a 500 or a traceback; what was acknowledged is all there, and appends work
again once there is room."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import contextfold as cf
from contextfold.server import create_app
from tests.server.helpers import running
from tests.server.test_cli import Served

_TEXT = "z" * 100_000


def _append(client: httpx.Client, i: int) -> httpx.Response:
    body = {"events": [{"type": "note", "payload": {"i": i, "text": _TEXT}}]}
    return client.post("/v1/streams/s/events", json=body)


def _refused(response: httpx.Response) -> str:
    """The message of a 507 append, checked for its shape."""
    assert response.status_code == 507, response.text
    error = response.json()["error"]
    assert error["type"] == "StorageFullError"
    assert "nothing was written" in error["message"], error
    return str(error["message"])


def test_a_file_size_quota_is_a_507_and_nothing_acknowledged_is_lost(tmp_path: Path) -> None:
    served = Served(tmp_path, {})
    acknowledged: list[int] = []
    refused = 0
    try:
        served.wait_ready()
        assert _append(served.client, 0).status_code == 201
        acknowledged.append(0)
        quota = max(served.db.stat().st_size, 1 << 20)
        _, hard = resource.prlimit(served.child.pid, resource.RLIMIT_FSIZE)
        resource.prlimit(served.child.pid, resource.RLIMIT_FSIZE, (quota, hard))
        for i in range(1, 100):
            response = _append(served.client, i)
            if response.status_code == 201:
                acknowledged.append(i)
                continue
            message = _refused(response)
            assert "size quota" in message and "served.db" in message
            refused += 1
            if refused == 3:
                break
        assert refused == 3, "the quota never refused an append"
        # Reads go on while writes are refused.
        page = served.client.get("/v1/streams/s/events", params={"limit": 1000}).json()
        assert [e["payload"]["i"] for e in page["events"]] == acknowledged
        resource.prlimit(served.child.pid, resource.RLIMIT_FSIZE, (hard, hard))
        assert _append(served.client, 100).status_code == 201
        acknowledged.append(100)
        served.interrupt()
    finally:
        output = served.close()
    assert "Traceback" not in output, output
    failures = [line for line in output.splitlines() if "cannot grow" in line]
    assert len(failures) == refused, output  # one line per refused request
    assert all("POST /v1/streams/s/events failed" in line for line in failures), failures

    async def read_back() -> list[int]:
        async with cf.open_journal(f"sqlite:///{served.db}") as journal:
            return [e.payload["i"] for e in (await journal.read("s")).events]

    assert asyncio.run(read_back()) == acknowledged


@contextlib.contextmanager
def _small_disk(folder: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``folder``; skips where mounting is not allowed."""
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small disk here: {mounted.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


async def test_a_full_disk_is_a_507_with_one_log_line_and_nothing_is_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with _small_disk(tmp_path / "disk", "4m") as disk:
        url = f"sqlite:///{disk / 'journal.db'}"
        acknowledged: list[int] = []
        async with cf.open_journal(url) as journal, running(create_app(journal)) as srv:
            client = srv.client
            body = {"events": [{"type": "note", "payload": {"i": 0, "text": _TEXT}}]}
            assert (await client.post("/v1/streams/s/events", json=body)).status_code == 201
            acknowledged.append(0)
            filler = disk / "filler"
            free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
            filler.write_bytes(b"\0" * max(free - 600_000, 0))
            caplog.set_level(logging.INFO, logger="contextfold")
            refused = 0
            for i in range(1, 100):
                body = {"events": [{"type": "note", "payload": {"i": i, "text": _TEXT}}]}
                response = await client.post("/v1/streams/s/events", json=body)
                if response.status_code == 201:
                    acknowledged.append(i)
                    continue
                assert response.status_code == 507, response.text
                error = response.json()["error"]
                assert error["type"] == "StorageFullError", error
                assert "disk is full" in error["message"], error
                refused += 1
                if refused == 3:
                    break
            assert refused == 3, "the disk never filled up"
            logged = [r for r in caplog.records if r.name.startswith("contextfold")]
            assert len(logged) == refused, [r.getMessage() for r in logged]
            assert all(r.exc_info is None and "cannot grow" in r.getMessage() for r in logged)
            page = (await client.get("/v1/streams/s/events", params={"limit": 1000})).json()
            assert [e["payload"]["i"] for e in page["events"]] == acknowledged
            filler.unlink()  # room again: the next append is taken
            body = {"events": [{"type": "note", "payload": {"i": 100, "text": "after"}}]}
            assert (await client.post("/v1/streams/s/events", json=body)).status_code == 201
            acknowledged.append(100)
        async with cf.open_journal(url) as reopened:
            assert [e.payload["i"] for e in (await reopened.read("s")).events] == acknowledged


def test_postgres_out_of_disk_space_is_storage_full() -> None:
    psycopg = pytest.importorskip("psycopg")
    from contextfold.store._postgres_errors import driver_error

    full = psycopg.errors.DiskFull("could not extend file: No space left on device")
    error = driver_error(full, "postgresql://db.example/journal", "appending to stream 's'")
    assert isinstance(error, cf.StorageFullError)
    assert "out of disk space while appending to stream 's'" in str(error)
    assert "nothing was written" in str(error)
