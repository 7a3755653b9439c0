"""The in-memory store: the reference backend, for tests and short-lived scripts.

It keeps everything in process memory and implements the full store contract, so a
user's tests can run against it what production runs against SQLite or PostgreSQL.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..events import NewEvent, StoredEvent
from .base import (
    AppendResult,
    ReadResult,
    Store,
    StreamInfo,
    batch_digest,
    idempotency_conflict,
    parse_cursor,
    wrong_version,
)

__all__ = ["MemoryStore"]


@dataclass(slots=True)
class _Stream:
    events: list[StoredEvent] = field(default_factory=list)
    globals: list[int] = field(default_factory=list)
    idempotency: dict[str, tuple[str, AppendResult]] = field(default_factory=dict)


class MemoryStore(Store):
    """A complete store in process memory. Lost when the process ends."""

    consecutive_globals = True

    def __init__(self) -> None:
        self.url = "memory://"
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._global = 0

    async def append(
        self,
        namespace: str,
        stream: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int | None,
        idempotency_key: str | None,
    ) -> AppendResult:
        state = self._streams.get((namespace, stream))
        version = len(state.events) if state else 0
        digest = batch_digest(events) if idempotency_key is not None else ""
        if state is not None and idempotency_key is not None:
            seen = state.idempotency.get(idempotency_key)
            if seen is not None:
                if seen[0] != digest:
                    raise idempotency_conflict(stream, idempotency_key)
                return seen[1]
        if expected_version is not None and expected_version != version:
            raise wrong_version(stream, expected_version, version)
        if state is None:
            state = self._streams[(namespace, stream)] = _Stream()
        for offset, new in enumerate(events, start=1):
            self._global += 1
            state.events.append(
                StoredEvent.appended(namespace, stream, self._global, version + offset, new)
            )
            state.globals.append(self._global)
        result = AppendResult(stream, version + 1, version + len(events), str(self._global))
        if idempotency_key is not None:
            state.idempotency[idempotency_key] = (
                digest,
                AppendResult(
                    stream,
                    result.first_position,
                    result.last_position,
                    result.cursor,
                    deduplicated=True,
                ),
            )
        self.wakeups.notify(namespace, stream)
        return result

    def _index_after(self, state: _Stream | None, cursor: str | None) -> int | None:
        """Index of the first event after ``cursor``; None when the cursor is unknown."""
        target = parse_cursor(cursor)
        if target is None:
            return None
        if target == 0:
            return 0
        if state is None:
            return None
        index = bisect.bisect_left(state.globals, target)
        if index < len(state.globals) and state.globals[index] == target:
            return index + 1
        return None

    async def read(
        self,
        namespace: str,
        stream: str,
        *,
        after: str | None,
        types: Sequence[str] | None,
        limit: int | None,
    ) -> ReadResult:
        state = self._streams.get((namespace, stream))
        start = self._index_after(state, after)
        reset = start is None
        events = state.events[start or 0 :] if state else []
        if types is not None:
            wanted = set(types)
            events = [e for e in events if e.type in wanted]
        more = limit is not None and len(events) > limit
        if limit is not None:
            events = events[:limit]
        cursor = events[-1].cursor if events else (None if reset else after)
        return ReadResult(tuple(events), cursor, reset=reset, more=more)

    async def latest(
        self,
        namespace: str,
        stream: str,
        types: Sequence[str],
        *,
        before: str | None = None,
        limit: int = 1,
    ) -> tuple[StoredEvent, ...]:
        state = self._streams.get((namespace, stream))
        if state is None:
            return ()
        bound = parse_cursor(before) if before is not None else None
        wanted = set(types)
        found: list[StoredEvent] = []
        for event in reversed(state.events):
            if bound is not None and event.global_position >= bound:
                continue
            if event.type in wanted:
                found.append(event)
                if len(found) >= limit:
                    break
        return tuple(found)

    async def contains(self, namespace: str, stream: str, cursor: str) -> bool:
        index = self._index_after(self._streams.get((namespace, stream)), cursor)
        return index is not None and index > 0

    async def head(self, namespace: str, stream: str) -> str | None:
        state = self._streams.get((namespace, stream))
        return str(state.globals[-1]) if state and state.globals else None

    async def version(self, namespace: str, stream: str) -> int:
        state = self._streams.get((namespace, stream))
        return len(state.events) if state else 0

    async def delete_stream(self, namespace: str, stream: str) -> bool:
        found = self._streams.pop((namespace, stream), None) is not None
        if found:
            self.wakeups.notify(namespace, stream)  # its tails signal the reset at once
        return found

    async def list_streams(
        self,
        namespace: str,
        *,
        prefix: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> tuple[StreamInfo, ...]:
        names = sorted(
            s
            for (ns, s) in self._streams
            if ns == namespace and s.startswith(prefix or "") and (after is None or s > after)
        )
        infos = [StreamInfo(s, len(self._streams[(namespace, s)].events)) for s in names]
        return tuple(infos[:limit] if limit is not None else infos)
