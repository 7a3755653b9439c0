"""Whether a SQLite database's path still names the files its connection opened.

A connection keeps the files it opened (the database, its ``-wal`` and ``-shm``) even when
their path is moved, deleted or replaced; :class:`OpenedFiles` notes them just after the
connect and tells when the path names others. Checking each file costs one ``stat``. A
directory's modification and change times move whenever an entry of it is created,
removed or renamed, so once a full check passed with the directory's times settled (older
than any filesystem's timestamp granularity), a check that finds the same directory with
the same times stats nothing else: no entry of it can have changed since. A mount over
one of the files changes no entry and is not seen then; only root can mount, and root can
as well rewrite the open files themselves, which no path check sees either.
"""

from __future__ import annotations

import os
import pathlib
import stat
import time
from typing import Literal

__all__ = ["OpenedFiles", "ReadOnlyOpen", "read_only_open", "read_only_uri"]

_COMPANIONS = ("-wal", "-shm")  # WAL mode keeps both open as long as any connection is
# Coarser than every filesystem's timestamp granularity (FAT: 2 s) plus the lag of the
# kernel's coarse clock: a change after a check gets times unequal to ones this old.
SETTLED_NS = 3_000_000_000


class OpenedFiles:
    """The files a connection opened, as ``(path, (st_dev, st_ino))``, and the directory
    that holds all of them as entries (None when one is a symlink, or for no files)."""

    __slots__ = ("_seen", "_settles", "files", "folder")

    def __init__(
        self, files: tuple[tuple[str, tuple[int, int]], ...] = (), folder: str | None = None
    ) -> None:
        self.files = files
        self.folder = folder
        # (st_dev, st_ino, st_mtime_ns, st_ctime_ns) of the folder, taken before a full
        # check that found nothing moved; kept only when those times were settled.
        self._seen: tuple[int, int, int, int] | None = None
        self._settles = 0  # time.time_ns() before which the folder's times are not settled

    @classmethod
    def identify(cls, path: str) -> OpenedFiles:
        """The files ``path`` names now (none for ``""`` and ``":memory:"``). Call it just
        after connecting: a replace racing the connect itself goes unseen."""
        if path in ("", ":memory:"):
            return cls()
        # Absolute, as SQLite resolved it when opening: a later chdir moves no file.
        path = os.path.abspath(path)
        info = os.stat(path)
        found = [(path, (info.st_dev, info.st_ino))]
        for name in (path + suffix for suffix in _COMPANIONS):
            try:
                info = os.stat(name)
            except FileNotFoundError:
                continue  # not in WAL mode (WAL refused by the filesystem): nothing to watch
            found.append((name, (info.st_dev, info.st_ino)))
        # Through a symlink the files live in another directory than the path's own.
        linked = any(stat.S_ISLNK(os.lstat(name).st_mode) for name, _ in found)
        return cls(tuple(found), None if linked else os.path.dirname(path))

    def moved(self) -> str | None:
        """What the path names now in place of an opened file, or None when nothing moved.
        One ``stat`` of the directory while it is unchanged and settled, else one per file
        (and the directory's once its times may have settled)."""
        folder = self.folder
        if folder is None or time.time_ns() < self._settles:
            return self._moved_file()
        try:
            info = os.stat(folder)
        except OSError:
            self._seen = None
            return self._moved_file()
        now = (info.st_dev, info.st_ino, info.st_mtime_ns, info.st_ctime_ns)
        if now == self._seen:
            return None
        moved = self._moved_file()  # after the directory's stat: a change between shows
        newest = max(info.st_mtime_ns, info.st_ctime_ns)
        if moved is None and time.time_ns() - newest > SETTLED_NS:
            self._seen = now
        else:
            self._seen = None
            self._settles = newest + SETTLED_NS  # no use looking at the directory before
        return moved

    def _moved_file(self) -> str | None:
        for name, opened in self.files:
            try:
                info = os.stat(name)
            except OSError:
                return f"{name} is gone"
            if (info.st_dev, info.st_ino) != opened:
                return f"{name} is another file"
        return None


ReadOnlyOpen = Literal["rw", "ro", "immutable"]
"""How a read-only open reads the file: see :func:`read_only_open`."""


def read_only_open(*, writable: bool, read_only_media: bool, wal: bool) -> ReadOnlyOpen:
    """How to open a database for reading only, from what this process may do beside it.

    ``rw`` where it may write the file and its folder (with ``query_only`` on the
    connection), since a ``mode=ro`` connection cannot remove the ``-wal`` and ``-shm`` it
    creates. ``immutable`` only on read-only media with no ``-wal`` (no writer has it
    open): a WAL database cannot be read there without a ``-shm`` it cannot get, and
    nothing can change it underneath. Else ``ro``, which reads a writer's WAL through the
    ``-shm`` beside it: a file this user may not write can still change, and SQLite gives
    wrong answers when an ``immutable`` file changes."""
    if writable:
        return "rw"
    if read_only_media and not wal:
        return "immutable"
    return "ro"


def read_only_uri(path: str) -> tuple[str, ReadOnlyOpen]:
    """The URI opening the database at ``path`` for reading only, never creating a file,
    and how it opens it (see :func:`read_only_open`)."""
    absolute = os.path.abspath(path)
    folder = os.path.dirname(absolute)
    how = read_only_open(
        writable=os.access(absolute, os.W_OK) and os.access(folder, os.W_OK),
        read_only_media=bool(os.statvfs(folder).f_flag & os.ST_RDONLY),
        wal=os.path.exists(absolute + "-wal"),
    )
    uri = pathlib.Path(absolute).as_uri()
    query = {"rw": "mode=rw", "ro": "mode=ro", "immutable": "mode=ro&immutable=1"}[how]
    return f"{uri}?{query}", how
