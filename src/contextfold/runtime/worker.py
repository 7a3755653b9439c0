"""A worker pool: serve every stream of a namespace that has something to do.

A :class:`Worker` watches one namespace of a journal, finds the streams whose scheduler
has work (a trigger, an unanswered request, tool calls to answer), claims each by lease
(:mod:`.lease`) and runs the agent its ``app`` factory builds there, at most
``concurrency`` streams at a time. Any number of workers, in any processes on any hosts,
can serve one namespace: the lease keeps each stream to one of them at a time.

Finding work. On PostgreSQL the worker listens to the store's push channel (its
notifications: :meth:`Journal.listen_changes`), where every append names its stream (by a
key the worker maps back to the name), so a stream is looked at as soon as it changes; the
stream list is read again every ``rescan_interval`` seconds to catch a lost notification.
On SQLite and in memory it reads the stream list every ``poll_interval`` seconds and looks
at the streams whose version moved. A stream leased to another instance is looked at again
when that lease lapses, or shortly after the stream changes (its holder may have handed it
back), reading nothing but its lease. One another instance handed back is left to it once
it has work again (it hears of the change too, and has the stream's folds in memory:
workers racing for every trigger would read and build requests for nothing): for ``defer``
seconds, or, when the hand-back said that worker comes back (idle, or a turn given up to
waiting streams), while a lease of it a look read has not expired, up to ``ttl``, so a
worker slowed down by load keeps its streams rather than have them raced. Then any worker
claims it: the streams of a worker that is gone move on. A claim is lazy (it lands with the
agent's first append, and one whose agent finds nothing to do writes nothing) unless
another instance had the stream: then it lands before the agent reads or builds anything,
and a race costs the loser a failed append. A change is heard of with the stream's version
(and, notified, its head), so one a run left nothing to do after (the worker's own appends,
heard after they landed) costs no read at all, and a look at a stream reads only its lease
(on PostgreSQL with its version and head, in one statement: a version alone may be that of
an old history, the stream deleted and made again).

Fairness: streams wait in one first-in, first-out queue; a stream that keeps its agent
busy gives its slot up after ``quantum`` steps while others wait, and queues at the end.
What the worker knows of a stream is one record (``_worker_state.StreamStatus``): where it
stands (idle, queued, running, blocked) and what goes with that state.

Failures never end the worker. A provider error (any error of the agent, or of the factory)
hands the lease back as a backoff: nobody works that stream for a pause that doubles with
each failure in a row, up to ``max_backoff`` (an error before the claim landed, the agent's
first append, leaves the journal alone: this worker alone rests). A store error (the
database down or restarting) pauses that stream, and the stream scan retries with a growing
pause; the listener reconnects. A lost lease ends that stream's run: another instance has
it.

Shutdown: :meth:`stop` (SIGTERM, for the CLI) stops claiming; each agent ends after the
step in progress and hands its lease back. Agents still running after ``grace`` seconds are
cancelled and hand their lease back too, so another worker takes over at once (an
interrupted request is re-sent there, byte for byte, as a recorded retry).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from .._aio import finish
from ..context.state import AgentContextState
from ..errors import (
    ConfigurationError,
    ConflictError,
    LeaseHeldError,
    LeaseLostError,
    ModelError,
    StoreError,
    UsageError,
)
from ..journal import Journal
from ..store.base import MAX_LIMIT, StreamChange, parse_cursor, wait_or_timeout
from ._worker_state import ChangeKeys, Holders, Mark, Streams, StreamStatus, WorkerStats
from .lease import LEASE_TTL, LeaseRecord, StreamLease, claim_lease, new_holder, view_lease
from .loop import Agent
from .scheduling import Scheduler, TurnBudgets, decide

__all__ = ["AgentFactory", "Worker", "WorkerStats"]

log = logging.getLogger("contextfold.runtime")

AgentFactory = Callable[[Journal, str], Agent | Awaitable[Agent]]
"""``app(journal, stream)``: the agent of a stream, ``cf.Agent(journal, stream, model, ...)``
built on the journal it is given (its appends are fenced by the worker's lease)."""

_RECHECK = 0.1  # seconds after a change before a stream leased elsewhere is looked at again
_STORE_PAUSE = 1.0  # seconds a stream rests after a store error
_MAX_SCAN_PAUSE = 5.0
_MAX_WAIT = 5.0
_MAX_FOREIGN = 10_000  # notification keys of other namespaces remembered (then forgotten)
_MAX_HOLDERS = 1000  # other holders whose liveness is remembered (the lapsed then forgotten)
_UNBORN = AgentContextState()
_BUDGETS = TurnBudgets()


class Worker:
    """Serves every stream of ``journal``'s namespace that has work (see the module
    docstring). ``app`` builds each stream's agent; ``holder`` names this worker in the
    leases (unique per process by default); ``lease=False`` runs without leases, for a
    single process only; ``defer``: seconds a stream another instance handed back is left
    to it once it has work again (0: every worker races for it). Raises ConfigurationError
    for a bad setting.
    """

    scan_page_size: int = MAX_LIMIT
    """Streams listed per page of a scan, which reads every page."""

    def __init__(
        self,
        journal: Journal,
        app: AgentFactory,
        *,
        concurrency: int = 4,
        holder: str | None = None,
        ttl: float = LEASE_TTL,
        lease: bool = True,
        poll_interval: float = 0.25,
        rescan_interval: float = 5.0,
        quantum: int = 8,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        grace: float = 10.0,
        defer: float = 0.5,
    ) -> None:
        for name, count in (("concurrency", concurrency), ("quantum", quantum)):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ConfigurationError(f"{name} must be an int >= 1, got {count!r}")
        for name, seconds in (
            ("ttl", ttl),
            ("poll_interval", poll_interval),
            ("rescan_interval", rescan_interval),
            ("backoff", backoff),
            ("max_backoff", max_backoff),
            ("grace", grace),
        ):
            if (
                isinstance(seconds, bool)
                or not isinstance(seconds, (int, float))
                or not math.isfinite(seconds)
                or seconds <= 0
            ):
                raise ConfigurationError(
                    f"{name} must be a positive number of seconds, got {seconds!r}"
                )
        if isinstance(defer, bool) or not isinstance(defer, (int, float)) or not 0 <= defer < 1e6:
            raise ConfigurationError(f"defer must be a number of seconds >= 0, got {defer!r}")
        if not callable(app):
            raise ConfigurationError(f"app must be a callable (journal, stream) -> Agent: {app!r}")
        self.journal = journal
        self.app = app
        self.concurrency = concurrency
        self.holder = holder or new_holder()
        self.ttl = float(ttl)
        self.lease = lease
        self.poll_interval = float(poll_interval)
        self.rescan_interval = float(rescan_interval)
        self.quantum = quantum
        self.backoff = float(backoff)
        self.max_backoff = float(max_backoff)
        self.grace = float(grace)
        self.defer = float(defer)
        self._streams = Streams()
        self._holders = Holders(self.holder, _MAX_HOLDERS)
        self._keys: ChangeKeys | None = None  # while the store has a push channel
        self._wake = asyncio.Event()
        self._stopping = asyncio.Event()
        self._listening = False
        self._next_scan = 0.0
        self._scan_failures = 0
        self._started = False
        self._stats = WorkerStats()
        self._random = random.Random(self.holder)

    # -- what callers see -------------------------------------------------------------------

    @property
    def stats(self) -> WorkerStats:
        return self._stats

    @property
    def listening(self) -> bool:
        """Whether the store's push channel (PostgreSQL's notifications) reaches the worker
        now (else it polls)."""
        return self._listening

    @property
    def serving(self) -> tuple[str, ...]:
        """The streams whose agents run now."""
        return tuple(sorted(self._streams.running))

    @property
    def waiting(self) -> tuple[str, ...]:
        """The streams queued for a free slot, first first."""
        return self._streams.waiting

    def stop(self) -> None:
        """Stop claiming; agents end after their step in progress (see the module docstring)."""
        self._stopping.set()
        self._wake.set()

    async def run(self) -> None:
        """Serve until :meth:`stop` (then return once every agent ended and handed its lease
        back) or until cancelled (agents are cancelled and hand their leases back). Raises
        UsageError when run twice; store and provider errors never end it."""
        if self._started:
            raise UsageError("a Worker runs once: make a new one")
        self._started = True
        loop = asyncio.get_running_loop()
        listener = self._start_listener()
        try:
            while not self._stopping.is_set():
                self._wake.clear()  # before the work: whatever lands meanwhile wakes the wait
                if loop.time() >= self._next_scan:
                    await self._scan()
                self._due(loop.time())
                self._dispatch()
                await wait_or_timeout(self._wake, self._timeout(loop.time()))
            await self._drain(self.grace)
        finally:
            await self._drain(0)
            if listener is not None:
                listener.cancel()
                await asyncio.wait({listener})

    # -- finding work -----------------------------------------------------------------------

    async def _scan(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            infos = [info async for info in self.journal.all_streams(page_size=self.scan_page_size)]
        except StoreError as exc:
            self._scan_failures += 1
            self._count(store_errors=1)
            pause = min(self.poll_interval * 2**self._scan_failures, _MAX_SCAN_PAUSE)
            log.warning(
                "worker %s: listing streams failed: %s; again in %.1fs", self.holder, exc, pause
            )
            self._next_scan = loop.time() + pause
            return
        self._scan_failures = 0
        interval = self.rescan_interval if self._listening else self.poll_interval
        self._next_scan = loop.time() + interval
        changed: list[tuple[StreamStatus, int]] = []
        for info in infos:
            status = self._streams.get(info.stream)
            if status is None:
                status = self._streams.add(info.stream)
                if self._keys is not None:
                    key = self.journal.change_key(info.stream)
                    if key is not None:
                        self._keys.learn(key, status)
            if status.version != info.version:
                status.version = info.version
                changed.append((status, info.version))
        # Workers scanning the same list would otherwise race for the same streams in order.
        self._random.shuffle(changed)
        for status, version in changed:
            self._changed(status, Mark(version))
        if self._keys is not None:
            self._keys.scanned()

    def _changed(self, status: StreamStatus, heard: Mark | None = None) -> None:
        if heard is not None:
            known = status.heard
            status.heard = heard if known is None else known.newer(heard)
        if self._streams.change(status, asyncio.get_running_loop().time() + _RECHECK):
            self._wake.set()

    def _due(self, now: float) -> None:
        if self._streams.due(now, self.journal.clock):
            self._wake.set()

    def _dispatch(self) -> None:
        while len(self._streams.running) < self.concurrency:
            status = self._streams.start()
            if status is None:
                return
            status.task = asyncio.create_task(
                self._serve(status), name=f"worker {self.holder} {status.stream}"
            )

    def _timeout(self, now: float) -> float:
        waits = [self._next_scan - now, _MAX_WAIT]
        due = self._streams.next_due(now, self.journal.clock)
        if due is not None:
            waits.append(due)
        return max(min(waits), 0.0)

    # -- the store's push channel (PostgreSQL's notifications) --------------------------------

    def _start_listener(self) -> asyncio.Task[None] | None:
        listening = self.journal.listen_changes()
        if listening is None:  # no push channel: the scans find every change
            return None
        self._keys = ChangeKeys(_MAX_FOREIGN)
        return asyncio.create_task(self._listen(listening), name=f"worker {self.holder} listener")

    async def _listen(
        self,
        listening: contextlib.AbstractAsyncContextManager[AsyncIterator[StreamChange]] | None,
    ) -> None:
        """Hear of every change through the store's push channel, listening again (after a
        pause that doubles, up to a limit) whenever it is lost."""
        pause = self.poll_interval
        while listening is not None:
            try:
                async with listening as changes:
                    self._listening = True
                    self._rescan_soon()  # what was appended while nobody listened
                    pause = self.poll_interval
                    try:
                        async for change in changes:
                            self._notified(change)
                    finally:
                        self._listening = False
                        for status in self._streams.running.values():
                            if status.lease is not None:  # what lands meanwhile goes unheard
                                status.lease.heard(None, None)
            except StoreError as exc:
                log.warning("worker %s: not listening (%s); polling meanwhile", self.holder, exc)
            self._rescan_soon()
            await asyncio.sleep(pause)
            pause = min(pause * 2, _MAX_SCAN_PAUSE)
            listening = self.journal.listen_changes()

    def _notified(self, change: StreamChange) -> None:
        keys = self._keys
        assert keys is not None  # set before the listener starts
        status = keys.find(change.key)
        if status is None:
            if keys.note(change.key):  # a new stream, or another namespace's: the scan tells
                self._rescan_soon()
            return
        if status.lease is not None:
            status.lease.heard(change.version, change.head)
        self._changed(status, None if change.version is None else Mark(change.version, change.head))

    def _rescan_soon(self) -> None:
        loop = asyncio.get_running_loop()
        self._next_scan = min(self._next_scan, loop.time() + _RECHECK)
        self._wake.set()

    # -- serving one stream -----------------------------------------------------------------

    async def _serve(self, status: StreamStatus) -> None:
        try:
            await self._work(status)
        except Exception:  # a bug must not end the worker: the stream rests, then again
            log.exception("worker %s: serving %r failed", self.holder, status.stream)
            self._pause(status, self.backoff)
        finally:
            if self._streams.finish(status):
                self._changed(status)
            self._wake.set()

    async def _work(self, status: StreamStatus) -> None:
        stream = status.stream
        heard, status.heard = status.heard, None
        version = heard.version if heard is not None else None
        settled = status.settled
        if settled is not None:
            if heard is None:
                version = await self.journal.version(stream)
                heard = Mark(version)
            if settled.covers(heard):
                # Nothing appended since it was left idle: the change heard of was older (this
                # worker's own appends, heard after its run).
                return
            status.settled = None
        if status.paused is not None:
            if self.journal.clock() < status.paused:
                self._streams.block(status, status.paused)
                return
            status.paused = None
        if not self.lease:
            if await self._may_have_work(stream, version, _head_of(heard)):
                await self._run_leased(status, None, status.failures)
            return
        # The lease first: a stream another instance holds, or one handed back idle with
        # nothing appended since (by any worker), is not read any further. A version heard
        # of may be behind the stream's: a claim made at it catches up as it lands.
        view = await view_lease(self.journal, stream, version=version)
        record = view.lease
        if record is not None:
            self._holders.seen(record, self.journal.clock())
        if view.settled:
            assert record is not None
            status.settled = Mark(view.version, parse_cursor(record.cursor))
            status.deferred = None
            return
        if record is not None and not record.free_for(self.holder, self.journal.clock()):
            # Held (or held back) elsewhere: nothing more to read until that lease lapses.
            status.deferred = None
            self._streams.block(status, record.expires_at)
            return
        if (
            record is not None
            and record.state == "released"
            and record.holder != self.holder
            and self._defer(status, record)
        ):
            return  # handed back by another instance: left to it for a while
        status.deferred = None
        # The head the look read with the version (a version alone may be an old history's:
        # a stream deleted and made again reaches it), else the one a notification named
        # while no lease event came after it: the folds take it for the stream's (a change
        # after it is heard of, or fails the fence).
        head = view.head
        if head is None and heard is not None and heard.version == view.version:
            head = _head_of(heard)
        if not await self._may_have_work(stream, view.version, head):
            return
        lazy = record is None or record.holder == self.holder  # see the module docstring
        try:
            lease = await claim_lease(
                self.journal, stream, holder=self.holder, ttl=self.ttl, lazy=lazy, view=view
            )
        except LeaseHeldError as exc:
            self._streams.block(status, datetime.fromisoformat(exc.expires_at))
            return
        except ConflictError:
            status.again = True  # other writers won every race: look again
            return
        await self._run_leased(status, lease, max(lease.failures, status.failures), head)

    def _defer(self, status: StreamStatus, record: LeaseRecord) -> bool:
        """Whether the stream another instance handed back (``record``) is still left to it
        (then blocked until then, however often it changes): see the module docstring."""
        now = self.journal.clock()
        if status.deferred is None or status.deferred[0] != record.position:
            status.deferred = (record.position, now)
        first = status.deferred[1]
        until = first + timedelta(seconds=self.defer)
        alive = self._holders.alive_until(record.holder)
        if record.returning and alive is not None:
            until = max(until, min(alive, first + timedelta(seconds=self.ttl)))
        if now >= until:
            return False
        self._streams.block(status, until)
        return True

    async def _run_leased(
        self,
        status: StreamStatus,
        lease: StreamLease | None,
        failures: int,
        head: str | None = None,
    ) -> None:
        stream = status.stream
        journal = lease.journal if lease is not None else self.journal
        if lease is not None:
            status.lease = lease
            # Its folds take where it knows the stream is (its claim's version, then its own
            # appends' heads while the worker hears every change).
            lease.watch(head, notified=self._listening)
            newer = status.heard  # heard of since the look
            if newer is not None and newer.head is not None:
                lease.heard(newer.version, newer.head)
        try:
            async with lease.renewing() if lease is not None else contextlib.nullcontext():
                agent = await self._agent(journal, stream)
                idle = await self._run(agent, status)
        except LeaseLostError as exc:
            self._count(lost=1)
            log.info("worker %s: %s", self.holder, exc)
            return
        except StoreError as exc:
            # Our lease (if it landed) stays ours: claimed again once the store answers.
            self._count(store_errors=1)
            log.warning("worker %s: store error on %r: %s", self.holder, stream, exc)
            self._pause(status, _STORE_PAUSE)
            return
        except Exception as exc:
            await self._back_off(status, lease, failures + 1, exc)
            return
        except asyncio.CancelledError:
            if lease is not None:  # a shutdown: another worker takes over at once
                await finish(_quietly(lease.release()))
            raise
        finally:
            status.lease = None
            if lease is not None and not lease.pending:
                self._count(claims=1)
        status.failures = 0
        if lease is not None:
            # A worker that goes on running comes back to the stream when it has work.
            returning = not self._stopping.is_set()
            await _quietly(lease.release(idle=idle, returning=returning))
            if idle and lease.others_appended == 0 and not lease.active and not lease.lost:
                # Released, and nobody else appended meanwhile: the changes heard of while
                # it ran (and the ones still to come in) are this run's own appends, unless
                # one heard of is newer than the hand-back.
                settled = status.settled = Mark(lease.version, parse_cursor(lease.cursor))
                if status.heard is None or settled.covers(status.heard):
                    status.again = False

    async def _run(self, agent: Agent, status: StreamStatus) -> bool:
        """Run the agent until it has nothing to do (True), or until it gave its slot up to
        waiting streams or the worker stops (False)."""
        idle = False
        while not self._stopping.is_set():
            report = await agent.run_until_idle(max_steps=self.quantum, stop=self._stopping)
            self._count(steps=report.steps)
            if report.steps < self.quantum:
                idle = not self._stopping.is_set()
                break
            if self._streams.queued:  # others wait: this stream queues again at the end
                status.again = True
                break
        self._count(runs=1)
        return idle

    async def _may_have_work(self, stream: str, version: int | None, head: str | None) -> bool:
        """Whether the stream's scheduler has something to do, the stream taken to be at
        ``version`` (the claim's) with ``head`` (as a notification named it). Budgets only
        tell a request from a halt (both are work); the context only tells a request from a
        pending birth, and the agent reads it itself (a birth still pending leaves its claim
        unused)."""
        at: dict[str, Any] = {"known_version": version}
        if head is not None:
            at["known_head"] = head
        sched, _ = await self.journal.folds.read_with_cursor(
            Scheduler, self.journal.namespace, stream, **at
        )
        return decide(sched, _UNBORN, _BUDGETS).action != "idle"

    async def _agent(self, journal: Journal, stream: str) -> Agent:
        made = self.app(journal, stream)
        agent = await made if inspect.isawaitable(made) else made
        if not isinstance(agent, Agent) or agent.journal is not journal or agent.stream != stream:
            raise UsageError(
                "the worker's app must return cf.Agent(journal, stream, ...) built on the "
                f"journal and stream it is given; for stream {stream!r} it returned {agent!r}"
            )
        return agent

    async def _back_off(
        self, status: StreamStatus, lease: StreamLease | None, failures: int, exc: Exception
    ) -> None:
        delay = min(self.backoff * 2 ** (failures - 1), self.max_backoff)
        self._count(backoffs=1)
        log.warning(
            "worker %s: %r failed (%s in a row), resting %.1fs: %s",
            self.holder,
            status.stream,
            failures,
            delay,
            exc,
            exc_info=not isinstance(exc, ModelError),
        )
        if lease is not None and not lease.pending:
            await _quietly(lease.release(backoff=delay, failures=failures))
            self._streams.block(status, lease.expires_at)
            return
        if lease is not None:
            # It failed before its claim landed (nothing of it reached the journal): the
            # claim is dropped and this worker alone rests. Were the backoff written, it
            # could land before the claim of a worker serving the stream meanwhile and
            # take the stream from it (a claimant whose reads raced that worker's appends
            # fails so).
            await _quietly(lease.release())
        status.failures = failures
        self._pause(status, delay)

    def _pause(self, status: StreamStatus, seconds: float) -> None:
        """Not worked for ``seconds``, changes or not (a look then still finds it paused)."""
        status.paused = self.journal.clock() + timedelta(seconds=seconds)
        self._streams.block(status, status.paused)

    async def _drain(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for the running agents, then cancel the rest."""
        tasks = {s.task for s in self._streams.running.values() if s.task is not None}
        if not tasks:
            return
        if grace > 0:
            _, tasks = await asyncio.wait(tasks, timeout=grace)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _count(self, **more: int) -> None:
        stats = self._stats
        self._stats = replace(stats, **{k: getattr(stats, k) + n for k, n in more.items()})


def _head_of(heard: Mark | None) -> str | None:
    """The cursor of the head a change was heard with, when it said."""
    return None if heard is None or heard.head is None else str(heard.head)


async def _quietly(release: Awaitable[None]) -> None:
    """A lease hand-back that may fail (the store away): the lease then lapses by itself."""
    try:
        await release
    except StoreError as exc:
        log.warning("handing a lease back failed: %s", exc)
