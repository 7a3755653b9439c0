"""Cheap leased turns: a claim reads the stream's version and its lease and nothing else
(nothing at all given the view its worker just read); a release says the stream is idle
only when nobody appended since its holder last looked; a worker skips a stream handed
back idle with nothing appended since, reading only its lease; and whatever the interleaving,
a lazy claim made from a view lands only if no other claim landed after that view."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold.context.events import ContextAdded, LlmResponse
from contextfold.errors import LeaseHeldError, LeaseLostError
from contextfold.events import NewEvent, StoredEvent
from contextfold.journal import Journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.lease import (
    LeaseRecord,
    StreamLease,
    StreamLeased,
    claim_lease,
    read_lease,
    view_lease,
)
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.worker import Worker
from contextfold.store.base import AppendResult, ReadResult
from contextfold.store.memory import MemoryStore

STREAM = "agents/lease-reads"


class Recording(MemoryStore):
    """A memory store noting every call that reaches it, as (method, stream)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    async def append(
        self, namespace: str, stream: str, events: Sequence[NewEvent], **options: Any
    ) -> AppendResult:
        self.calls.append(("append", stream))
        return await super().append(namespace, stream, events, **options)

    async def read(self, namespace: str, stream: str, **options: Any) -> ReadResult:
        self.calls.append(("read", stream))
        return await super().read(namespace, stream, **options)

    async def latest(
        self, namespace: str, stream: str, types: Sequence[str], **options: Any
    ) -> tuple[StoredEvent, ...]:
        self.calls.append(("latest", stream))
        return await super().latest(namespace, stream, types, **options)

    async def head(self, namespace: str, stream: str) -> str | None:
        self.calls.append(("head", stream))
        return await super().head(namespace, stream)

    async def version(self, namespace: str, stream: str) -> int:
        self.calls.append(("version", stream))
        return await super().version(namespace, stream)


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def user(text: str) -> ContextAdded:
    return ContextAdded(role="user", content=text)


async def _eventually(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait until ``check()`` holds (a bound against a hang, not a timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while not await check():
        assert loop.time() < deadline, f"never happened: {what}"
        await asyncio.sleep(0.01)


async def test_a_claim_reads_the_version_the_lease_and_the_head_and_nothing_else() -> None:
    store = Recording()
    journal = Journal(store)
    await journal.append(STREAM, user("hi"))
    store.calls.clear()
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=10, lazy=True)
    # The head after the version: a stream made again to that version has another one.
    assert store.calls == [("version", STREAM), ("latest", STREAM), ("head", STREAM)]
    await lease.journal.append(STREAM, user("lands the claim"))
    await lease.release()
    view = await view_lease(journal, STREAM)
    assert view.lease is not None and view.version == view.lease.position == 4
    assert view.head == view.lease.cursor  # the release is the newest event
    store.calls.clear()
    again = await claim_lease(journal, STREAM, holder="w2", ttl=10, lazy=True, view=view)
    assert store.calls == [] and again.pending and again.version == 4


async def test_a_lease_newer_than_the_version_read_is_the_view_s_version() -> None:
    journal = Journal(MemoryStore())
    await journal.append(STREAM, user("hi"))
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=10)
    view = await view_lease(journal, STREAM, version=1)  # read before the claim landed
    assert view.lease is not None and view.lease.token == lease.token
    assert view.version == 2 and view.cursor == view.lease.cursor


async def test_a_release_says_idle_only_when_nobody_appended_since() -> None:
    journal = Journal(MemoryStore())
    await journal.append(STREAM, user("hi"))
    quiet = await claim_lease(journal, STREAM, holder="w1", ttl=10, lazy=True)
    await quiet.journal.append(STREAM, user("answered"))
    await quiet.release(idle=True)
    record = await read_lease(journal, STREAM)
    assert record is not None and record.idle and record.state == "released"
    assert (await view_lease(journal, STREAM)).settled
    await journal.append(STREAM, user("a later question"))
    assert not (await view_lease(journal, STREAM)).settled  # the idle release is not newest
    busy = await claim_lease(journal, STREAM, holder="w2", ttl=10, lazy=True)
    await busy.journal.append(STREAM, user("answered too"))
    await journal.append(STREAM, user("a new question meanwhile"))
    await busy.release(idle=True)
    record = await read_lease(journal, STREAM)
    assert record is not None and record.state == "released" and not record.idle
    assert record.position == await journal.version(STREAM) == 9
    assert not (await view_lease(journal, STREAM)).settled


