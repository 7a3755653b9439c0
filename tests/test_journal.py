"""The journal API: every argument checked before a store sees it, opening retries after a
failure, and the sync facade mirrors the async one, signature for signature."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import signal
import threading
import unicodedata
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.errors import (
    InvalidCursorError,
    InvalidInputError,
    InvalidStreamNameError,
    PayloadError,
    StoreUnavailableError,
)
from contextfold.events import NewEvent
from contextfold.journal import Journal, SyncJournal
from contextfold.journal.encode import MAX_BATCH, MAX_META_CHARS, MAX_NAME_LENGTH, check_stream
from contextfold.server.body import parse_append
from contextfold.server.errors import RequestBodyError
from contextfold.store.base import MAX_LIMIT, ReadResult, TailReset
from contextfold.store.contract import ABSURD_CURSORS
from contextfold.store.memory import MemoryStore
from contextfold.store.sqlite import SQLiteStore
from contextfold.store.urls import open_store
from contextfold.testing import RecordingStore

LONE_SURROGATES: tuple[str, ...] = ("\ud800", "\udfff", "ok\udbffend")


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
    assert {"append", "checkpoint", "compact", "subscribe"} <= coroutines
    # folds is the loop-free fold reader, reachable as sync_journal.journal.folds.
    assert _public(Journal) - {"folds"} <= _public(SyncJournal)
    for name in coroutines:
        assert not inspect.iscoroutinefunction(getattr(SyncJournal, name)), name


def test_each_sync_method_takes_exactly_the_arguments_of_the_async_one() -> None:
    """Real signatures, not ``**kwargs``: mypy checks every call of the sync facade."""
    for name, member in vars(Journal).items():
        if name.startswith("_") or not callable(member):
            continue
        asynchronous = inspect.signature(member).parameters
        synchronous = inspect.signature(getattr(SyncJournal, name)).parameters
        assert [(p.name, p.kind, p.default, p.annotation) for p in asynchronous.values()] == [
            (p.name, p.kind, p.default, p.annotation) for p in synchronous.values()
        ], name
        kinds = {p.kind for p in synchronous.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds, name


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
        rebuilt = journal.run(cf.rebuild_request, "agent", request.last_position)
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
            assert not store.wakeups._waiters  # the tail ended on the loop, not polling on
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


# -- every argument is checked by the journal, before any store sees it ---------------------------


async def _refused(
    store: RecordingStore, calls: list[tuple[str, Awaitable[Any], type[Exception]]]
) -> None:
    """Each call raises its error naming what is wrong, and none reaches the store."""
    before = list(store.calls)
    for words, call, error in calls:
        with pytest.raises(error) as info:
            await call
        assert str(info.value).startswith(words), (words, str(info.value))
    assert store.calls == before, "a bad call reached the store"


async def test_bad_events_and_names_are_refused_and_nothing_is_lost() -> None:
    store = RecordingStore()
    j = Journal(store)
    await j.append("s", cf.RawEvent("e", {"keep": True}))
    e = cf.RawEvent("e", {})
    big = "y" * (j.max_payload_bytes + 1)
    await _refused(
        store,
        [
            ("stream name", j.append("", e), InvalidStreamNameError),
            ("stream name", j.append(" s", e), InvalidStreamNameError),
            ("stream name", j.append("a\nb", e), InvalidStreamNameError),
            ("stream name", j.append("x" * 600, e), InvalidStreamNameError),
            ("stream name", j.append(7, e), InvalidStreamNameError),  # type: ignore[arg-type]
            (
                "events[1] (e) payload",
                j.append("s", [e, cf.RawEvent("e", {"x": math.nan})]),
                PayloadError,
            ),
            (
                "events[0] (e) payload",
                j.append("s", cf.RawEvent("e", {"f": math.inf})),
                PayloadError,
            ),
            (
                "events[0] (e) payload",
                j.append("s", cf.RawEvent("e", {"o": object()})),
                PayloadError,
            ),
            (
                "events[0] (e) payload",
                j.append("s", cf.RawEvent("e", {"big": 2**70})),
                PayloadError,
            ),
            ("events[0] (e) payload", j.append("s", cf.RawEvent("e", {1: "key"})), PayloadError),
            (
                "events[0] (e): payload is",
                j.append("s", cf.RawEvent("e", {"x": big})),
                PayloadError,
            ),
            (
                "events[0]: raw event type",
                j.append("s", cf.RawEvent("bad type", {})),
                InvalidInputError,
            ),
            ("events[1] is a dict", j.append("s", [e, {"type": "e"}]), InvalidInputError),  # type: ignore[list-item]
            ("append to 's' got no events", j.append("s", []), InvalidInputError),
            ("append to 's' got 10001", j.append("s", [e] * (MAX_BATCH + 1)), InvalidInputError),
            ("expected_version", j.append("s", e, expected_version=-1), InvalidInputError),
            ("expected_version", j.append("s", e, expected_version=True), InvalidInputError),
            ("idempotency_key", j.append("s", e, idempotency_key=""), InvalidInputError),
            ("run_id", j.append("s", e, run_id="a\x00b"), InvalidInputError),
            ("channel ''", j.append("s", e, channels=("main", "")), InvalidInputError),
        ],
    )
    assert [ev.payload for ev in (await j.read("s")).events] == [{"keep": True}]
    await j.close()


async def test_limits_out_of_bounds_are_refused_naming_the_argument() -> None:
    store = RecordingStore()
    j = Journal(store)
    await j.append("s", [cf.RawEvent("e", {"i": i}) for i in range(3)])
    for bad in (0, -1, MAX_LIMIT + 1, 2**63, 2**70, True, 1.5, "2"):
        words = f"limit must be an int from 1 to {MAX_LIMIT}, got {bad!r}"
        await _refused(
            store,
            [
                (words, j.read("s", limit=bad), InvalidInputError),  # type: ignore[arg-type]
                (words, j.latest("s", ["e"], limit=bad), InvalidInputError),  # type: ignore[arg-type]
                (words, j.list_streams(limit=bad), InvalidInputError),  # type: ignore[arg-type]
                ("page_size", anext(j.read_all("s", page_size=bad)), InvalidInputError),  # type: ignore[arg-type]
            ],
        )
    assert len((await j.read("s", limit=MAX_LIMIT)).events) == 3  # the bounds themselves pass
    assert [ev.position for ev in (await j.read("s", limit=1)).events] == [1]
    await j.close()


async def test_lone_surrogates_are_refused_naming_the_argument() -> None:
    store = RecordingStore()
    j = Journal(store)
    await j.append("s", cf.RawEvent("e", {"keep": True}))
    ok = cf.RawEvent("e", {})
    for bad in LONE_SURROGATES:
        await _refused(
            store,
            [
                ("stream name", j.append("s" + bad, ok), InvalidInputError),
                ("stream name", j.read(bad), InvalidInputError),
                ("stream name", j.version(bad), InvalidInputError),
                ("stream name", j.delete_stream(bad), InvalidInputError),
                ("run_id", j.append("s", ok, run_id=bad), InvalidInputError),
                ("actor", j.append("s", ok, actor=bad), InvalidInputError),
                ("idempotency_key", j.append("s", ok, idempotency_key=bad), InvalidInputError),
                ("channels[1]", j.append("s", ok, channels=("main", bad)), InvalidInputError),
                ("prefix", j.list_streams(prefix=bad), InvalidInputError),
                ("after", j.list_streams(after="s" + bad), InvalidInputError),
                ("types[1]", j.read("s", types=["e", bad]), InvalidInputError),
                ("types[0]", j.latest("s", [bad]), InvalidInputError),
                ("stream name", anext(j.subscribe(bad)), InvalidInputError),
            ],
        )
        with pytest.raises(InvalidInputError, match=r"^namespace .*surrogate"):
            j.with_namespace("ns" + bad)
    assert [ev.payload for ev in (await j.read("s")).events] == [{"keep": True}]
    await j.close()


@pytest.mark.parametrize("name", ["idempotency_key", "run_id", "actor"])
async def test_meta_strings_are_bounded_in_the_library_as_over_http(name: str) -> None:
    """An append copies its key, run id and actor into every one of its events: each is at
    most MAX_META_CHARS characters, whoever appends, refused with one message."""
    store = RecordingStore()
    j = Journal(store)
    notes = [cf.RawEvent("e", {"i": i}) for i in range(100)]
    over = "k" * (MAX_META_CHARS + 1)
    given: dict[str, Any] = {name: over}
    words = f"{name} is {len(over)} characters, over the limit of {MAX_META_CHARS}"
    await _refused(store, [(words, j.append("s", notes, **given), InvalidInputError)])
    with pytest.raises(InvalidInputError, match=words) as refused:
        await j.append("s", notes, **given)
    # The HTTP server refuses the same body with the same words, the field quoted.
    body = {"events": [{"type": "e", "payload": {}}], name: over}
    with pytest.raises(RequestBodyError) as http:
        parse_append(body)
    assert str(http.value) == f'"{name}"' + str(refused.value).removeprefix(name)
    if name != "idempotency_key":  # an encoded event carries its own run id and actor
        [made] = j.encode(cf.RawEvent("e", {}))
        bad = NewEvent(made.type, made.data, made.meta._replace(**given))
        with pytest.raises(InvalidInputError, match=rf"events\[0\]: meta\.{name} is 201"):
            await j.append("s", bad)
        with pytest.raises(InvalidInputError, match=words):
            j.encode(cf.RawEvent("e", {}), **given)
    fits: dict[str, Any] = {name: "k" * MAX_META_CHARS}
    assert (await j.append("s", notes, **fits)).last_position == 100
    await j.close()


# Unicode's default-ignorable code points outside the control and format categories.
_IGNORABLE = frozenset(
    "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u2065\u3164\uffa0"
    + "".join(map(chr, [*range(0xFE00, 0xFE10), *range(0xFFF0, 0xFFF9), *range(0xE0000, 0xE1000)]))
)


def _stream_name_rule(name: str) -> bool:
    """The documented rule for stream names, written out plainly."""
    return (
        bool(name)
        and name.strip() == name
        and len(name) <= MAX_NAME_LENGTH
        and not any(unicodedata.category(ch) in {"Cc", "Cf", "Zl", "Zp", "Cs"} for ch in name)
        and not any(ch in _IGNORABLE for ch in name)
    )


@settings(max_examples=300)
@given(st.text(alphabet=st.characters(exclude_categories=()), max_size=8) | st.text(max_size=600))
def test_a_stream_name_passes_exactly_when_the_rule_allows_it(name: str) -> None:
    try:
        assert check_stream(name) == name
    except InvalidStreamNameError:
        assert not _stream_name_rule(name)
    else:
        assert _stream_name_rule(name)


class _PosingChannel:
    """Not a str, yet equal to "main" and hashed like it."""

    def __eq__(self, other: object) -> bool:
        return other == "main"

    def __hash__(self) -> int:
        return hash("main")


async def test_a_channel_that_only_poses_as_a_checked_one_is_refused() -> None:
    store = RecordingStore()
    j = Journal(store)
    await j.append("s", cf.RawEvent("e", {"keep": True}), channels=("main",))
    posing = (_PosingChannel(),)
    await _refused(
        store,
        [("channel", j.append("s", cf.RawEvent("e", {}), channels=posing), InvalidInputError)],  # type: ignore[arg-type]
    )
    assert len((await j.read("s")).events) == 1
    await j.close()


async def test_a_cursor_that_is_not_a_str_is_refused_and_an_unknown_one_resets() -> None:
    store = RecordingStore()
    j = Journal(store)
    done = await j.append("s", cf.RawEvent("e", {}))
    await _refused(
        store,
        [
            ("after must be a str", j.read("s", after=7), InvalidCursorError),  # type: ignore[arg-type]
            ("before must be a str", j.latest("s", ["e"], before=7), InvalidCursorError),  # type: ignore[arg-type]
            ("cursor must be a str", j.contains("s", None), InvalidCursorError),  # type: ignore[arg-type]
            ("after must be a str", anext(j.subscribe("s", after=b"1")), InvalidCursorError),  # type: ignore[call-overload]
        ],
    )
    for cursor in ABSURD_CURSORS:  # a str no store handed out: an unknown cursor, not an error
        page = await j.read("s", after=cursor)
        assert page.reset and [ev.cursor for ev in page.events] == [done.cursor]
    await j.close()


async def test_a_tail_without_resets_follows_the_new_history_silently() -> None:
    """The default tail yields only events: the journal drops the store's TailReset."""
    j = cf.open_journal("memory://")
    first = await j.append("s", cf.RawEvent("e", {"gen": 1}))
    tail = j.subscribe("s", after=first.cursor, poll_interval=0.02)
    try:
        await j.delete_stream("s")
        await j.append("s", [cf.RawEvent("e", {"gen": 2}), cf.RawEvent("e", {"gen": 3})])
        async with asyncio.timeout(10):
            got = [await anext(tail), await anext(tail)]
    finally:
        await tail.aclose()  # type: ignore[attr-defined]
    assert [(ev.position, ev.payload["gen"]) for ev in got] == [(1, 2), (2, 3)]
    await j.close()


