"""The in-memory transcript store: the reference backend, for tests and short-lived scripts.

It keeps rows in process memory with the semantics of the SQLite store (rows stored as
their JSON and decoded on read, places in the order fixed by the first write, namespaces
apart), and passes the same contract, so a user's tests can run on it what production
runs on SQLite or PostgreSQL. Everything is lost when the process ends.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ...errors import StoreUnavailableError
from ...journal.encode import check_namespace
from ..parts import Message, Part, is_unfinished
from .base import (
    CleanupResult,
    CloseRows,
    SessionInfo,
    TranscriptStore,
    decode_message_row,
    decode_part_row,
)

__all__ = ["MemoryTranscriptStore"]


@dataclass(slots=True)
class _Row:
    seq: int
    open: bool
    data: str
    message_id: str = ""


@dataclass(slots=True)
class _Session:
    # Listed once a message is written (as in SQL, where only messages make a session row).
    created: str | None = None
    updated: str = ""
    # Dicts keep first-insertion order, which is the order of places: an upsert keeps it.
    messages: dict[str, _Row] = field(default_factory=dict)
    parts: dict[str, _Row] = field(default_factory=dict)
    message_seqs: list[int] = field(default_factory=list)
    message_ids: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Data:
    """What a store and its namespace views share."""

    sessions: dict[tuple[str, str], _Session] = field(default_factory=dict)
    message_seq: int = 0
    part_seq: int = 0
    closed: bool = False


class MemoryTranscriptStore(TranscriptStore):
    """A complete transcript store in process memory (``memory://``)."""

    def __init__(self, *, namespace: str = "default", _data: _Data | None = None) -> None:
        self.namespace = check_namespace(namespace)
        self.url = "memory://"
        self._data = _data if _data is not None else _Data()

    def with_namespace(self, namespace: str) -> MemoryTranscriptStore:
        """The same rows, scoped to another namespace (closing either closes both)."""
        return MemoryTranscriptStore(namespace=namespace, _data=self._data)

    async def open(self) -> None:
        self._live()

    async def close(self) -> None:
        self._data.closed = True

    def _live(self) -> _Data:
        if self._data.closed:
            raise StoreUnavailableError(f"the transcript store at {self.url} is closed")
        return self._data

    def _session(self, session: str) -> _Session | None:
        return self._live().sessions.get((self.namespace, session))

    # -- writing ------------------------------------------------------------------------

    def _upsert(self, messages: Sequence[Message], parts: Sequence[Part]) -> None:
        # Nothing below can fail halfway, so a batch is applied all or none.
        data = self._live()
        for m in messages:
            key = (self.namespace, m.session)
            changed = m.completed or m.created
            state = data.sessions.setdefault(key, _Session())
            if state.created is None:
                state.created, state.updated = m.created, changed
            else:
                state.updated = max(state.updated, changed)
            row = state.messages.get(m.id)
            if row is None:
                data.message_seq += 1
                row = state.messages[m.id] = _Row(data.message_seq, False, "")
                state.message_seqs.append(row.seq)
                state.message_ids.append(m.id)
            row.open, row.data = m.completed is None, m.model_dump_json()
        for p in parts:
            state = data.sessions.setdefault((self.namespace, p.session), _Session())
            row = state.parts.get(p.id)
            if row is None:
                data.part_seq += 1
                row = state.parts[p.id] = _Row(data.part_seq, False, "")
            row.open, row.data, row.message_id = is_unfinished(p), p.model_dump_json(), p.message_id

    async def _write_rows(self, messages: tuple[Message, ...], parts: tuple[Part, ...]) -> None:
        self._upsert(messages, parts)

    async def _close_unfinished(self, session: str, close: CloseRows) -> CleanupResult:
        messages, parts = self._unfinished(session)
        closed = close(messages, parts)
        self._upsert(closed.messages, closed.parts)
        return closed

    # -- reading ------------------------------------------------------------------------

    async def _read_message(self, session: str, message_id: str) -> Message | None:
        state = self._session(session)
        row = state.messages.get(message_id) if state else None
        return None if row is None else decode_message_row(row.data, session)

    async def _read_part(self, session: str, part_id: str) -> Part | None:
        state = self._session(session)
        row = state.parts.get(part_id) if state else None
        return None if row is None else decode_part_row(row.data, session)

    async def _read_page(
        self, session: str, after: int, limit: int
    ) -> Sequence[tuple[int, Message]]:
        state = self._session(session)
        if state is None:
            return ()
        start = bisect.bisect_right(state.message_seqs, after)
        ids = state.message_ids[start : start + limit]
        rows = [state.messages[i] for i in ids]
        return tuple((row.seq, decode_message_row(row.data, session)) for row in rows)

    async def _read_parts(
        self, session: str, message_ids: tuple[str, ...]
    ) -> Mapping[str, Sequence[Part]]:
        state = self._session(session)
        found: dict[str, list[Part]] = {i: [] for i in message_ids}
        for row in state.parts.values() if state else ():
            if row.message_id in found:
                found[row.message_id].append(decode_part_row(row.data, session))
        return found

    def _unfinished(self, session: str) -> tuple[tuple[Message, ...], tuple[Part, ...]]:
        state = self._session(session)
        if state is None:
            return (), ()
        return (
            tuple(decode_message_row(r.data, session) for r in state.messages.values() if r.open),
            tuple(decode_part_row(r.data, session) for r in state.parts.values() if r.open),
        )

    async def _read_unfinished(self, session: str) -> tuple[tuple[Message, ...], tuple[Part, ...]]:
        return self._unfinished(session)

    async def _read_sessions(self, limit: int | None) -> Sequence[SessionInfo]:
        found = sorted(
            (state.created, sid, state.updated)
            for (ns, sid), state in self._live().sessions.items()
            if ns == self.namespace and state.created is not None
        )
        return tuple(SessionInfo(sid, created, updated) for created, sid, updated in found[:limit])