async def test_a_worker_skips_a_stream_another_handed_back_idle_reading_only_its_lease() -> None:
    store = Recording()
    first, second = Journal(store), Journal(store)  # two processes' caches, one database
    app = _echo()
    await first.append(STREAM, [system_prompt("You answer."), user("question")])
    async with _running(Worker(first, app, poll_interval=0.01)):
        await _eventually(lambda: _answered(first), "the first worker answers")
    record = await read_lease(first, STREAM)
    assert record is not None and record.idle
    store.calls.clear()
    other = Worker(second, app, poll_interval=0.01)
    async with _running(other):
        await _eventually(lambda: _looked(store), "the second worker looks at the lease")
    # The version is the scan's: the lease is the one read.
    assert [call for call in store.calls if call[1] == STREAM] == [("latest", STREAM)]
    assert other.stats.claims == 0


async def test_a_watched_lease_takes_its_own_appends_head_for_the_streams() -> None:
    """A lease whose holder hears of every change of the stream (a worker's notifications)
    folds on its journal with no head check after its own append, until it hears of a newer
    change; an unwatched lease, or one that may have missed some, asks the store."""
    from contextfold.context.projection import AgentContext

    store = Recording()
    journal = Journal(store)
    await journal.append(STREAM, [system_prompt("You answer."), user("hi")])
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=10, lazy=True)
    fenced = lease.journal
    await fenced.fold(AgentContext, STREAM)
    await fenced.append(STREAM, user("mine"))
    assert lease.known_head is None  # not watched
    store.calls.clear()
    await fenced.fold(AgentContext, STREAM)
    assert store.calls == [("head", STREAM)]
    lease.watch()
    done = await fenced.append(STREAM, user("mine too"))
    assert lease.known_head == done.cursor
    lease.heard(done.version, int(done.cursor))  # its own append's notification
    store.calls.clear()
    state = await fenced.fold(AgentContext, STREAM)
    assert store.calls == [] and state.history[-1].content == "mine too"
    other = await Journal(store).append(STREAM, user("another writer's"))  # its own cache
    lease.heard(other.version, int(other.cursor))
    assert lease.known_head is None
    store.calls.clear()
    state = await fenced.fold(AgentContext, STREAM)
    assert state.history[-1].content == "another writer's"
    assert ("read", STREAM) in store.calls
    await fenced.append(STREAM, user("caught up"))
    assert lease.known_head is not None  # its append came after what it heard of
    lease.heard(None, None)  # a notification that did not say, or a listener lost
    await fenced.append(STREAM, user("once more"))
    assert lease.known_head is None  # for the rest of this claim
    await lease.release()
    assert lease.known_head is None
    # Watched from its claim with the head a notification named: known before any append.
    head = await journal.head(STREAM)
    again = await claim_lease(journal, STREAM, holder="w1", ttl=10, lazy=True)
    again.watch(head)
    assert again.known_head == head
    store.calls.clear()
    await again.journal.fold(AgentContext, STREAM)  # read at that head already
    assert store.calls == []
    again.heard(again.version + 1, int(head or 0) + 1)
    assert again.known_head is None and again.known is None
    # Watched with no head named: the claim's look read it after the version, so a state
    # at the claim's head is current; a change heard of at another head ends that (at the
    # same version too: the stream was deleted and made again).
    await Journal(store).append(STREAM, user("another question"))
    third = await claim_lease(journal, STREAM, holder="w1", ttl=10, lazy=True)
    third.watch()
    head = await journal.head(STREAM)
    assert head is not None and third.known == (third.version, head)
    await journal.fold(AgentContext, STREAM)  # read up to it
    store.calls.clear()
    await third.journal.fold(AgentContext, STREAM)
    assert store.calls == []
    third.heard(third.version, int(head))  # the change it was claimed at: nothing new
    assert third.known == (third.version, head)
    third.heard(third.version, int(head) + 10**6)
    assert third.known is None