def test_the_journal_options_are_checked() -> None:
    with pytest.raises(InvalidInputError, match="max_payload_bytes must be a positive int"):
        Journal(MemoryStore(), max_payload_bytes=0)
    with pytest.raises(InvalidInputError, match="namespace must be a non-empty str"):
        Journal(MemoryStore(), namespace="")


def test_a_url_names_its_store_and_the_memory_store_takes_no_options(tmp_path: Path) -> None:
    assert isinstance(open_store("memory://"), MemoryStore)
    assert isinstance(open_store(f"sqlite:///{tmp_path}/j.db"), SQLiteStore)
    with pytest.raises(
        InvalidInputError, match="the memory store takes no options, got synchronous"
    ):
        open_store("memory://", synchronous="FULL")
    with pytest.raises(InvalidInputError, match="unknown journal URL 'mysql://x'"):
        cf.open_journal("mysql://x")
    journal = cf.open_journal(f"sqlite:///{tmp_path}/k.db", synchronous="FULL", namespace="n")
    assert journal.namespace == "n" and journal.url.endswith("k.db")


class Said(cf.Event, type="test-journal/said"):
    text: str


SAID = cf.SegmentedFold("test_journal_said", data=str, summary=str, tag=None)
SAID.open(Said)(lambda ev: cf.Segment(f"s{ev.position}", ev.payload.text))


