"""The journal: the async API over a store, and its sync facade for scripts.

``open_journal(url)`` picks the backend from the URL. The journal turns typed events into
stored bytes (checking JSON, size and names), injects time and ids at this one edge, and
scopes every operation to its namespace. Later layers add folds and request rebuilds on
top of the same object.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import orjson

from .. import canonical
from ..errors import InvalidInputError, PayloadError
from ..events import TYPE_NAME, Event, EventMeta, NewEvent, RawEvent, StoredEvent
from ..folds.fold import FoldBase
from ..folds.reader import FoldCache, FoldReader
from ..folds.segmented import SegmentedFold
from ..store.base import (
    AppendResult,
    ReadResult,
    Store,
    StreamInfo,
    TailReset,
    check_channels,
    check_label,
    check_limit,
    check_namespace,
    check_prefix,
    check_stream,
    check_text,
)
from ..store.urls import parse_store_url

if TYPE_CHECKING:  # journal sits below the renderers: the type only, no import cycle
    from ..render.neutral import RenderedRequest

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "Journal",
    "SyncJournal",
    "open_journal",
    "open_journal_sync",
    "store_from_url",
]

T = TypeVar("T")
S = TypeVar("S")

DEFAULT_MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
MAX_BATCH = 10_000

Clock = Callable[[], datetime]
IdFactory = Callable[[], str]


def _utc_now() -> datetime:
    return datetime.now(UTC)


_ID_PREFIX = os.urandom(10).hex()
_ID_COUNTER = itertools.count()


def _new_id() -> str:
    # 80 random bits per process and a counter: unique, and cheap enough to make 100,000
    # a second (a fresh uuid4 per event cost a third of a batch append's overhead).
    return f"{_ID_PREFIX}{next(_ID_COUNTER):012x}"


def store_from_url(url: str, **options: Any) -> Store:
    """A store for ``memory://``, ``sqlite:///relative.db``, ``sqlite:////abs.db``,
    ``sqlite:///:memory:`` or ``postgresql://…``. Raises InvalidInputError for others."""
    parsed = parse_store_url(url, what="journal")
    if parsed.scheme == "memory":
        from ..store.memory import MemoryStore

        return MemoryStore()
    if parsed.scheme == "sqlite":
        from ..store.sqlite import SQLiteStore

        return SQLiteStore(parsed.target, **options)
    try:
        from ..store.postgres import PostgresStore
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise InvalidInputError(
            "PostgreSQL support needs the postgres extra: pip install 'contextfold[postgres]'"
        ) from exc
    return PostgresStore(parsed.target, **options)


