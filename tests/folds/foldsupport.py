"""Test support for the fold tests: a store that records what the fold reader asks of it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import contextfold as cf
from contextfold.events import NewEvent, StoredEvent
from contextfold.store import TailReset


@dataclass(frozen=True)
class ReadCall:
    after: str | None
    types: tuple[str, ...] | None
    returned: int
    reset: bool


class RecordingStore(cf.Store):
    """Delegates to ``inner`` and records every ``read`` (its ``after``) and ``latest`` call.

    ``pause_reads()`` holds every ``read`` after it got its page, until ``resume_reads()``:
    a fold read is then caught between reading a page and storing its state."""

    def __init__(self, inner: cf.Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.reads: list[ReadCall] = []
        self.latest_calls = 0
        self._gate: asyncio.Event | None = None
        self.read_paused = asyncio.Event()

    def pause_reads(self) -> None:
        self._gate = asyncio.Event()
        self.read_paused.clear()

    def resume_reads(self) -> None:
        if self._gate is not None:
            self._gate.set()
        self._gate = None

    def clear(self) -> None:
        self.reads.clear()
        self.latest_calls = 0

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
    ) -> cf.AppendResult:
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
    ) -> cf.ReadResult:
        page = await self.inner.read(namespace, stream, after=after, types=types, limit=limit)
        self.reads.append(
            ReadCall(
                after, tuple(types) if types is not None else None, len(page.events), page.reset
            )
        )
        gate = self._gate
        if gate is not None:
            self.read_paused.set()
            await gate.wait()
        return page

    async def latest(
        self,
        namespace: str,
        stream: str,
        types: Sequence[str],
        *,
        before: str | None = None,
        limit: int = 1,
    ) -> tuple[StoredEvent, ...]:
        self.latest_calls += 1
        return await self.inner.latest(namespace, stream, types, before=before, limit=limit)

    async def contains(self, namespace: str, stream: str, cursor: str) -> bool:
        return await self.inner.contains(namespace, stream, cursor)

    async def version(self, namespace: str, stream: str) -> int:
        return await self.inner.version(namespace, stream)

    async def delete_stream(self, namespace: str, stream: str) -> bool:
        return await self.inner.delete_stream(namespace, stream)

    async def list_streams(
        self, namespace: str, *, prefix: str | None = None, limit: int | None = None
    ) -> tuple[cf.StreamInfo, ...]:
        return await self.inner.list_streams(namespace, prefix=prefix, limit=limit)

    def subscribe(
        self, namespace: str, stream: str, *, after: str | None, poll_interval: float = 0.05
    ) -> AsyncIterator[StoredEvent | TailReset]:
        return self.inner.subscribe(namespace, stream, after=after, poll_interval=poll_interval)
