"""The moved-file check (OpenedFiles): one stat of the directory while it is settled and
unchanged, and still every move, deletion and replacement seen."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.errors import StoreFileMovedError
from contextfold.journal import Journal
from contextfold.store import _sqlite_files
from contextfold.store._sqlite_files import OpenedFiles
from contextfold.store.sqlite import SQLiteStore
from tests.store.helpers import until
from tests.store.test_sqlite_moved import MOVES

# Small enough for a test to wait on; coarser than this machine's timestamp granularity.
_SETTLED_NS = 20_000_000


def raw(i: int) -> cf.RawEvent:
    return cf.RawEvent("note", {"i": i})


def _settled(folder: Path) -> bool:
    info = os.stat(folder)
    return time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) > _SETTLED_NS


def _wait_settled(folder: Path) -> None:
    while not _settled(folder):  # a condition on the clock, not a fixed sleep
        time.sleep(0.001)


@contextmanager
def _stats(under: Path) -> Iterator[list[str]]:
    """The paths under ``under`` that ``os.stat`` is asked for while the block runs."""
    seen: list[str] = []
    real = os.stat

    def counting(path: object, *args: object, **kwargs: object) -> os.stat_result:
        if str(path).startswith(str(under)):
            seen.append(str(path))
        return real(path, *args, **kwargs)  # type: ignore[arg-type]

    with mock.patch.object(os, "stat", counting):
        yield seen


@pytest.mark.parametrize("how", sorted(MOVES))
async def test_a_settled_directory_costs_one_stat_and_every_move_is_still_refused(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_sqlite_files, "SETTLED_NS", _SETTLED_NS)
    path = tmp_path / "journal.db"
    journal = Journal(SQLiteStore(path))
    try:
        await journal.append("s", raw(1))
        await until(lambda: _settled(tmp_path))
        await journal.append("s", raw(2))  # a full check, which notes the settled directory
        with _stats(tmp_path) as seen:
            await journal.append("s", raw(3))
        assert seen == [str(tmp_path)]
        MOVES[how](path)
        with pytest.raises(StoreFileMovedError, match="moved or deleted while open"):
            await journal.append("s", raw(4))
        assert [e.payload["i"] for e in (await journal.read("s")).events] == [1, 2, 3]
    finally:
        await journal.close()


def _files(folder: Path) -> tuple[Path, ...]:
    db = folder / "journal.db"
    return (db, Path(f"{db}-wal"), Path(f"{db}-shm"))


def test_a_directory_not_yet_settled_costs_one_stat_per_file() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name in _files(Path(tmp)):
            name.write_bytes(b"")
        opened = OpenedFiles.identify(str(_files(Path(tmp))[0]))
        assert opened.moved() is None  # looks at the directory: just changed, not settled
        with _stats(Path(tmp)) as seen:
            assert opened.moved() is None
        assert seen == [str(name) for name in _files(Path(tmp))]


def test_through_a_symlink_every_file_is_checked(tmp_path: Path) -> None:
    target = tmp_path / "real.db"
    target.write_bytes(b"")
    link = tmp_path / "journal.db"
    link.symlink_to(target)
    opened = OpenedFiles.identify(str(link))
    assert opened.folder is None
    assert opened.moved() is None
    target.rename(tmp_path / "elsewhere.db")
    assert opened.moved() == f"{link} is gone"


def _rename_away(folder: Path, i: int) -> None:
    name = _files(folder)[i]
    if name.exists():
        name.rename(f"{name}.away")


def _rename_back(folder: Path, i: int) -> None:
    name = _files(folder)[i]
    if Path(f"{name}.away").exists():
        os.replace(f"{name}.away", name)


def _replace(folder: Path, i: int) -> None:
    fresh = folder / "fresh"
    fresh.write_bytes(b"other")
    os.replace(fresh, _files(folder)[i])


def _unrelated(folder: Path, i: int) -> None:
    (folder / f"other-{i}").write_bytes(b"")


def _write_inside(folder: Path, i: int) -> None:
    name = _files(folder)[i]
    if name.exists():
        with name.open("ab") as file:
            file.write(b"x")


def _move_folder(folder: Path, i: int) -> None:
    aside = folder.with_name(folder.name + ".aside")
    if not aside.exists():
        folder.rename(aside)
        folder.mkdir()


def _folder_back(folder: Path, i: int) -> None:
    aside = folder.with_name(folder.name + ".aside")
    if aside.exists():
        for entry in folder.iterdir():
            entry.unlink()
        folder.rmdir()
        aside.rename(folder)


def _settle(folder: Path, i: int) -> None:
    _wait_settled(folder)


OPS: dict[str, Callable[[Path, int], None]] = {
    "rename-away": _rename_away,
    "rename-back": _rename_back,
    "replace": _replace,
    "unrelated-file": _unrelated,
    "write-inside": _write_inside,
    "move-folder": _move_folder,
    "folder-back": _folder_back,
    "settle": _settle,
}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(OPS)), st.integers(0, 2)), max_size=10))
def test_the_check_agrees_with_a_stat_of_every_file(ops: list[tuple[str, int]]) -> None:
    """Whatever happens to the directory and its files, settled or not, the check reports
    a move exactly when some path no longer names the file it named when opened."""
    with (
        tempfile.TemporaryDirectory() as tmp,
        mock.patch.object(_sqlite_files, "SETTLED_NS", _SETTLED_NS),
    ):
        folder = Path(tmp) / "journal"
        folder.mkdir()
        for name in _files(folder):
            name.write_bytes(b"")
        opened = OpenedFiles.identify(str(_files(folder)[0]))
        identities = [(os.stat(n).st_dev, os.stat(n).st_ino) for n in _files(folder)]
        _wait_settled(folder)
        assert opened.moved() is None
        for op, i in ops:
            OPS[op](folder, i)
            same = all(
                n.exists() and (os.stat(n).st_dev, os.stat(n).st_ino) == identity
                for n, identity in zip(_files(folder), identities, strict=True)
            )
            assert (opened.moved() is None) == same, (op, i)