class Journal:
    """The async journal of one namespace over a store.

    ``clock`` and ``ids`` are the only sources of time and ids: inject fixed ones in tests.
    """

    def __init__(
        self,
        store: Store,
        *,
        namespace: str = "default",
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        clock: Clock = _utc_now,
        ids: IdFactory = _new_id,
        fold_cache: FoldCache | None = None,
        _shared: dict[str, Any] | None = None,
    ) -> None:
        self.store = store
        self.namespace = check_namespace(namespace)
        if not isinstance(max_payload_bytes, int) or max_payload_bytes <= 0:
            raise InvalidInputError(
                f"max_payload_bytes must be a positive int, got {max_payload_bytes!r}"
            )
        self.max_payload_bytes = max_payload_bytes
        self.clock = clock
        self.ids = ids
        # State shared by every namespace view of one journal (open flag, later the fold cache).
        self._shared: dict[str, Any] = _shared if _shared is not None else {"opened": None}
        if "folds" not in self._shared:
            self._shared["folds"] = FoldReader(store, fold_cache)

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def folds(self) -> FoldReader:
        """The fold reader (cache, skipped-event reports) shared by every namespace view."""
        reader: FoldReader = self._shared["folds"]
        return reader

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
        opened: asyncio.Future[None] | None = self._shared.get("opened")
        if opened is None:
            opened = self._shared["opened"] = asyncio.ensure_future(self.store.open())
            opened.add_done_callback(self._forget_failed_open)
        await asyncio.shield(opened)
        return self.store

    def _forget_failed_open(self, opened: asyncio.Future[None]) -> None:
        # A failed open is not cached: the next call tries again (the server may be back).
        if (opened.cancelled() or opened.exception() is not None) and self._shared.get(
            "opened"
        ) is opened:
            self._shared["opened"] = None

    async def __aenter__(self) -> Journal:
        await self._ready()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.store.close()

    # -- writing ----------------------------------------------------------------------------

    def prepare(
        self,
        events: Iterable[Event | RawEvent],
        *,
        run_id: str | None = None,
        actor: str | None = None,
        channels: Sequence[str] = (),
        idempotency_key: str | None = None,
    ) -> list[NewEvent]:
        """Encode events for storage, injecting ids and time. Raises PayloadError."""
        time = self.clock().isoformat()
        chans = check_channels(channels)
        prepared: list[NewEvent] = []
        limit = self.max_payload_bytes
        for index, event in enumerate(events):
            if type(event) is RawEvent:
                type_name = event.type
                if not isinstance(type_name, str) or not TYPE_NAME.match(type_name):
                    raise InvalidInputError(
                        f"events[{index}]: raw event type {type_name!r} must be 1-200 characters "
                        "of letters, digits and . _ : / @ + -, starting with a letter or digit"
                    )
                value = event.payload
            elif isinstance(event, Event):
                type_name = type(event).event_type
                if not type_name:
                    raise InvalidInputError(
                        f"events[{index}]: {type(event).__qualname__} has no type name; "
                        'define it as class X(cf.Event, type="x")'
                    )
                value = event.model_dump(mode="json")
            else:
                raise InvalidInputError(
                    f"events[{index}] is a {type(event).__name__}: append takes cf.Event "
                    "instances or cf.RawEvent"
                )
            try:
                data = orjson.dumps(value)
            except TypeError:
                data = b"null"  # the checked encoder below names the field at fault
            if b"null" in data:
                try:
                    data = canonical.encode_checked(
                        value, where=f"events[{index}] ({type_name}) payload"
                    )
                except ValueError as exc:
                    raise PayloadError(str(exc)) from exc
            if len(data) > limit:
                raise PayloadError(
                    f"events[{index}] ({type_name}): payload is {len(data)} bytes, over the "
                    f"limit of {limit}; store large content elsewhere and "
                    "reference it, or raise max_payload_bytes"
                )
            event_id = self.ids()
            # An ASCII id (the usual case) costs three cheap tests; anything else the full check.
            if (
                not (type(event_id) is str and event_id and event_id.isascii())
                or "\x00" in event_id
            ):
                check_label(
                    f"events[{index}]: the id from ids()", event_id, empty=False, optional=False
                )
            prepared.append(
                NewEvent(
                    type_name,
                    data,
                    EventMeta(event_id, time, run_id, actor, idempotency_key, chans),
                )
            )
        return prepared

    async def append(
        self,
        stream: str,
        events: Event | RawEvent | Iterable[Event | RawEvent],
        *,
        expected_version: int | None = None,
        idempotency_key: str | None = None,
        run_id: str | None = None,
        actor: str | None = None,
        channels: Sequence[str] = ("main",),
    ) -> AppendResult:
        """Append events atomically to ``stream``; all get consecutive positions or none is written.

        Raises InvalidInputError/PayloadError for bad input, WrongExpectedVersionError,
        IdempotencyConflictError; nothing is written in any of these cases.
        """
        check_stream(stream)
        batch = [events] if isinstance(events, (Event, RawEvent)) else list(events)
        if not batch:
            raise InvalidInputError(f"append to {stream!r} got no events")
        if len(batch) > MAX_BATCH:
            raise InvalidInputError(
                f"append to {stream!r} got {len(batch)} events; the limit is {MAX_BATCH}"
            )
        if expected_version is not None and (
            not isinstance(expected_version, int)
            or isinstance(expected_version, bool)
            or expected_version < 0
        ):
            raise InvalidInputError(
                f"expected_version must be an int >= 0, got {expected_version!r}"
            )
        check_label("run_id", run_id)
        check_label("actor", actor)
        check_label("idempotency_key", idempotency_key, empty=False)
        prepared = self.prepare(
            batch, run_id=run_id, actor=actor, channels=channels, idempotency_key=idempotency_key
        )
        store = await self._ready()
        return await store.append(
            self.namespace,
            stream,
            prepared,
            expected_version=expected_version,
            idempotency_key=idempotency_key,
        )

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
        check_stream(stream)
        if limit is not None:
            check_limit(limit)
        store = await self._ready()
        return await store.read(
            self.namespace, stream, after=after, types=_type_names(types), limit=limit
        )

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
        check_stream(stream)
        check_limit(limit)
        store = await self._ready()
        return await store.latest(
            self.namespace, stream, _type_names(types) or (), before=before, limit=limit
        )

    async def head(self, stream: str) -> str | None:
        """The cursor of the stream's newest event (None when empty)."""
        check_stream(stream)
        return await (await self._ready()).head(self.namespace, stream)

    async def version(self, stream: str) -> int:
        check_stream(stream)
        return await (await self._ready()).version(self.namespace, stream)

    async def contains(self, stream: str, cursor: str) -> bool:
        check_stream(stream)
        return await (await self._ready()).contains(self.namespace, stream, cursor)

    async def delete_stream(self, stream: str) -> bool:
        check_stream(stream)
        return await (await self._ready()).delete_stream(self.namespace, stream)

    async def list_streams(
        self, *, prefix: str | None = None, limit: int | None = None
    ) -> tuple[StreamInfo, ...]:
        check_prefix(prefix)
        if limit is not None:
            check_limit(limit)
        return await (await self._ready()).list_streams(self.namespace, prefix=prefix, limit=limit)

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
        check_stream(stream)
        store = await self._ready()
        tail = store.subscribe(self.namespace, stream, after=after, poll_interval=poll_interval)
        # aclosing: closing this tail closes the store's at once (its listening connection).
        async with contextlib.aclosing(tail):  # type: ignore[type-var]
            async for event in tail:
                if resets or not isinstance(event, TailReset):
                    yield event

    # -- folds --------------------------------------------------------------------------------

    async def fold(self, fold: FoldBase[S], stream: str, *, run_id: str | None = None) -> S:
        """The fold's state over ``stream``: incremental, cached, read-only.

        Run-scoped folds need ``run_id`` and fold only that run's events.
        """
        check_stream(stream)
        await self._ready()
        return await self.folds.read(fold, self.namespace, stream, run_id=run_id)

    def end_run(self, stream: str, run_id: str) -> None:
        """Forget the run-scoped fold states of a run that ended."""
        self.folds.end_run(self.namespace, stream, run_id)

    async def compact(
        self,
        fold: FoldBase[S],
        stream: str,
        next: Callable[[S], Any] | None = None,
        *,
        view: Any = None,
        budget: float | None = None,
        keep_tokens: float | None = None,
        keep_from: Callable[..., int] | None = None,
        summarize: Callable[..., Any] | None = None,
    ) -> Any:
        """Compact a fold for good, as a checkpoint event.

        ``compact(F, stream, next)``: the state becomes ``next(state)`` (may be async); returns
        the state after. Policy form for segmented folds with a summary:
        ``compact(F, stream, view=, budget=, keep_tokens=, keep_from=, summarize=)`` compacts
        only when the view does not fit and ``split`` leaves older segments; returns
        :class:`~contextfold.views.CompactResult` ``(compacted, state, summarized)``.
        Raises FoldCompactionError and publishes nothing when it cannot.
        """
        check_stream(stream)
        await self._ready()

        async def append_checkpoint(event: RawEvent) -> Any:
            return await self.append(stream, event, channels=())

        if next is not None:
            if view is not None or summarize is not None:
                raise InvalidInputError(
                    "compact takes either next or the policy (view=, summarize=, …), not both"
                )
            return await self.folds.compact(
                fold, self.namespace, stream, next, append=append_checkpoint
            )
        if not isinstance(fold, SegmentedFold):
            raise TypeError(
                f"the policy form of compact needs a SegmentedFold, not {fold!r}: pass next"
            )
        if view is None or budget is None or summarize is None:
            raise TypeError("compact needs next, or view=, budget= and summarize=")
        from ..views.policy import compact_with_view
        from ..views.view import check_budget

        check_budget(budget)  # a ValueError before budget / 2 below can fail on a non-number
        return await compact_with_view(
            self.folds,
            fold,
            self.namespace,
            stream,
            view=view,
            budget=budget,
            keep_tokens=budget / 2 if keep_tokens is None else keep_tokens,
            keep_from=keep_from,
            summarize=summarize,
            append=append_checkpoint,
        )

    # -- requests -----------------------------------------------------------------------------

    async def rebuild_request(self, stream: str, offset: int) -> RenderedRequest:
        """The exact body of request @``offset`` (a RenderedRequest), rebuilt from the journal:
        the same bytes as when it was sent, whatever was appended after it."""
        from ..context.rebuild import rebuild_request

        check_stream(stream)
        return await rebuild_request(self, stream, offset)


