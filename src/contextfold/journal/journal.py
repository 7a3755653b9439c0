"""The async journal: typed events in, stored events and fold states out, over one store.

``open_journal(url)`` picks the backend from the URL. The journal checks every argument
and encodes events (:mod:`.encode`) before anything reaches the store, injects time and ids
at this one edge, and scopes every operation to its namespace. Checkpoints and compactions
of folds are orchestrated in :mod:`.checkpoint` and :mod:`.compaction`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from ..events import Event, NewEvent, RawEvent, StoredEvent
from ..folds.fold import FoldBase
from ..folds.reader import FoldCache, FoldReader
from ..folds.segmented import SegmentedFold
from ..store.base import (
    MAX_LIMIT,
    AppendResult,
    ReadResult,
    Store,
    StreamChange,
    StreamInfo,
    TailReset,
    parse_cursor,
)
from ..store.urls import open_store
from ..telemetry import record_append, record_fold_read
from ..views.strategies import KeepFrom
from ..views.view import ContextView
from . import checkpoint, compaction
from ._fence import StreamFence, known_to
from .compaction import CompactionResult, Summarize
from .encode import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Clock,
    IdFactory,
    check_batch,
    check_cursor,
    check_expected_version,
    check_limit,
    check_max_payload_bytes,
    check_namespace,
    check_prefix,
    check_stored_stream,
    check_stream,
    check_stream_cursor,
    check_types,
    encode_events,
    utc_now,
)

__all__ = ["Journal", "StreamFence", "new_event_id", "open_journal", "utc_now"]

S = TypeVar("S")
T = TypeVar("T")


_ID_PREFIX = os.urandom(10).hex()
_ID_COUNTER = itertools.count()


def new_event_id() -> str:
    """The journal's default id factory: unique across processes, ASCII, cheap."""
    # 80 random bits per process and a counter: unique, and cheap enough to make 100,000
    # a second (a fresh uuid4 per event cost a third of a batch append's overhead).
    return f"{_ID_PREFIX}{next(_ID_COUNTER):012x}"


@dataclass(slots=True)
class _Shared:
    """What every namespace view of one journal shares: the open and the fold reader."""

    folds: FoldReader
    opened: asyncio.Future[None] | None = None
    ready: bool = False  # the open succeeded: calls skip awaiting it


