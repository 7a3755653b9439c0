"""The read commands open an SQLite journal its user cannot write read-only: a file it
cannot write (chmod; as a user other than root, whom chmod does not stop), read through a
``-shm`` beside it so a writer's appends are seen, and a read-only mount, read as
immutable (which cannot be followed). They answer as on writable media and change no
journal."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import select
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import contextfold as cf
from contextfold.store._sqlite_files import read_only_open

_STREAM = "chat"


def _journal(folder: Path) -> tuple[Path, int]:
    """A journal with one recorded request, closed cleanly (no -wal or -shm left)."""
    path = folder / "journal.db"

    async def run() -> int:
        async with cf.open_journal(f"sqlite:///{path}") as journal:
            await journal.append(_STREAM, cf.system_prompt("Be brief."))
            await journal.append(_STREAM, cf.ContextAdded(role="user", content="hello?"))
            agent = cf.Agent(journal, _STREAM, cf.FunctionModel(lambda request: "hi"))
            return (await agent.run_until_idle()).requests[0]

    return path, asyncio.run(run())


def _files(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def _read_commands(path: Path, offset: int, prefix: list[str], cwd: Path) -> None:
    url = f"sqlite:///{path}"
    for command in (
        ["streams"],
        ["events", _STREAM],
        ["rebuild", _STREAM, str(offset)],
        ["verify", _STREAM],
    ):
        done = _contextfold(prefix, [*command, "--url", url], cwd)
        assert done.returncode == 0, (command, done.stderr)
        assert done.stdout, command
        if command == ["streams"]:
            assert done.stdout.startswith(f"{_STREAM}\t")


def _as_other_user() -> list[str]:
    """The prefix running a command as a user chmod stops: this one, unless it is root."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("the tests run as root, whom chmod does not stop, and setpriv is missing")
    prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run(
        [*prefix, sys.executable, "-c", "import contextfold"], capture_output=True, check=False
    )
    if probe.returncode != 0:
        pytest.skip(f"another user cannot run this Python: {probe.stderr.decode()[-200:]}")
    return prefix


@contextlib.contextmanager
def _shared_folder() -> Iterator[Path]:
    """A temporary folder another user can reach (pytest's own are private)."""
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        folder.chmod(0o755)
        try:
            yield folder
        finally:
            for path in (folder, *folder.rglob("*")):
                path.chmod(stat.S_IRWXU)


@contextlib.contextmanager
def _shared_journal(file_mode: int, folder_mode: int) -> Iterator[tuple[Path, Path, int]]:
    """A journal in a folder of the shared one, with those modes: the shared folder, the
    journal's path and the offset of its request."""
    with _shared_folder() as shared:
        folder = shared / "journal"
        folder.mkdir()
        path, offset = _journal(folder)
        path.chmod(file_mode)
        folder.chmod(folder_mode)
        yield shared, path, offset


def test_read_commands_read_a_journal_its_user_cannot_write() -> None:
    # In a folder it may write: read as mode=ro, through a -shm it creates beside the file.
    prefix = _as_other_user()
    with _shared_journal(0o444, 0o777) as (shared, path, offset):
        before = path.read_bytes()
        _read_commands(path, offset, prefix, shared)
        assert path.read_bytes() == before


def test_a_journal_in_a_folder_its_user_cannot_write_is_refused_saying_why() -> None:
    # Not immutable: the file may change underneath (SQLite then answers wrongly), and a
    # WAL database is read through a -shm that cannot be created there.
    prefix = _as_other_user()
    if not prefix:
        pytest.skip("needs a user chmod stops")
    with _shared_journal(0o444, 0o555) as (shared, path, _):
        folder = path.parent
        done = _contextfold(prefix, ["events", _STREAM, "--url", f"sqlite:///{path}"], shared)
        assert done.returncode != 0
        assert "-shm" in done.stderr and "read-only media" in done.stderr, done.stderr
        assert sorted(_files(folder)) == ["journal.db"]


def test_a_reader_that_cannot_write_the_journal_follows_a_writer() -> None:
    prefix = _as_other_user()
    with _shared_journal(0o644, 0o777) as (shared, path, _):
        url = f"sqlite:///{path}"
        follow = ["events", _STREAM, "--follow", "--url", url]
        follower = subprocess.Popen(
            [*prefix, sys.executable, "-m", "contextfold", *follow],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "HOME": str(shared)},
            cwd=shared,
        )
        try:
            assert follower.stdout is not None
            first = follower.stdout.readline()
            assert first, follower.stderr.read() if follower.stderr else ""

            async def append() -> None:
                async with cf.open_journal(url) as journal:
                    await journal.append(_STREAM, cf.RawEvent("note", {"text": "later"}))

            asyncio.run(append())
            deadline = time.monotonic() + 30
            seen: list[str] = []
            while time.monotonic() < deadline and not any("later" in s for s in seen):
                ready, _, _ = select.select([follower.stdout], [], [], 1)
                if ready:
                    seen.append(follower.stdout.readline())
            assert any("later" in line for line in seen), seen
        finally:
            follower.kill()
            follower.communicate()


def test_the_open_decision_reads_immutable_only_on_read_only_media() -> None:
    assert read_only_open(writable=True, read_only_media=False, wal=False) == "rw"
    assert read_only_open(writable=False, read_only_media=False, wal=False) == "ro"
    assert read_only_open(writable=False, read_only_media=False, wal=True) == "ro"
    assert read_only_open(writable=False, read_only_media=True, wal=True) == "ro"
    assert read_only_open(writable=False, read_only_media=True, wal=False) == "immutable"


def _contextfold(prefix: list[str], args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "contextfold", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(cwd)},
        cwd=cwd,
        check=False,
    )


def test_read_commands_read_a_journal_on_a_read_only_mount(tmp_path: Path) -> None:
    source, mounted = tmp_path / "source", tmp_path / "read-only"
    source.mkdir()
    mounted.mkdir()
    path, offset = _journal(source)
    bound = subprocess.run(["mount", "--bind", str(source), str(mounted)], capture_output=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot mount here: {bound.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", str(mounted)], check=True)
        with pytest.raises(OSError):
            (mounted / "probe").touch()  # read-only even for root
        before = _files(source)
        _read_commands(mounted / path.name, offset, [], tmp_path)
        assert _files(source) == before
        url = f"sqlite:///{mounted / path.name}"
        follow = _contextfold([], ["events", _STREAM, "--follow", "--url", url], tmp_path)
        assert follow.returncode != 0 and "cannot follow" in follow.stderr, follow.stderr
    finally:
        subprocess.run(["umount", "-l", str(mounted)], check=False)