def _type_names(types: Sequence[str | type[Event]] | None) -> tuple[str, ...] | None:
    if types is None:
        return None
    names = []
    for index, t in enumerate(types):
        if isinstance(t, str):
            names.append(check_text(f"types[{index}]", t))
        elif isinstance(t, type) and issubclass(t, Event) and t.event_type:
            names.append(t.event_type)
        else:
            raise InvalidInputError(f"types must hold type names or Event classes, got {t!r}")
    return tuple(names)


def open_journal(
    url: str = "sqlite:///contextfold.db", *, namespace: str = "default", **options: Any
) -> Journal:
    """Open the async journal at ``url``. The store connects on first use.

    Journal options (``max_payload_bytes``, ``clock``, ``ids``) are taken from ``options``;
    the rest go to the store (e.g. ``synchronous`` for SQLite, ``min_size`` for PostgreSQL).
    """
    journal_opts = {
        k: options.pop(k)
        for k in ("max_payload_bytes", "clock", "ids", "fold_cache")
        if k in options
    }
    return Journal(store_from_url(url, **options), namespace=namespace, **journal_opts)


class _LoopThread:
    """A private event loop on a daemon thread: where a SyncJournal and its namespace views
    run every call (the store's connections belong to that one loop)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="contextfold-sync", daemon=True
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it. When the waiting thread is interrupted
        (Ctrl-C), the call is cancelled on the loop and has ended before the interrupt
        propagates: nothing of it runs on unseen (a live tail would poll forever)."""
        finished = threading.Event()
        tasks: list[asyncio.Task[T]] = []

        def start() -> None:
            task = self.loop.create_task(coro)
            tasks.append(task)
            task.add_done_callback(lambda _: finished.set())

        self.loop.call_soon_threadsafe(start)
        try:
            finished.wait()
        except BaseException:
            # Queued after start, so the task exists when this runs.
            self.loop.call_soon_threadsafe(lambda: tasks[0].cancel())
            finished.wait()
            raise
        if tasks[0].cancelled():
            # Not asyncio's CancelledError (a BaseException) in a thread that has no loop:
            # the sync world's, an Exception, as concurrent.futures callers expect.
            raise concurrent.futures.CancelledError("the journal call was cancelled on its loop")
        return tasks[0].result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class SyncJournal:
    """The blocking facade for scripts: each call runs the async journal on a private loop.

    It adds no logic of its own; every method is the async one of the same name (a test
    checks that each public method of :class:`Journal` has its counterpart here).
    """

    def __init__(self, journal: Journal, *, _runner: _LoopThread | None = None) -> None:
        self.journal = journal
        self._runner = _runner if _runner is not None else _LoopThread()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.call(coro)

    @property
    def url(self) -> str:
        return self.journal.url

    @property
    def namespace(self) -> str:
        return self.journal.namespace

    def with_namespace(self, namespace: str) -> SyncJournal:
        """The same journal (store, loop, fold cache), scoped to another namespace. Like the
        async views, closing any view closes the shared store for all of them."""
        return SyncJournal(self.journal.with_namespace(namespace), _runner=self._runner)

    def __enter__(self) -> SyncJournal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._runner.loop.is_closed():
            return
        self._call(self.journal.close())
        self._runner.stop()

    def append(self, stream: str, events: Any, **kwargs: Any) -> AppendResult:
        return self._call(self.journal.append(stream, events, **kwargs))

    def read(self, stream: str, **kwargs: Any) -> ReadResult:
        return self._call(self.journal.read(stream, **kwargs))

    def read_all(self, stream: str, **kwargs: Any) -> Iterator[StoredEvent]:
        return self._iterate(self.journal.read_all(stream, **kwargs))

    def latest(
        self, stream: str, types: Sequence[str | type[Event]], **kwargs: Any
    ) -> tuple[StoredEvent, ...]:
        return self._call(self.journal.latest(stream, types, **kwargs))

    def head(self, stream: str) -> str | None:
        return self._call(self.journal.head(stream))

    def version(self, stream: str) -> int:
        return self._call(self.journal.version(stream))

    def contains(self, stream: str, cursor: str) -> bool:
        return self._call(self.journal.contains(stream, cursor))

    def delete_stream(self, stream: str) -> bool:
        return self._call(self.journal.delete_stream(stream))

    def list_streams(self, **kwargs: Any) -> tuple[StreamInfo, ...]:
        return self._call(self.journal.list_streams(**kwargs))

    def fold(self, fold: FoldBase[S], stream: str, **kwargs: Any) -> S:
        return self._call(self.journal.fold(fold, stream, **kwargs))

    def end_run(self, stream: str, run_id: str) -> None:
        # On the loop: the fold cache is only ever touched from the loop's thread.
        self._call(_run(self.journal.end_run, stream, run_id))

    def compact(self, fold: FoldBase[S], stream: str, next: Any = None, **kwargs: Any) -> Any:
        return self._call(self.journal.compact(fold, stream, next, **kwargs))

    def rebuild_request(self, stream: str, offset: int) -> RenderedRequest:
        return self._call(self.journal.rebuild_request(stream, offset))

    def subscribe(self, stream: str, **kwargs: Any) -> Iterator[StoredEvent]:
        return self._iterate(self.journal.subscribe(stream, **kwargs))

    def _iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        try:
            while True:
                try:
                    yield self._call(_anext(agen))
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(agen, "aclose", None)
            if aclose is not None and not self._runner.loop.is_closed():
                self._call(aclose())


async def _anext(agen: AsyncIterator[T]) -> T:
    return await agen.__anext__()


async def _run(fn: Callable[..., T], *args: Any) -> T:
    return fn(*args)


def open_journal_sync(url: str = "sqlite:///contextfold.db", **options: Any) -> SyncJournal:
    """Open the blocking journal at ``url`` (see :func:`open_journal`)."""
    return SyncJournal(open_journal(url, **options))
