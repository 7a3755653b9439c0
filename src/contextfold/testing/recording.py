"""A store that records every call it passes on: what a journal, a fold read or an
integration asked of its backend, and what it got.

``RecordingStore(inner)`` is a complete :class:`~contextfold.store.base.Store` wrapping
another (a fresh memory store by default). Tests assert on :attr:`RecordingStore.calls`
("a warm read asks only for events after its cursor", "a refused argument never reached
the store", :meth:`RecordingStore.events_read`), :meth:`RecordingStore.pause` holds calls
after they were answered, to catch a reader between two steps, :meth:`RecordingStore.fail`
injects a store failure (before the call, or after it committed: a lost answer) and
:meth:`RecordingStore.before_next` runs a hook (another writer, say) just before a call.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import StoreUnavailableError
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


@dataclass(frozen=True, slots=True)
class _Fault:
    when: Callable[[StoreCall], bool]
    answered: bool
    once: bool


class RecordingStore(Store):
    """Passes every call to ``inner`` and records it, in order, in :attr:`calls`."""

    def __init__(self, inner: Store | None = None) -> None:
        self.inner = inner if inner is not None else MemoryStore()
        self.url = self.inner.url
        self.calls: list[StoreCall] = []
        self.paused = asyncio.Event()  # set while a paused call waits for resume()
        self._held: frozenset[str] = frozenset()
        self._gate: asyncio.Event | None = None
        self._fault: _Fault | None = None
        self._hooks: dict[str, Callable[[StoreCall], Awaitable[None]]] = {}

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

    def events_read(self, stream: str | None = None) -> int:
        """How many events the recorded ``read`` calls returned (of ``stream``, or of every
        stream); :meth:`clear` starts the count again."""
        return sum(call.returned for call in self.reads if stream in (None, call.stream))

    def clear(self) -> None:
        """Forget the calls recorded so far."""
        self.calls.clear()

    # -- what the test injects ------------------------------------------------------------

    def fail(
        self,
        when: Callable[[StoreCall], bool] | None,
        *,
        answered: bool = False,
        once: bool = False,
    ) -> None:
        """From now on, a call for which ``when(call)`` is true (``call`` has the method and
        arguments, no result) raises :class:`~contextfold.errors.StoreUnavailableError`:
        before it reaches the inner store (nothing happens), or with ``answered`` after the
        inner store answered (it happened; the caller never heard). With ``once`` only the
        first such call fails; ``fail(None)`` fails nothing more. ``subscribe`` never fails."""
        self._fault = None if when is None else _Fault(when, answered, once)

    def before_next(self, method: str, hook: Callable[[StoreCall], Awaitable[None]]) -> None:
        """Await ``hook(call)`` once, just before the next call of ``method`` reaches the
        inner store (the hook may use this store: its own calls run it no more)."""
        self._hooks[method] = hook

    def _injected(self, call: StoreCall, *, answered: bool) -> StoreUnavailableError | None:
        fault = self._fault
        if fault is None or fault.answered is not answered or not fault.when(call):
            return None
        if fault.once:
            self._fault = None
        what = "the answer to" if answered else "the call to"
        where = "" if call.stream is None else f" of stream {call.stream!r}"
        return StoreUnavailableError(f"injected: {what} {call.method}{where} was lost")

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

    async def _record(
        self, method: str, args: dict[str, Any], call: Callable[[], Awaitable[T]]
    ) -> T:
        asked = StoreCall(method, args)
        hook = self._hooks.pop(method, None)
        if hook is not None:
            await hook(asked)
        try:
            if (injected := self._injected(asked, answered=False)) is not None:
                raise injected
            result = await call()
        except BaseException as exc:
            self.calls.append(StoreCall(method, args, error=exc))
            raise
        if (injected := self._injected(asked, answered=True)) is not None:
            self.calls.append(StoreCall(method, args, result, injected))
            raise injected
        self.calls.append(StoreCall(method, args, result))
        gate = self._gate
        if gate is not None and method in self._held:
            self.paused.set()
            await gate.wait()
        return result

    # -- the Store interface --------------------------------------------------------------

    async def open(self) -> None:
        await self._record("open", {}, self.inner.open)

    async def close(self) -> None:
        await self._record("close", {}, self.inner.close)

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
            lambda: self.inner.append(
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
            "read",
            args,
            lambda: self.inner.read(namespace, stream, after=after, types=types, limit=limit),
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
            "latest",
            args,
            lambda: self.inner.latest(namespace, stream, types, before=before, limit=limit),
        )

    async def contains(self, namespace: str, stream: str, cursor: str) -> bool:
        args = {"namespace": namespace, "stream": stream, "cursor": cursor}
        return await self._record(
            "contains", args, lambda: self.inner.contains(namespace, stream, cursor)
        )

    async def head(self, namespace: str, stream: str) -> str | None:
        args = {"namespace": namespace, "stream": stream}
        return await self._record("head", args, lambda: self.inner.head(namespace, stream))

    async def version(self, namespace: str, stream: str) -> int:
        args = {"namespace": namespace, "stream": stream}
        return await self._record("version", args, lambda: self.inner.version(namespace, stream))

    async def delete_stream(self, namespace: str, stream: str) -> bool:
        args = {"namespace": namespace, "stream": stream}
        return await self._record(
            "delete_stream", args, lambda: self.inner.delete_stream(namespace, stream)
        )

    async def list_streams(
        self,
        namespace: str,
        *,
        prefix: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> tuple[StreamInfo, ...]:
        args = {"namespace": namespace, "prefix": prefix, "limit": limit, "after": after}
        return await self._record(
            "list_streams",
            args,
            lambda: self.inner.list_streams(namespace, prefix=prefix, limit=limit, after=after),
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
