"""A store that records every call it passes on: what a journal, a fold read or an
integration asked of its backend, and what it got.

``RecordingStore(inner)`` is a complete :class:`~contextfold.store.base.Store` wrapping
another (a fresh memory store by default). Tests assert on :attr:`RecordingStore.calls`
("a warm read asks only for events after its cursor", "a refused argument never reached
the store"), and :meth:`RecordingStore.pause` holds calls after they were answered, to
catch a reader between two steps. Subclass it to inject a fault into one method.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..events import NewEvent, StoredEvent
from ..store.base import AppendResult, ReadResult, Store, StreamInfo, TailReset, Wakeups
from ..store.memory import MemoryStore

__all__ = ["RecordingStore", "StoreCall"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class StoreCall:
    """One call the store answered (or that raised)."""

    method: str
    """The Store method: ``append``, ``read``, ``latest``, ``contains``, ``head``, …"""
    args: Mapping[str, Any]
    """Every argument by name, ``namespace`` and ``stream`` included."""
    result: Any = None
    """What the inner store returned (None when it raised)."""
    error: BaseException | None = field(default=None, compare=False)
    """What the inner store raised, if it did."""

    @property
    def stream(self) -> str | None:
        return self.args.get("stream")

    @property
    def after(self) -> str | None:
        """The cursor a ``read`` was asked to continue after (None: from the start)."""
        return self.args.get("after")

    @property
    def types(self) -> tuple[str, ...] | None:
        """The event types a ``read`` or ``latest`` was narrowed to (None: every type)."""
        types = self.args.get("types")
        return None if types is None else tuple(types)

    @property
    def returned(self) -> int:
        """How many events a ``read`` or ``latest`` returned (0 for other calls)."""
        if isinstance(self.result, ReadResult):
            return len(self.result.events)
        if self.method == "latest" and isinstance(self.result, tuple):
            return len(self.result)
        return 0

    @property
    def reset(self) -> bool:
        """Whether a ``read`` reset to the stream's start (its cursor named no event)."""
        return isinstance(self.result, ReadResult) and self.result.reset


class RecordingStore(Store):
    """Passes every call to ``inner`` and records it, in order, in :attr:`calls`."""

    def __init__(self, inner: Store | None = None) -> None:
        self.inner = inner if inner is not None else MemoryStore()
        self.url = self.inner.url
        self.calls: list[StoreCall] = []
        self.paused = asyncio.Event()  # set while a paused call waits for resume()
        self._held: frozenset[str] = frozenset()
        self._gate: asyncio.Event | None = None

    # -- what the test reads --------------------------------------------------------------

    def of(self, *methods: str) -> tuple[StoreCall, ...]:
        """The recorded calls of these methods, in order."""
        return tuple(call for call in self.calls if call.method in methods)

    @property
    def reads(self) -> tuple[StoreCall, ...]:
        """The recorded ``read`` calls, in order (:meth:`clear` forgets them)."""
        return self.of("read")

    @property
    def methods(self) -> tuple[str, ...]:
        """The name of every recorded call, in order."""
        return tuple(call.method for call in self.calls)

    def clear(self) -> None:
        """Forget the calls recorded so far."""
        self.calls.clear()

    def pause(self, *methods: str) -> None:
        """From now on, hold each call of ``methods`` after the inner store answered it
        (setting :attr:`paused`) until :meth:`resume`."""
        self._held = frozenset(methods)
        self._gate = asyncio.Event()
        self.paused.clear()

    def resume(self) -> None:
        """Let held calls return, and hold no more."""
        if self._gate is not None:
            self._gate.set()
        self._gate = None
        self._held = frozenset()

    async def _record(self, method: str, args: dict[str, Any], call: Awaitable[T]) -> T:
        try:
            result = await call
        except BaseException as exc:
            self.calls.append(StoreCall(method, args, error=exc))
            raise
        self.calls.append(StoreCall(method, args, result))
        gate = self._gate
        if gate is not None and method in self._held:
            self.paused.set()
            await gate.wait()
        return result

    # -- the Store interface --------------------------------------------------------------

    async def open(self) -> None:
        await self._record("open", {}, self.inner.open())

    async def close(self) -> None:
        await self._record("close", {}, self.inner.close())

    async def append(
        self,
        namespace: str,
        stream: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int | None,
        idempotency_key: str | None,
    ) -> AppendResult:
        args = {
            "namespace": namespace,
            "stream": stream,
            "events": tuple(events),
            "expected_version": expected_version,
            "idempotency_key": idempotency_key,
        }
        return await self._record(
            "append",
            args,
            self.inner.append(
                namespace,
                stream,
                events,
                expected_version=expected_version,
                idempotency_key=idempotency_key,
            ),
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
        args = {
            "namespace": namespace,
            "stream": stream,
            "after": after,
            "types": None if types is None else tuple(types),
            "limit": limit,
        }
        return await self._record(
            "read", args, self.inner.read(namespace, stream, after=after, types=types, limit=limit)
        )

    async def latest(
        self,
        namespace: str,
        stream: str,
        types: Sequence[str],
        *,
        before: str | None = None,
        limit: int = 1,
    ) -> tuple[StoredEvent, ...]:
        args = {
            "namespace": namespace,
            "stream": stream,
            "types": tuple(types),
            "before": before,
            "limit": limit,
        }
        return await self._record(
            "latest", args, self.inner.latest(namespace, stream, types, before=before, limit=limit)
        )

    async def contains(self, namespace: str, stream: str, cursor: str) -> bool:
        args = {"namespace": namespace, "stream": stream, "cursor": cursor}
        return await self._record("contains", args, self.inner.contains(namespace, stream, cursor))

    async def head(self, namespace: str, stream: str) -> str | None:
        args = {"namespace": namespace, "stream": stream}
        return await self._record("head", args, self.inner.head(namespace, stream))

    async def version(self, namespace: str, stream: str) -> int:
        args = {"namespace": namespace, "stream": stream}
        return await self._record("version", args, self.inner.version(namespace, stream))

    async def delete_stream(self, namespace: str, stream: str) -> bool:
        args = {"namespace": namespace, "stream": stream}
        return await self._record(
            "delete_stream", args, self.inner.delete_stream(namespace, stream)
        )

    async def list_streams(
        self, namespace: str, *, prefix: str | None = None, limit: int | None = None
    ) -> tuple[StreamInfo, ...]:
        args = {"namespace": namespace, "prefix": prefix, "limit": limit}
        return await self._record(
            "list_streams", args, self.inner.list_streams(namespace, prefix=prefix, limit=limit)
        )

    @property
    def wakeups(self) -> Wakeups:
        return self.inner.wakeups

    def subscribe(
        self, namespace: str, stream: str, *, after: str | None, poll_interval: float = 0.05
    ) -> AsyncIterator[StoredEvent | TailReset]:
        """The inner store's tail; the call is recorded when it is made, not per event."""
        args = {"namespace": namespace, "stream": stream, "after": after}
        self.calls.append(StoreCall("subscribe", args))
        return self.inner.subscribe(namespace, stream, after=after, poll_interval=poll_interval)