class Journal:
    """The async journal of one namespace over a store.

    ``clock`` and ``ids`` are the only sources of time and ids: inject fixed ones in tests.
    Raises InvalidInputError for a bad namespace or ``max_payload_bytes``.
    """

    def __init__(
        self,
        store: Store,
        *,
        namespace: str = "default",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        clock: Clock = utc_now,
        ids: IdFactory = new_event_id,
        fold_cache: FoldCache | None = None,
        young_collections: bool = True,
        _shared: _Shared | None = None,
    ) -> None:
        self.store = store
        self.namespace = check_namespace(namespace)
        self.max_payload_bytes = check_max_payload_bytes(max_payload_bytes)
        self.clock = clock
        self.ids = ids
        if _shared is None:
            reader = FoldReader(store, fold_cache, young_collections=young_collections)
            _shared = _Shared(reader)
        self._shared = _shared
        self._fence: StreamFence | None = None

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def folds(self) -> FoldReader:
        """The fold reader (cache, skipped-event reports) shared by every namespace view."""
        return self._shared.folds

    @property
    def fence(self) -> StreamFence | None:
        """The fence of this journal's appends to its stream (:meth:`fenced`), if any."""
        return self._fence

    def fenced(self, fence: StreamFence) -> Journal:
        """This journal (store, namespace, open, fold cache) with its appends to
        ``fence.stream`` handed to ``fence.append`` (which appends through this journal, not
        the fenced one), and its folds of that stream taking it to be where ``fence.known``
        says, without asking the store, whenever it says."""
        view = self.with_namespace(self.namespace)
        view._fence = fence
        return view

    def with_namespace(self, namespace: str) -> Journal:
        """The same journal, scoped to another namespace (tenant)."""
        return Journal(
            self.store,
            namespace=namespace,
            max_payload_bytes=self.max_payload_bytes,
            clock=self.clock,
            ids=self.ids,
            _shared=self._shared,
        )

    async def _ready(self) -> Store:
        opened = self._shared.opened
        if opened is None:
            opened = self._shared.opened = asyncio.ensure_future(self.store.open())
            opened.add_done_callback(self._opened)
        await asyncio.shield(opened)
        return self.store

    def _opened(self, opened: asyncio.Future[None]) -> None:
        if self._shared.opened is not opened:
            return
        # A failed open is not cached: the next call tries again (the server may be back).
        if opened.cancelled() or opened.exception() is not None:
            self._shared.opened = None
        else:
            self._shared.ready = True

    async def __aenter__(self) -> Journal:
        await self._ready()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.store.close()

    # -- writing ----------------------------------------------------------------------------

    def encode(
        self,
        events: Event | RawEvent | Iterable[Event | RawEvent],
        *,
        run_id: str | None = None,
        actor: str | None = None,
        channels: Sequence[str] = ("main",),
    ) -> tuple[NewEvent, ...]:
        """``events`` as an append would store them (payload bytes, one time from the clock,
        an id each, the meta given), stored as they are by a later :meth:`append`.

        So a caller knows what an event will say (its time) before it makes the events
        that follow it in the same append, and each event of a batch may have its own
        actor and channels. Nothing is stored. Raises as :meth:`append` for bad input.
        """
        return tuple(self._encode(check_batch("an encoded batch", events), run_id, actor, channels))

    def _encode(
        self,
        batch: Iterable[Event | RawEvent | NewEvent],
        run_id: str | None,
        actor: str | None,
        channels: Sequence[str],
        idempotency_key: str | None = None,
    ) -> list[NewEvent]:
        return encode_events(
            batch,
            clock=self.clock,
            ids=self.ids,
            max_payload_bytes=self.max_payload_bytes,
            run_id=run_id,
            actor=actor,
            channels=channels,
            idempotency_key=idempotency_key,
        )

    async def append(
        self,
        stream: str,
        events: Event | RawEvent | NewEvent | Iterable[Event | RawEvent | NewEvent],
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        run_id: str | None = None,
        actor: str | None = None,
        channels: Sequence[str] = ("main",),
    ) -> AppendResult:
        """Append events atomically to ``stream``; all get consecutive positions or none is written.

        Encoded events (:meth:`encode`) are stored as they are, with their own meta.
        Raises InvalidInputError/PayloadError for bad input, WrongExpectedVersionError,
        IdempotencyConflictError; nothing is written in any of these cases. On a fenced
        journal (:meth:`fenced`), what the fence raises too.
        """
        fence = self._fence
        if fence is not None and stream == fence.stream:
            return await fence.append(
                events,
                expected_version=expected_version,
                idempotency_key=idempotency_key,
                run_id=run_id,
                actor=actor,
                channels=channels,
            )
        check_stream(stream)
        batch = check_batch(stream, events)
        check_expected_version(expected_version)
        prepared = self._encode(batch, run_id, actor, channels, idempotency_key)
        store = self.store if self._shared.ready else await self._ready()
        started = time.perf_counter()
        result = await store.append(
            self.namespace,
            stream,
            prepared,
            expected_version=expected_version,
            idempotency_key=idempotency_key,
        )
        took = time.perf_counter() - started
        record_append(self.namespace, len(prepared), deduplicated=result.deduplicated, seconds=took)
        if not result.deduplicated and self._shared.folds.cache.holds(self.namespace, stream):
            self._fold_appended(stream, prepared, result)
        return result

    def _fold_appended(
        self, stream: str, prepared: Sequence[NewEvent], result: AppendResult
    ) -> None:
        """Fold what an append stored into the cached states it continues: the next read of
        them asks the store only for its head, not for these events again."""
        count = len(prepared)
        last = parse_cursor(result.cursor)
        drawn = result.cursors  # the store's word, where an append's can have gaps
        if not last or (count > 1 and not drawn and not self.store.consecutive_globals):
            return  # which global positions they got is not known: their reads read them
        namespace, first = self.namespace, result.first_position
        stored = tuple(
            StoredEvent.appended(
                namespace,
                stream,
                int(drawn[offset]) if drawn else last - count + 1 + offset,
                first + offset,
                new,
            )
            for offset, new in enumerate(prepared)
        )
        self._shared.folds.appended(namespace, stream, stored, previous=result.previous)

    # -- reading ----------------------------------------------------------------------------

    async def read(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        limit: int | None = None,
    ) -> ReadResult:
        """A page of events after ``after`` (see :meth:`Store.read`)."""
        check_stored_stream(stream)
        check_cursor("after", after)
        if limit is not None:
            check_limit(limit)
        names = check_types(types)
        store = self.store if self._shared.ready else await self._ready()
        return await store.read(self.namespace, stream, after=after, types=names, limit=limit)

    async def read_all(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[StoredEvent]:
        """Every event after ``after`` (only of ``types`` when given), page by page."""
        check_limit(page_size, name="page_size")
        cursor = after
        while True:
            page = await self.read(stream, after=cursor, types=types, limit=page_size)
            for event in page.events:
                yield event
            cursor = page.cursor
            if not page.more:
                return

    async def latest(
        self,
        stream: str,
        types: Sequence[str | type[Event]],
        *,
        before: str | None = None,
        limit: int = 1,
    ) -> tuple[StoredEvent, ...]:
        """The newest events of the given types, newest first."""
        check_stored_stream(stream)
        check_cursor("before", before)
        check_limit(limit)
        names = check_types(types) or ()
        store = self.store if self._shared.ready else await self._ready()
        return await store.latest(self.namespace, stream, names, before=before, limit=limit)

    async def latest_at_head(
        self, stream: str, types: Sequence[str | type[Event]]
    ) -> tuple[int, str | None, StoredEvent | None] | None:
        """The stream's version, head and newest event of ``types``, read together in one
        snapshot when the store can (PostgreSQL), else None: read them one by one."""
        check_stored_stream(stream)
        names = check_types(types) or ()
        store = self.store if self._shared.ready else await self._ready()
        return await store.latest_at_head(self.namespace, stream, names)

    def change_key(self, stream: str) -> str | None:
        """The key naming ``stream`` in the changes :meth:`listen_changes` reports; None when
        the store has no push channel."""
        check_stored_stream(stream)
        return self.store.change_key(self.namespace, stream)

    def listen_changes(
        self,
    ) -> contextlib.AbstractAsyncContextManager[AsyncIterator[StreamChange]] | None:
        """Every change of every namespace's streams, from when it is entered, as the store's
        push channel reports them (see :meth:`Store.listen_changes`); None when it has none."""
        return self.store.listen_changes()

    async def head(self, stream: str) -> str | None:
        """The cursor of the stream's newest event (None when empty)."""
        check_stored_stream(stream)
        store = self.store if self._shared.ready else await self._ready()
        return await store.head(self.namespace, stream)

    async def version(self, stream: str) -> int:
        """The stream's last position (0 when it does not exist)."""
        check_stored_stream(stream)
        return await (await self._ready()).version(self.namespace, stream)

    async def contains(self, stream: str, cursor: str) -> bool:
        """Whether ``cursor`` names an event of the stream's current history."""
        check_stored_stream(stream)
        check_cursor("cursor", cursor, optional=False)
        return await (await self._ready()).contains(self.namespace, stream, cursor)

    async def delete_stream(self, stream: str) -> bool:
        """Delete the stream's events and idempotency keys; True when it existed."""
        check_stored_stream(stream)
        return await (await self._ready()).delete_stream(self.namespace, stream)

    async def list_streams(
        self, *, prefix: str | None = None, limit: int | None = None, after: str | None = None
    ) -> tuple[StreamInfo, ...]:
        """Streams of the namespace, sorted by name (code point order), optionally by prefix:
        at most ``limit``, and with ``after`` (a stream name, which need not exist any more)
        only those named after it, so a page goes on from the last name of the one before.
        Raises InvalidInputError for a bad prefix or limit, InvalidStreamNameError for an
        ``after`` that is no stream name."""
        check_prefix(prefix)
        if limit is not None:
            check_limit(limit)
        if after is not None:
            check_stream_cursor(after)
        store = await self._ready()
        return await store.list_streams(self.namespace, prefix=prefix, limit=limit, after=after)

    async def all_streams(
        self, *, prefix: str | None = None, page_size: int = MAX_LIMIT
    ) -> AsyncIterator[StreamInfo]:
        """Every stream of the namespace (only those starting with ``prefix`` when given),
        by name, page by page: no count of streams is too many to see them all."""
        check_limit(page_size, name="page_size")
        after: str | None = None
        while True:
            page = await self.list_streams(prefix=prefix, limit=page_size, after=after)
            for info in page:
                yield info
            if len(page) < page_size:
                return
            after = page[-1].stream

    @overload
    def subscribe(
        self,
        stream: str,
        *,
        after: str | None = None,
        poll_interval: float = 0.05,
        resets: Literal[False] = False,
    ) -> AsyncIterator[StoredEvent]: ...

    @overload
    def subscribe(
        self, stream: str, *, after: str | None = None, poll_interval: float = 0.05, resets: bool
    ) -> AsyncIterator[StoredEvent | TailReset]: ...

    async def subscribe(
        self,
        stream: str,
        *,
        after: str | None = None,
        poll_interval: float = 0.05,
        resets: bool = False,
    ) -> AsyncIterator[StoredEvent | TailReset]:
        """A live tail: every event after ``after``, then each new one as it lands.

        With ``resets=True`` it also yields a :class:`~contextfold.store.TailReset` whenever
        its cursor names no event any more (``after`` unknown, or the stream deleted while
        it runs): what follows is the stream's history from its start. Without, the new
        history follows silently.
        """
        check_stored_stream(stream)
        check_cursor("after", after)
        store = await self._ready()
        tail = store.subscribe(self.namespace, stream, after=after, poll_interval=poll_interval)
        # aclosing: closing this tail closes the store's at once (its listening connection).
        async with contextlib.aclosing(tail):  # type: ignore[type-var]
            async for event in tail:
                if resets or not isinstance(event, TailReset):
                    # Handed out, not kept: a reader that stops reading (a stalled SSE
                    # client) holds the event alone, and the tail at most TAIL_BUFFER_BYTES.
                    handed = [event]
                    del event
                    yield handed.pop()

    # -- folds --------------------------------------------------------------------------------

    async def fold(self, fold: FoldBase[S], stream: str, *, run_id: str | None = None) -> S:
        """The fold's state over ``stream``: incremental, cached, read-only.

        Run-scoped folds need ``run_id`` and fold only that run's events.
        """
        check_stored_stream(stream)
        if not self._shared.ready:
            await self._ready()
        started = time.perf_counter()
        at = known_to(self._fence, stream)
        state, _ = await self.folds.read_with_cursor(
            fold, self.namespace, stream, run_id=run_id, **at
        )
        record_fold_read(fold.name, self.namespace, time.perf_counter() - started)
        return state

    async def fold_pair(self, first: FoldBase[S], second: FoldBase[T], stream: str) -> tuple[S, T]:
        """``(fold(first, stream), fold(second, stream))`` as of one look at the stream's head:
        both states through the same event, with one head check for the two instead of one
        each (an agent reads its context and its scheduler together). Not for run-scoped
        folds: raises as :meth:`fold` would for an unknown stream name."""
        check_stored_stream(stream)
        store = self.store if self._shared.ready else await self._ready()
        # Where the stream is, looked at once for both folds: the fence's knowledge (read
        # once, as a notification may move it between two reads), else the store's head.
        at = known_to(self._fence, stream)
        if not at:
            at = {"known_head": await store.head(self.namespace, stream)}
        return await self._fold_at(first, stream, at), await self._fold_at(second, stream, at)

    async def _fold_at(self, fold: FoldBase[S], stream: str, at: dict[str, Any]) -> S:
        started = time.perf_counter()
        state, _ = await self.folds.read_with_cursor(fold, self.namespace, stream, **at)
        record_fold_read(fold.name, self.namespace, time.perf_counter() - started)
        return state

    def end_run(self, stream: str, run_id: str) -> None:
        """Forget the run-scoped fold states of a run that ended."""
        self.folds.end_run(self.namespace, stream, run_id)

    async def checkpoint(
        self, fold: FoldBase[S], stream: str, next: Callable[[S], S | Awaitable[S]]
    ) -> S:
        """Replace the fold's state with ``next(state)`` for good, as a checkpoint event.

        ``next`` may be async; events appended while it runs are folded on top of the new
        state, which is returned. Raises CheckpointError (``unsupported``, ``invalid-state``,
        ``next-failed``) and stores nothing when it cannot.
        """
        check_stream(stream)
        await self._ready()
        return await checkpoint.checkpoint(
            self.folds, fold, self.namespace, stream, next, append=self._checkpoint_appender(stream)
        )

    async def compact(
        self,
        fold: SegmentedFold,
        stream: str,
        *,
        view: ContextView[Any],
        budget: float,
        summarize: Summarize,
        keep_tokens: float | None = None,
        keep_from: KeepFrom | None = None,
    ) -> CompactionResult:
        """Summarize the older segments of a segmented fold when its view does not fit.

        Only when ``view(state, budget)`` does not fit and ``view.split`` (keeping
        ``keep_tokens``, by default half the budget, and ``keep_from``) leaves older
        segments, ``summarize(summary=, older=, kept=)`` (may be async) writes the new
        summary, and the state becomes ``{summary, kept}``, stored as a checkpoint.
        Raises CompactionError (and stores nothing) when it cannot, for the agent context
        too: it compacts by cutoff, as the error says.
        """
        check_stream(stream)
        await self._ready()
        return await compaction.compact(
            self.folds,
            fold,
            self.namespace,
            stream,
            view=view,
            budget=budget,
            keep_tokens=keep_tokens,
            keep_from=keep_from,
            summarize=summarize,
            append=self._checkpoint_appender(stream),
        )

    def _checkpoint_appender(self, stream: str) -> Callable[[RawEvent], Awaitable[AppendResult]]:
        async def append_checkpoint(event: RawEvent) -> AppendResult:
            return await self.append(stream, event, channels=())  # no channel: not content

        return append_checkpoint


def open_journal(
    url: str = "sqlite:///contextfold.db",
    *,
    namespace: str = "default",
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    clock: Clock = utc_now,
    ids: IdFactory = new_event_id,
    fold_cache: FoldCache | None = None,
    young_collections: bool = True,
    **store_options: Any,
) -> Journal:
    """Open the async journal at ``url``. The store connects on first use.

    ``young_collections``: whether a fold's catch-up keeps Python's garbage collector to its
    youngest generation while it reads (the default; see ``folds.reader``), which a host
    that tunes its own collector may turn off. ``store_options`` go to the store
    (``synchronous`` for SQLite, ``min_size`` for PostgreSQL, …). Raises InvalidInputError
    for an unknown URL or a bad option.
    """
    return Journal(
        open_store(url, **store_options),
        namespace=namespace,
        max_payload_bytes=max_payload_bytes,
        clock=clock,
        ids=ids,
        fold_cache=fold_cache,
        young_collections=young_collections,
    )