def test_the_sync_journal_checkpoints_and_compacts() -> None:
    view = cf.ContextView(SAID, count=lambda segment: 10)
    with cf.open_journal_sync("memory://") as journal:
        journal.append("s", [Said(text=t) for t in "abcd"])
        done = journal.compact(
            SAID, "s", view=view, budget=30, summarize=lambda **kw: f"{len(kw['older'])}"
        )
        assert (done.compacted, done.summarized, done.state.summary) == (True, 3, "3")
        kept = journal.checkpoint(
            SAID, "s", lambda state: cf.SegmentedState([], f"{state.summary}+")
        )
        assert kept.summary == "3+" and journal.fold(SAID, "s") == kept


async def test_all_streams_goes_through_every_page_of_the_listing() -> None:
    """Page after page (here of 2): every stream by name, the prefix kept on each page."""
    store = RecordingStore()
    j = Journal(store)
    names = [f"chat/{n}" for n in range(5)]
    for name in [*names, "notes"]:
        await j.append(name, cf.RawEvent("note", {}))
    assert [i.stream async for i in j.all_streams(prefix="chat/", page_size=2)] == names
    listed = store.of("list_streams")
    assert [(c.args["prefix"], c.args["limit"], c.args["after"]) for c in listed] == [
        ("chat/", 2, None),
        ("chat/", 2, "chat/1"),
        ("chat/", 2, "chat/3"),
    ]
    assert [i.stream async for i in j.all_streams()] == [*names, "notes"]
    for bad in (0, MAX_LIMIT + 1):
        with pytest.raises(InvalidInputError, match="page_size"):
            [i async for i in j.all_streams(page_size=bad)]
