"""Shared helpers of the ADK tests: journal URLs per backend and a probing store wrapper."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from contextfold.errors import StoreUnavailableError
from contextfold.events import NewEvent, StoredEvent
from contextfold.store.base import AppendResult, ReadResult, Store, StreamInfo

__all__ = ["BACKENDS", "ProbeStore", "Read", "backend_url"]

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The journal URL of ``request.param``: memory, a real SQLite file or a fresh PostgreSQL
    database of the suite's server."""
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'journal.db'}"
    return str(request.getfixturevalue("pg_dsn"))


@dataclass(frozen=True)
class Read:
    """One read the store answered."""

    stream: str
    after: str | None
    types: tuple[str, ...] | None
    limit: int | None
    returned: int


class ProbeStore(Store):
    """A real store that records its reads and refuses the appends ``fail`` picks (a crash
    between two appends, a lost connection)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.reads: list[Read] = []
        self.fail: Callable[[str], bool] = lambda stream: False

    def events_read(self, stream: str) -> int:
        return sum(read.returned for read in self.reads if read.stream == stream)

    async def open(self) -> None:
        await self.inner.open()

    async def close(self) -> None:
        await self.inner.close()

    async def append(
        self,
        namespace: str,
        stream: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int | None,
        idempotency_key: str | None,
    ) -> AppendResult:
        if self.fail(stream):
            raise StoreUnavailableError(f"injected: the append to {stream!r} failed")
        return await self.inner.append(
            namespace,
            stream,
            events,
            expected_version=expected_version,
            idempotency_key=idempotency_key,
        )

    async def read(
        self,
        namespace: str,
        stream: str,
        *,
        after: str | None,
        types: Sequence[str] | None,
        limit: int | None,
    ) -> ReadResult:
        result = await self.inner.read(namespace, stream, after=after, types=types, limit=limit)
        kinds = tuple(types) if types is not None else None
        self.reads.append(Read(stream, after, kinds, limit, len(result.events)))
        return result

    async def latest(
        self,
        namespace: str,
        stream: str,
        types: Sequence[str],
        *,
        before: str | None = None,
        limit: int = 1,
    ) -> tuple[StoredEvent, ...]:
        return await self.inner.latest(namespace, stream, types, before=before, limit=limit)

    async def contains(self, namespace: str, stream: str, cursor: str) -> bool:
        return await self.inner.contains(namespace, stream, cursor)

    async def head(self, namespace: str, stream: str) -> str | None:
        return await self.inner.head(namespace, stream)

    async def version(self, namespace: str, stream: str) -> int:
        return await self.inner.version(namespace, stream)

    async def delete_stream(self, namespace: str, stream: str) -> bool:
        return await self.inner.delete_stream(namespace, stream)

    async def list_streams(
        self, namespace: str, *, prefix: str | None = None, limit: int | None = None
    ) -> tuple[StreamInfo, ...]:
        return await self.inner.list_streams(namespace, prefix=prefix, limit=limit)

    def subscribe(
        self, namespace: str, stream: str, *, after: str | None, poll_interval: float = 0.05
    ) -> AsyncIterator[Any]:  # events, and TailReset where the store yields one
        return self.inner.subscribe(namespace, stream, after=after, poll_interval=poll_interval)
