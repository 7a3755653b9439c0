"""The journal API: opening retries after a failure, and the sync facade mirrors the async one."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import signal
import threading
from typing import Any

import pytest

import contextfold as cf
from contextfold.errors import StoreUnavailableError
from contextfold.journal import Journal, SyncJournal
from contextfold.store.base import ReadResult, TailReset
from contextfold.store.memory import MemoryStore


class Note(cf.Event, type="test-journal/note"):
    text: str


class FlakyStore(MemoryStore):
    """A store whose first ``failures`` opens fail, like a database that is still starting."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures
        self.opens = 0

    async def open(self) -> None:
        self.opens += 1
        if self.opens <= self.failures:
            raise StoreUnavailableError("the database is not up yet")
        await super().open()


async def test_a_failed_open_is_retried_on_the_next_call() -> None:
    store = FlakyStore(failures=2)
    journal = Journal(store)
    for _ in range(2):
        with pytest.raises(StoreUnavailableError, match="not up yet"):
            await journal.append("s", Note(text="lost"))
    done = await journal.append("s", Note(text="kept"))
    assert done.last_position == 1
    assert await journal.with_namespace("other").version("s") == 0  # views share the open
    assert store.opens == 3
    await journal.close()


def _public(cls: type) -> set[str]:
    return {name for name in vars(cls) if not name.startswith("_")}


def test_the_sync_journal_has_every_public_method_of_the_async_one() -> None:
    coroutines = {
        name
        for name, member in vars(Journal).items()
        if not name.startswith("_")
        and (inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member))
    }
    assert {"append", "rebuild_request", "contains", "head", "subscribe"} <= coroutines
    # prepare and folds are loop-free helpers, reachable as sync_journal.journal.prepare/.folds.
    assert _public(Journal) - {"prepare", "folds"} <= _public(SyncJournal)
    for name in coroutines:
        assert not inspect.iscoroutinefunction(getattr(SyncJournal, name)), name


def test_the_sync_journal_calls_through() -> None:
    with cf.open_journal_sync("memory://") as journal:
        done = journal.append("s", [Note(text="a"), Note(text="b")])
        assert journal.head("s") == done.cursor
        assert journal.contains("s", done.cursor)
        other = journal.with_namespace("tenant-2")
        assert other.namespace == "tenant-2" and other.url == journal.url
        assert not other.contains("s", done.cursor)
        other.append("s", Note(text="c"))
        assert [e.payload["text"] for e in other.read_all("s")] == ["c"]
        assert journal.version("s") == 2
        journal.end_run("s", "run-1")
        header = cf.RequestHeader(transport="openai-chat", model="m")
        request = journal.append(
            "agent",
            [cf.ContextAdded(role="user", content="hi"), cf.LlmRequestRequested(header=header)],
        )
        rebuilt = journal.rebuild_request("agent", request.last_position)
        assert rebuilt.transport == "openai-chat" and b"hi" in rebuilt.body


class Interrupted(BaseException):
    """What the test's signal handler raises: a KeyboardInterrupt stand-in pytest ignores."""


class WatchedStore(MemoryStore):
    """Tells a waiting thread when a tail re-reads: the caller is then blocked in next()."""

    def __init__(self) -> None:
        super().__init__()
        self.reread = threading.Event()

    async def read(self, namespace: str, stream: str, **kwargs: Any) -> ReadResult:
        if kwargs["after"] is not None:
            self.reread.set()
        return await super().read(namespace, stream, **kwargs)


def test_an_interrupted_sync_tail_raises_the_interrupt_and_ends_on_the_loop() -> None:
    def interrupt(signum: int, frame: object) -> None:
        raise Interrupted

    def interrupt_once_the_tail_polls(store: WatchedStore) -> None:
        store.reread.wait(30)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, interrupt)
    try:
        store = WatchedStore()
        with SyncJournal(Journal(store)) as journal:
            journal.append("s", Note(text="a"))
            tail = journal.subscribe("s", poll_interval=0.01)
            assert next(tail).payload["text"] == "a"
            helper = threading.Thread(target=interrupt_once_the_tail_polls, args=(store,))
            helper.start()
            with pytest.raises(Interrupted):  # not a RuntimeError from closing a running tail
                next(tail)
            helper.join()
            assert not store._wakeups._waiters  # the tail ended on the loop, not polling on
    finally:
        signal.signal(signal.SIGUSR1, previous)


class CancelledReads(MemoryStore):
    """A store whose reads end cancelled on their own (a driver closing under them)."""

    async def read(self, namespace: str, stream: str, **kwargs: Any) -> ReadResult:
        raise asyncio.CancelledError


def test_a_sync_call_cancelled_on_its_loop_raises_an_exception_not_a_base_exception() -> None:
    """Sync callers catch ``Exception``: a call that ends cancelled on the private loop (not
    by the caller's Ctrl-C) raises concurrent.futures.CancelledError, as futures do."""
    journal = SyncJournal(Journal(CancelledReads()))
    try:
        with pytest.raises(concurrent.futures.CancelledError, match="cancelled on its loop"):
            journal.read("s")
        assert journal.append("s", Note(text="still usable")).last_position == 1
    finally:
        journal.close()


@pytest.mark.parametrize("made", ["\ud800", "", "a\x00b", 7, None])
async def test_an_event_id_that_no_store_could_keep_is_refused(made: object) -> None:
    """The injected id factory is checked like any argument: a lone surrogate, an empty
    id, a NUL or a non-str never reaches a store (SQLite and PostgreSQL would choke)."""
    journal = Journal(MemoryStore(), ids=lambda: made)  # type: ignore[arg-type, return-value]
    with pytest.raises(cf.InvalidInputError, match=r"events\[0\]: the id from ids\(\)"):
        await journal.append("s", Note(text="lost"))
    assert await journal.version("s") == 0
    await journal.close()


async def test_a_prefix_that_is_not_a_str_is_refused() -> None:
    journal = Journal(MemoryStore())
    await journal.append("s", Note(text="a"))
    with pytest.raises(cf.InvalidInputError, match="prefix must be a str, got int"):
        await journal.list_streams(prefix=5)  # type: ignore[arg-type]
    assert [i.stream for i in await journal.list_streams(prefix="")] == ["s"]
    await journal.close()


def test_the_sync_tail_passes_resets_through() -> None:
    with cf.open_journal_sync("memory://") as journal:
        gone = journal.append("s", Note(text="old")).cursor
        journal.delete_stream("s")
        journal.append("s", Note(text="new"))
        tail = journal.subscribe("s", after=gone, resets=True)
        try:
            first, second = next(tail), next(tail)
        finally:
            tail.close()  # type: ignore[attr-defined]
    assert first == TailReset("s", gone)
    assert isinstance(second, cf.StoredEvent) and second.payload == {"text": "new"}
