"""The blocking facade for scripts: every call runs the async journal on a private loop.

:class:`SyncJournal` adds no logic: each method has the signature of the async one of the
same name and calls it (a test checks that every public method of :class:`Journal` has its
counterpart here), so checks, encoding and errors are the journal's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Sequence,
)
from typing import Any, Concatenate, Literal, ParamSpec, TypeVar, overload

from ..events import Event, NewEvent, RawEvent, StoredEvent
from ..folds.fold import FoldBase
from ..folds.reader import FoldCache
from ..folds.segmented import SegmentedFold
from ..store.base import MAX_LIMIT, AppendResult, ReadResult, StreamChange, StreamInfo, TailReset
from ..views.strategies import KeepFrom
from ..views.view import ContextView
from .compaction import CompactionResult, Summarize
from .encode import DEFAULT_MAX_PAYLOAD_BYTES, Clock, IdFactory
from .journal import Journal, StreamFence, new_event_id, open_journal, utc_now

__all__ = ["SyncJournal", "open_journal_sync"]

T = TypeVar("T")
S = TypeVar("S")
P = ParamSpec("P")


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
    """The blocking journal: the methods of :class:`Journal`, each waiting for its result."""

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

    @property
    def fence(self) -> StreamFence | None:
        return self.journal.fence

    def fenced(self, fence: StreamFence) -> SyncJournal:
        """This journal with one stream's appends fenced (see :meth:`Journal.fenced`): the
        fence runs on this facade's loop."""
        return SyncJournal(self.journal.fenced(fence), _runner=self._runner)

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

    def encode(
        self,
        events: Event | RawEvent | Iterable[Event | RawEvent],
        *,
        run_id: str | None = None,
        actor: str | None = None,
        channels: Sequence[str] = ("main",),
    ) -> tuple[NewEvent, ...]:
        return self.journal.encode(events, run_id=run_id, actor=actor, channels=channels)

    def append(
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
        return self._call(
            self.journal.append(
                stream,
                events,
                expected_version=expected_version,
                idempotency_key=idempotency_key,
                run_id=run_id,
                actor=actor,
                channels=channels,
            )
        )

    def read(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        limit: int | None = None,
    ) -> ReadResult:
        return self._call(self.journal.read(stream, after=after, types=types, limit=limit))

    def read_all(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        page_size: int = 1000,
    ) -> Iterator[StoredEvent]:
        return self._iterate(
            self.journal.read_all(stream, after=after, types=types, page_size=page_size)
        )

    def latest(
        self,
        stream: str,
        types: Sequence[str | type[Event]],
        *,
        before: str | None = None,
        limit: int = 1,
    ) -> tuple[StoredEvent, ...]:
        return self._call(self.journal.latest(stream, types, before=before, limit=limit))

    def latest_at_head(
        self, stream: str, types: Sequence[str | type[Event]]
    ) -> tuple[int, str | None, StoredEvent | None] | None:
        return self._call(self.journal.latest_at_head(stream, types))

    def change_key(self, stream: str) -> str | None:
        return self.journal.change_key(stream)

    def listen_changes(self) -> contextlib.AbstractContextManager[Iterator[StreamChange]] | None:
        listening = self.journal.listen_changes()
        return None if listening is None else self._listening(listening)

    @contextlib.contextmanager
    def _listening(
        self, listening: contextlib.AbstractAsyncContextManager[AsyncIterator[StreamChange]]
    ) -> Iterator[Iterator[StreamChange]]:
        changes = self._iterate(self._call(_enter(listening)))
        try:
            yield changes
        finally:
            changes.close()  # its own first (the async iterator's), then the listening
            self._call(_exit(listening))

    def head(self, stream: str) -> str | None:
        return self._call(self.journal.head(stream))

    def version(self, stream: str) -> int:
        return self._call(self.journal.version(stream))

    def contains(self, stream: str, cursor: str) -> bool:
        return self._call(self.journal.contains(stream, cursor))

    def delete_stream(self, stream: str) -> bool:
        return self._call(self.journal.delete_stream(stream))

    def list_streams(
        self, *, prefix: str | None = None, limit: int | None = None, after: str | None = None
    ) -> tuple[StreamInfo, ...]:
        return self._call(self.journal.list_streams(prefix=prefix, limit=limit, after=after))

    def all_streams(
        self, *, prefix: str | None = None, page_size: int = MAX_LIMIT
    ) -> Iterator[StreamInfo]:
        return self._iterate(self.journal.all_streams(prefix=prefix, page_size=page_size))

    @overload
    def subscribe(
        self,
        stream: str,
        *,
        after: str | None = None,
        poll_interval: float = 0.05,
        resets: Literal[False] = False,
    ) -> Iterator[StoredEvent]: ...

    @overload
    def subscribe(
        self, stream: str, *, after: str | None = None, poll_interval: float = 0.05, resets: bool
    ) -> Iterator[StoredEvent | TailReset]: ...

    def subscribe(
        self,
        stream: str,
        *,
        after: str | None = None,
        poll_interval: float = 0.05,
        resets: bool = False,
    ) -> Iterator[StoredEvent | TailReset]:
        return self._iterate(
            self.journal.subscribe(stream, after=after, poll_interval=poll_interval, resets=resets)
        )

    def fold(self, fold: FoldBase[S], stream: str, *, run_id: str | None = None) -> S:
        return self._call(self.journal.fold(fold, stream, run_id=run_id))

    def fold_pair(self, first: FoldBase[S], second: FoldBase[T], stream: str) -> tuple[S, T]:
        return self._call(self.journal.fold_pair(first, second, stream))

    def end_run(self, stream: str, run_id: str) -> None:
        # On the loop: the fold cache is only ever touched from the loop's thread.
        self._call(_run(self.journal.end_run, stream, run_id))

    def checkpoint(
        self, fold: FoldBase[S], stream: str, next: Callable[[S], S | Awaitable[S]]
    ) -> S:
        return self._call(self.journal.checkpoint(fold, stream, next))

    def compact(
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
        return self._call(
            self.journal.compact(
                fold,
                stream,
                view=view,
                budget=budget,
                summarize=summarize,
                keep_tokens=keep_tokens,
                keep_from=keep_from,
            )
        )

    def run(
        self,
        fn: Callable[Concatenate[Journal, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``fn(journal, *args, **kwargs)`` with the async journal, run on this facade's loop:
        how a script calls the functions that take a journal (``journal.run(cf.rebuild_request,
        "chat", 3)``). Its result or its error is the call's."""

        async def call() -> T:
            return await fn(self.journal, *args, **kwargs)

        return self._call(call())

    def _iterate(self, agen: AsyncIterator[T]) -> Generator[T, None, None]:
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


async def _enter(context: contextlib.AbstractAsyncContextManager[T]) -> T:
    return await context.__aenter__()


async def _exit(context: contextlib.AbstractAsyncContextManager[Any]) -> None:
    await context.__aexit__(None, None, None)


async def _run(fn: Callable[[str, str], None], *args: str) -> None:
    fn(*args)


def open_journal_sync(
    url: str = "sqlite:///contextfold.db",
    *,
    namespace: str = "default",
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    clock: Clock = utc_now,
    ids: IdFactory = new_event_id,
    fold_cache: FoldCache | None = None,
    young_collections: bool = True,
    **store_options: Any,
) -> SyncJournal:
    """Open the blocking journal at ``url`` (see :func:`~contextfold.open_journal`)."""
    return SyncJournal(
        open_journal(
            url,
            namespace=namespace,
            max_payload_bytes=max_payload_bytes,
            clock=clock,
            ids=ids,
            fold_cache=fold_cache,
            young_collections=young_collections,
            **store_options,
        )
    )
