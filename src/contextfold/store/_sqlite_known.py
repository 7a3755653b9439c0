"""What one SQLite connection knows of its streams' newest events without asking SQLite.

``PRAGMA data_version`` changes exactly when another connection (another process, a
killed writer, another store on the same file) committed since the connection last
asked; the connection's own commits leave it as it is. So the heads and ``latest`` results
the connection read or wrote stay true until either it appends to or deletes that
stream itself (noted here after each commit) or the version changes (everything is
forgotten). Every use runs under the connection's lock, on whichever thread holds it.
"""

from __future__ import annotations

import enum
import sqlite3
from collections.abc import Sequence

from ..events import NewEvent, StoredEvent

__all__ = ["UNKNOWN", "Known", "Unknown"]


class Unknown(enum.Enum):
    """What :meth:`Known.head` answers for a stream whose head it does not know: no str,
    so no cursor a caller passes can equal it."""

    UNKNOWN = "unknown"


UNKNOWN = Unknown.UNKNOWN

_MOST_STREAMS = 4096  # heads kept before all are forgotten, and started again
_MOST_LATEST = 256  # latest results kept, likewise
_LARGEST_LATEST = 4096  # payload bytes of one latest result kept; larger ones are read again

LatestKey = tuple[tuple[str, ...], int | None, int]  # types, before, limit


class Known:
    """Heads (``None`` for an empty stream) and ``latest`` results, per (namespace, stream),
    current as of the connection's last :meth:`current`."""

    __slots__ = ("_cursor", "_heads", "_latest", "_latest_count", "_version")

    def __init__(self) -> None:
        self._cursor: sqlite3.Cursor | None = None
        self._version = -1
        self._heads: dict[tuple[str, str], str | None] = {}
        self._latest: dict[tuple[str, str], dict[LatestKey, tuple[StoredEvent, ...]]] = {}
        self._latest_count = 0

    def current(self, cursor: sqlite3.Cursor) -> None:
        """Forget everything when another connection committed since the last call (or
        ``cursor`` is another connection's). One statement; raises sqlite3.Error as it does."""
        version = cursor.execute("PRAGMA data_version").fetchone()[0]
        if version != self._version or cursor is not self._cursor:
            self._heads.clear()
            self._latest.clear()
            self._latest_count = 0
            self._version = version
            self._cursor = cursor

    def head(self, namespace: str, stream: str) -> str | Unknown | None:
        """The known head cursor, None for a known empty stream, :data:`UNKNOWN` else."""
        return self._heads.get((namespace, stream), UNKNOWN)

    def saw_head(self, namespace: str, stream: str, head: str | None) -> None:
        """Note the head a read found (after a :meth:`current` taken before it)."""
        if len(self._heads) >= _MOST_STREAMS:
            self._heads.clear()
        self._heads[(namespace, stream)] = head

    def latest(self, namespace: str, stream: str, key: LatestKey) -> tuple[StoredEvent, ...] | None:
        """A known ``latest`` result, or None."""
        found = self._latest.get((namespace, stream))
        return None if found is None else found.get(key)

    def saw_latest(
        self, namespace: str, stream: str, key: LatestKey, events: tuple[StoredEvent, ...]
    ) -> None:
        """Note a ``latest`` result (after a :meth:`current` taken before its read)."""
        if sum(len(event.data) for event in events) > _LARGEST_LATEST:
            return
        if self._latest_count >= _MOST_LATEST:
            self._latest.clear()
            self._latest_count = 0
        found = self._latest.setdefault((namespace, stream), {})
        self._latest_count += key not in found
        found[key] = events

    def appended(self, namespace: str, stream: str, head: str, events: Sequence[NewEvent]) -> None:
        """This connection committed ``events`` to the stream, ``head`` the cursor of the
        last: the latest results of any of their types are no longer current."""
        self.saw_head(namespace, stream, head)
        found = self._latest.get((namespace, stream))
        if found:
            written = {event.type for event in events}
            for key in [key for key in found if not written.isdisjoint(key[0])]:
                del found[key]
                self._latest_count -= 1

    def deleted(self, namespace: str, stream: str) -> None:
        """This connection committed the stream's deletion."""
        self.saw_head(namespace, stream, None)
        gone = self._latest.pop((namespace, stream), None)
        if gone:
            self._latest_count -= len(gone)