def _echo() -> Callable[[Journal, str], Agent]:
    model = FunctionModel(lambda request: "ok")
    return lambda journal, stream: Agent(journal, stream, model)


async def _answered(journal: Journal) -> bool:
    record = await read_lease(journal, STREAM)
    released = record is not None and record.state == "released"
    return released and bool(await journal.latest(STREAM, [LlmResponse]))


async def _looked(store: Recording) -> bool:
    return ("latest", STREAM) in store.calls


@contextlib.asynccontextmanager
async def _running(worker: Worker) -> Any:
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, 60)


Op = tuple[str, int]
OPS = st.lists(
    st.sampled_from(
        [
            *[(op, n) for op in ("claim", "lazy", "append", "release", "idle") for n in (0, 1)],
            ("append", 0),
            ("append", 1),
            ("external", 0),
            ("advance", 4),
            ("advance", 11),  # past the ttl of 10
        ]
    ),
    min_size=4,
    max_size=30,
)


@settings(max_examples=500, deadline=None)
@given(ops=OPS)
def test_claims_from_views_and_idle_releases_keep_one_holder(ops: list[Op]) -> None:
    """Any interleaving of claims (landed, or lazy from a view), holder appends, releases
    (idle or not), other writers and time: a holder's append lands if and only if its claim
    is the newest lease event and held, or is still pending and no lease event landed
    after its view; every append lands after its own claim; an idle release comes right
    after an event of its own claim."""

    async def run() -> None:
        clock = Clock()
        journal = Journal(MemoryStore(), clock=clock)
        await journal.append(STREAM, user("hi"))
        leases: dict[int, StreamLease] = {}
        seen: dict[int, LeaseRecord | None] = {}  # the lease a lazy claim's view saw
        for op, arg in ops:
            if op in ("claim", "lazy"):
                view = await view_lease(journal, STREAM)
                with contextlib.suppress(LeaseHeldError):
                    lazy = op == "lazy"
                    leases[arg] = await claim_lease(
                        journal, STREAM, holder=f"w{arg}", ttl=10, lazy=lazy, view=view
                    )
                    seen[arg] = view.lease
            elif op == "advance":
                clock.advance(arg)
            elif op == "external":
                await journal.append(STREAM, user("someone else"))
            elif arg in leases:
                lease = leases[arg]
                if op in ("release", "idle"):
                    await lease.release(idle=op == "idle")
                    continue
                current = await read_lease(journal, STREAM)
                if not lease.active:
                    holds = False
                elif lease.pending:
                    before = seen[arg]
                    holds = (current.position if current else 0) == (
                        before.position if before else 0
                    )
                else:
                    holds = (
                        current is not None
                        and current.token == lease.token
                        and current.state == "held"
                    )
                try:
                    await lease.journal.append(STREAM, user(f"by {lease.token}"))
                    landed = True
                except LeaseLostError:
                    landed = False
                assert landed == holds, (op, arg, current, lease.token)
        token, previous, landing = None, None, None
        async for stored in journal.read_all(STREAM):
            event = stored.decode()
            if isinstance(event, StreamLeased):
                # A lazy claim lands last in its holder's first append.
                assert landing in (None, event.token), "an append before another's claim"
                if event.idle:
                    assert previous == event.token, "an idle release after another's event"
                token = previous = event.token
                landing = None
            elif isinstance(event, ContextAdded) and event.content.startswith("by "):
                assert landing is None
                by = event.content.removeprefix("by ")
                if by != token:
                    landing = by
                previous = by
            else:
                assert landing is None
                previous = None
        assert landing is None

    asyncio.run(run())
