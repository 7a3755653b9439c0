"""The read commands open an SQLite journal on read-only media read-only: a file and folder
its user cannot write (chmod; as a user other than root, whom chmod does not stop), and a
read-only mount. They answer as on writable media and create or change no file."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import contextfold as cf

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
        done = subprocess.run(
            [*prefix, sys.executable, "-m", "contextfold", *command, "--url", url],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "HOME": str(cwd)},
            cwd=cwd,
            check=False,
        )
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


def test_read_commands_read_a_journal_its_user_cannot_write() -> None:
    prefix = _as_other_user()
    with _shared_folder() as shared:
        folder = shared / "journal"
        folder.mkdir()
        path, offset = _journal(folder)
        assert sorted(_files(folder)) == ["journal.db"]
        path.chmod(0o444)
        folder.chmod(0o555)
        before = _files(folder)
        _read_commands(path, offset, prefix, shared)
        assert _files(folder) == before


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
    finally:
        subprocess.run(["umount", "-l", str(mounted)], check=False)
