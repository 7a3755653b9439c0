"""A worker pool: serve every stream of a namespace that has something to do.

A :class:`Worker` watches one namespace of a journal, finds the streams whose scheduler
has work (a trigger, an unanswered request, tool calls to answer), claims each by lease
(:mod:`.lease`) and runs the agent its ``app`` factory builds there, at most
``concurrency`` streams at a time. Any number of workers, in any processes on any hosts,
can serve one namespace: the lease keeps each stream to one of them at a time.

Finding work. On PostgreSQL the worker LISTENs on the journal's notification channel,
where every append names its stream (by a hash the worker maps back to the name), so a
stream is looked at as soon as it changes; the stream list is read again every
``rescan_interval`` seconds to catch a lost notification. On SQLite and in memory it reads
the stream list every ``poll_interval`` seconds and looks at the streams whose version
moved. A stream leased to another instance is looked at again when that lease lapses, or
shortly after the stream changes (its holder may have handed it back). A change is heard of
with the stream's version (and, notified, its head), so one a run left nothing to do after
(the worker's own appends, heard after they landed) costs no read at all, and a look at a
stream reads only its lease (on PostgreSQL with its version and head, in one statement: a
version alone may be that of an old history, the stream deleted and made again).

Fairness: streams wait in one first-in, first-out queue; a stream that keeps its agent
busy gives its slot up after ``quantum`` steps while others wait, and queues at the end.

Failures never end the worker. A provider error (any error of the agent, or of the
factory) hands the lease back as a backoff: nobody works that stream for a pause that
doubles with each failure in a row, up to ``max_backoff``. A store error (the database
down or restarting) pauses that stream, and the stream scan retries with a growing pause;
the listener reconnects. A lost lease ends that stream's run: another instance has it.

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
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

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
from ..store.base import MAX_LIMIT, parse_cursor, wait_or_timeout
from ._worker_state import Mark as _Mark
from ._worker_state import WorkerStats
from .lease import LEASE_TTL, StreamLease, claim_lease, new_holder, view_lease
from .loop import Agent
from .scheduling import Scheduler, TurnBudgets, decide
from .turn import _finish

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
_UNBORN = AgentContextState()
_BUDGETS = TurnBudgets()


class Worker:
    """Serves every stream of ``journal``'s namespace that has work (see the module
    docstring). ``app`` builds each stream's agent; ``holder`` names this worker in the
    leases (unique per process by default); ``lease=False`` runs without leases, for a
    single process only. Raises ConfigurationError for a bad setting.
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
        self._queue: deque[str] = deque()
        self._queued: set[str] = set()
        self._running: dict[str, asyncio.Task[None]] = {}
        self._dirty: set[str] = set()  # changed while running: looked at again after
        self._settled: dict[str, _Mark] = {}  # where a stream was left with nothing to do
        self._heard: dict[str, _Mark] = {}  # the newest change heard of, not yet looked at
        self._leases: dict[str, StreamLease] = {}  # of the runs going on
        self._versions: dict[str, int] = {}
        self._blocked: dict[str, datetime] = {}  # looked at again at that time
        self._recheck: dict[str, float] = {}  # blocked streams that changed: when to look
        self._paused: dict[str, datetime] = {}  # store pauses and unleased backoffs
        self._failures: dict[str, int] = {}  # provider failures in a row (unleased)
        self._keys: dict[str, str] = {}
        self._unknown: set[str] = set()
        self._foreign: set[str] = set()
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
        """Whether PostgreSQL notifications reach the worker now (else it polls)."""
        return self._listening

    @property
    def serving(self) -> tuple[str, ...]:
        """The streams whose agents run now."""
        return tuple(sorted(self._running))

    @property
    def waiting(self) -> tuple[str, ...]:
        """The streams queued for a free slot, first first."""
        return tuple(self._queue)

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
        keyed = self._key_of()
        changed: list[str] = []
        for info in infos:
            if keyed is not None:
                key = keyed(self.journal.namespace, info.stream)
                self._keys[key] = info.stream
                self._foreign.discard(key)
            if self._versions.get(info.stream) != info.version:
                self._versions[info.stream] = info.version
                changed.append(info.stream)
        # Workers scanning the same list would otherwise race for the same streams in order.
        self._random.shuffle(changed)
        for stream in changed:
            self._changed(stream, _Mark(self._versions[stream]))
        # Keys no stream of this namespace has are another namespace's: ignored from now on.
        if len(self._foreign) > _MAX_FOREIGN:
            self._foreign.clear()
        self._foreign.update(k for k in self._unknown if k not in self._keys)
        self._unknown.clear()

    def _changed(self, stream: str, heard: _Mark | None = None) -> None:
        if heard is not None:
            known = self._heard.get(stream)
            self._heard[stream] = heard if known is None else known.newer(heard)
        if stream in self._running:
            self._dirty.add(stream)
        elif stream in self._blocked:
            loop = asyncio.get_running_loop()
            self._recheck.setdefault(stream, loop.time() + _RECHECK)
            self._wake.set()
        else:
            self._enqueue(stream)

    def _enqueue(self, stream: str) -> None:
        if stream not in self._queued:
            self._queue.append(stream)
            self._queued.add(stream)
            self._wake.set()

    def _due(self, now: float) -> None:
        wall = self.journal.clock()
        for stream, until in list(self._blocked.items()):
            due = self._recheck.get(stream)
            if wall >= until or (due is not None and now >= due):
                del self._blocked[stream]
                self._recheck.pop(stream, None)
                self._enqueue(stream)

    def _dispatch(self) -> None:
        while self._queue and len(self._running) < self.concurrency:
            stream = self._queue.popleft()
            self._queued.discard(stream)
            if stream in self._running:
                self._dirty.add(stream)
                continue
            self._running[stream] = asyncio.create_task(
                self._serve(stream), name=f"worker {self.holder} {stream}"
            )

    def _timeout(self, now: float) -> float:
        waits = [self._next_scan - now, _MAX_WAIT]
        waits += [due - now for due in self._recheck.values()]
        if self._blocked:
            wall = self.journal.clock()
            waits.append(min((until - wall).total_seconds() for until in self._blocked.values()))
        return max(min(waits), 0.0)

    # -- PostgreSQL notifications -----------------------------------------------------------

    def _key_of(self) -> Callable[[str, str], str] | None:  # (namespace, stream) -> wake key
        if self._postgres_url() is None:
            return None
        from ..store.postgres import wake_key

        return wake_key

    def _postgres_url(self) -> str | None:
        try:
            from ..store.postgres import PostgresStore
        except ImportError:  # the postgres extra is not installed: no PostgreSQL journal
            return None
        store = self.journal.store
        return store.url if isinstance(store, PostgresStore) else None

    def _start_listener(self) -> asyncio.Task[None] | None:
        url = self._postgres_url()
        if url is None:
            return None
        return asyncio.create_task(self._listen(url), name=f"worker {self.holder} listener")

    async def _listen(self, url: str) -> None:
        import psycopg

        from ..store.postgres import NOTIFY_CHANNEL

        pause = self.poll_interval
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(
                    url, autocommit=True, connect_timeout=5
                )
                try:
                    await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self._listening = True
                    self._rescan_soon()  # what was appended while nobody listened
                    pause = self.poll_interval
                    async for notify in conn.notifies():
                        self._notified(notify.payload)
                finally:
                    self._listening = False
                    for lease in self._leases.values():
                        lease.heard(None, None)  # what lands meanwhile goes unheard
                    await conn.close()
            except (psycopg.Error, OSError) as exc:
                log.warning("worker %s: not listening (%s); polling meanwhile", self.holder, exc)
            self._rescan_soon()
            await asyncio.sleep(pause)
            pause = min(pause * 2, _MAX_SCAN_PAUSE)

    def _notified(self, payload: str) -> None:
        from ..store.postgres import parse_wake

        wake = parse_wake(payload)
        key = wake.key
        stream = self._keys.get(key)
        if stream is not None:
            lease = self._leases.get(stream)
            if lease is not None:
                lease.heard(wake.version, wake.head)
            self._changed(stream, None if wake.version is None else _Mark(wake.version, wake.head))
        elif key not in self._foreign and key not in self._unknown:
            self._unknown.add(key)  # a new stream, or another namespace's: the scan tells
            self._rescan_soon()

    def _rescan_soon(self) -> None:
        loop = asyncio.get_running_loop()
        self._next_scan = min(self._next_scan, loop.time() + _RECHECK)
        self._wake.set()

    # -- serving one stream -----------------------------------------------------------------

    async def _serve(self, stream: str) -> None:
        try:
            await self._work(stream)
        except Exception:  # a bug must not end the worker: the stream rests, then again
            log.exception("worker %s: serving %r failed", self.holder, stream)
            self._pause(stream, self.backoff)
        finally:
            self._running.pop(stream, None)
            if stream in self._dirty:
                self._dirty.discard(stream)
                self._changed(stream)
            self._wake.set()

    async def _work(self, stream: str) -> None:
        heard = self._heard.pop(stream, None)
        version = heard.version if heard is not None else None
        settled = self._settled.pop(stream, None)
        if settled is not None:
            if heard is None:
                version = await self.journal.version(stream)
                heard = _Mark(version)
            if settled.covers(heard):
                # Nothing appended since it was left idle: the change heard of was older (this
                # worker's own appends, heard after its run).
                self._settled[stream] = settled
                return
        paused = self._paused.get(stream)
        if paused is not None:
            if self.journal.clock() < paused:
                self._blocked[stream] = paused
                return
            del self._paused[stream]
        if not self.lease:
            if await self._may_have_work(stream, version, _head_of(heard)):
                await self._run_leased(stream, None, self._failures.get(stream, 0))
            return
        # The lease first: a stream another instance holds, or one handed back idle with
        # nothing appended since (by any worker), is not read any further. A version heard
        # of may be behind the stream's: a claim made at it catches up as it lands.
        view = await view_lease(self.journal, stream, version=version)
        if view.settled:
            assert view.lease is not None
            self._settled[stream] = _Mark(view.version, parse_cursor(view.lease.cursor))
            return
        # The head the look read with the version (a version alone may be an old history's:
        # a stream deleted and made again reaches it), else the one a notification named
        # while no lease event came after it: the folds take it for the stream's (a change
        # after it is heard of, or fails the fence).
        head = view.head
        if head is None and heard is not None and heard.version == view.version:
            head = _head_of(heard)
        if not await self._may_have_work(stream, view.version, head):
            return
        try:
            lease = await claim_lease(
                self.journal, stream, holder=self.holder, ttl=self.ttl, lazy=True, view=view
            )
        except LeaseHeldError as exc:
            self._blocked[stream] = datetime.fromisoformat(exc.expires_at)
            return
        except ConflictError:
            self._dirty.add(stream)  # other writers won every race: look again
            return
        await self._run_leased(stream, lease, lease.failures, head)

    async def _run_leased(
        self, stream: str, lease: StreamLease | None, failures: int, head: str | None = None
    ) -> None:
        journal = lease.journal if lease is not None else self.journal
        if lease is not None:
            self._leases[stream] = lease
            # Its folds take where it knows the stream is (its claim's version, then its own
            # appends' heads while the worker hears every change).
            lease.watch(head, notified=self._listening)
            newer = self._heard.get(stream)  # heard of since the look
            if newer is not None and newer.head is not None:
                lease.heard(newer.version, newer.head)
        try:
            async with lease.renewing() if lease is not None else contextlib.nullcontext():
                agent = await self._agent(journal, stream)
                idle = await self._run(agent, stream)
        except LeaseLostError as exc:
            self._count(lost=1)
            log.info("worker %s: %s", self.holder, exc)
            return
        except StoreError as exc:
            # Our lease (if it landed) stays ours: claimed again once the store answers.
            self._count(store_errors=1)
            log.warning("worker %s: store error on %r: %s", self.holder, stream, exc)
            self._pause(stream, _STORE_PAUSE)
            return
        except Exception as exc:
            await self._back_off(stream, lease, failures + 1, exc)
            return
        except asyncio.CancelledError:
            if lease is not None:  # a shutdown: another worker takes over at once
                await _finish(_quietly(lease.release()))
            raise
        finally:
            self._leases.pop(stream, None)
            if lease is not None and not lease.pending:
                self._count(claims=1)
        self._failures.pop(stream, None)
        if lease is not None:
            await _quietly(lease.release(idle=idle))
            if idle and lease.others_appended == 0 and not lease.active and not lease.lost:
                # Released, and nobody else appended meanwhile: the changes heard of while
                # it ran (and the ones still to come in) are this run's own appends, unless
                # one heard of is newer than the hand-back.
                settled = _Mark(lease.version, parse_cursor(lease.cursor))
                self._settled[stream] = settled
                heard = self._heard.get(stream)
                if heard is None or settled.covers(heard):
                    self._dirty.discard(stream)

    async def _run(self, agent: Agent, stream: str) -> bool:
        """Run the agent until it has nothing to do (True), or until it gave its slot up to
        waiting streams or the worker stops (False)."""
        idle = False
        while not self._stopping.is_set():
            report = await agent.run_until_idle(max_steps=self.quantum, stop=self._stopping)
            self._count(steps=report.steps)
            if report.steps < self.quantum:
                idle = not self._stopping.is_set()
                break
            if self._queue:  # others wait: this stream queues again at the end
                self._dirty.add(stream)
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
        self, stream: str, lease: StreamLease | None, failures: int, exc: Exception
    ) -> None:
        delay = min(self.backoff * 2 ** (failures - 1), self.max_backoff)
        self._count(backoffs=1)
        log.warning(
            "worker %s: %r failed (%s in a row), resting %.1fs: %s",
            self.holder,
            stream,
            failures,
            delay,
            exc,
            exc_info=not isinstance(exc, ModelError),
        )
        if lease is not None:
            await _quietly(lease.release(backoff=delay, failures=failures))
            self._blocked[stream] = lease.expires_at
        else:
            self._failures[stream] = failures
            self._pause(stream, delay)

    def _pause(self, stream: str, seconds: float) -> None:
        until = self.journal.clock() + timedelta(seconds=seconds)
        self._paused[stream] = until
        self._blocked[stream] = until

    async def _drain(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for the running agents, then cancel the rest."""
        tasks = set(self._running.values())
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


def _head_of(heard: _Mark | None) -> str | None:
    """The cursor of the head a change was heard with, when it said."""
    return None if heard is None or heard.head is None else str(heard.head)


async def _quietly(release: Awaitable[None]) -> None:
    """A lease hand-back that may fail (the store away): the lease then lapses by itself."""
    try:
        await release
    except StoreError as exc:
        log.warning("handing a lease back failed: %s", exc)
