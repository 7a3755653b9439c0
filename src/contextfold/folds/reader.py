"""The fold reader: incremental, cached reads of folds from a store, checkpoints included.

State is cached per (namespace, stream, fold object, run) with the cursor of the last
event folded. A read asks the store only for the fold's events after that cursor; a stale
or unknown cursor (deleted history) rebuilds from the newest usable checkpoint. Reads of
one state are single-flight: concurrent readers fold each event once. An append through
the journal folds its events into the cached states it continues (:meth:`FoldReader.appended`),
so the read that follows checks only the stream's head.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from opentelemetry import metrics
from pydantic import ValidationError

from ..errors import ConfigurationError, FoldDefinitionError, StoreError
from ..events import StoredEvent
from ..store.base import Store
from .fold import FoldBase, Reading

__all__ = ["FoldCache", "FoldReader", "Skipped"]

S = TypeVar("S")
log = logging.getLogger("contextfold.folds")
_meter = metrics.get_meter("contextfold")
_skipped_counter = _meter.create_counter(
    "contextfold.fold.read.skipped", description="Events and checkpoints a fold read left out"
)
_events_counter = _meter.create_counter(
    "contextfold.fold.read.events", description="Events folded per read, by start"
)

Start = Literal["cold", "warm", "reset", "append"]
_UNASKED: Any = object()
PAGE = 5000
MAX_RESETS = 3  # rebuilds of one read after stale cursors, before it gives up


@dataclass(frozen=True, slots=True)
class Skipped:
    """A stored event a read left out, reported once."""

    fold: str
    reason: Literal["decode", "checkpoint", "missing-segment"]
    stream: str
    position: int
    event_id: str
    detail: str


@dataclass(slots=True)
class _Flight:
    """The single-flight lock of one cached state, and how many reads hold or await it."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0
    ended: bool = False  # its run ended while reads were in flight: they cache nothing


@dataclass(slots=True)
class _Entry:
    """A cached state. Changed in place (by a read's touch and an append's fold-in) only
    between awaits: a read copies out what it needs before it awaits the store."""

    state: Any
    cursor: str | None
    checkpoint_at: int  # global position of the checkpoint the state is based on (0: none)
    touched: float
    # Every event of the fold's types up to stream position `version` is folded in, and
    # `head` is the cursor of the event at `version` (None at 0); -1: not known (a checkpoint
    # or a materialization the state started from).
    version: int = -1
    head: str | None = None
    applied: bool = False  # made by an append: `head` was the stream's head then


class FoldCache:
    """The bounded cache of fold states: LRU over ``max_entries``, ``ttl`` seconds after the
    last read, expired lazily (no timers). ``math.inf`` lifts either bound."""

    def __init__(self, max_entries: float = 1000, ttl: float = 30 * 60) -> None:
        if max_entries <= 0 or ttl <= 0:
            raise ConfigurationError(
                f"FoldCache max_entries and ttl must be positive, got {max_entries!r} and {ttl!r}"
            )
        self.max_entries = max_entries
        self.ttl = ttl
        self._entries: OrderedDict[tuple[Any, ...], _Entry] = OrderedDict()
        self._streams: dict[tuple[Any, Any], dict[tuple[Any, ...], None]] = {}

    def get(self, key: tuple[Any, ...], now: float) -> _Entry | None:
        entries = self._entries
        # The oldest entry checked here first: mostly none has expired, and no call is made.
        if entries and now - next(iter(entries.values())).touched > self.ttl:
            self._expire(now)
        entry = entries.get(key)
        if entry is None:
            return None
        if now - entry.touched > self.ttl:
            self._remove(key)
            return None
        # A read: its ttl starts again and it moves to the recent end, so the entries stay
        # in touched order (expiry pops from the old end) even if this read then fails.
        entry.touched = now
        self._entries.move_to_end(key)
        return entry

    def _expire(self, now: float) -> None:
        """Drop expired entries from the least recently read end: without it a state never
        read again would stay until LRU evicts it, which max_entries=inf never does."""
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if now - oldest.touched <= self.ttl:
                return
            self._remove(next(iter(self._entries)))

    def put(self, key: tuple[Any, ...], entry: _Entry) -> None:
        self._entries[key] = entry
        self._entries.move_to_end(key)
        self._streams.setdefault(key[:2], {})[key] = None
        while len(self._entries) > self.max_entries:
            self._remove(next(iter(self._entries)))

    def of_stream(self, namespace: str, stream: str) -> list[tuple[tuple[Any, ...], _Entry]]:
        """The (key, entry) pairs of one stream's states, expired ones included."""
        keys = self._streams.get((namespace, stream), ())
        return [(key, self._entries[key]) for key in keys]

    def holds(self, namespace: str, stream: str) -> bool:
        """Whether any state of the stream is cached."""
        return (namespace, stream) in self._streams

    def drop(self, predicate: Callable[[tuple[Any, ...]], bool]) -> None:
        for key in [k for k in self._entries if predicate(k)]:
            self._remove(key)

    def _remove(self, key: tuple[Any, ...]) -> None:
        del self._entries[key]
        keys = self._streams[key[:2]]
        del keys[key]
        if not keys:
            del self._streams[key[:2]]

    def __len__(self) -> int:
        return len(self._entries)


class FoldReader:
    """Reads folds for every namespace of one journal (shared by its namespace views)."""

    def __init__(
        self,
        store: Store,
        cache: FoldCache | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        young_collections: bool = True,
    ):
        self.store = store
        # Whether a catch-up keeps the garbage collector to its youngest generation (see
        # _Collector): on by default, where a cold read of 100k events costs 2.5–3x the raw
        # driver's rows against 4.2x without; a host that tunes its collector turns it off.
        self._collections: Callable[[], AbstractContextManager[None]] = (
            _young_collections_only if young_collections else nullcontext
        )
        # Not `cache or FoldCache()`: an empty cache is falsy (it has __len__).
        self.cache = cache if cache is not None else FoldCache()
        self._clock = clock
        self._locks: dict[tuple[Any, ...], _Flight] = {}
        self._reported: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._checkpointing: dict[tuple[str, int], FoldBase[Any]] = {}
        self._names: dict[str, FoldBase[Any]] = {}
        self._checked: weakref.WeakSet[FoldBase[Any]] = weakref.WeakSet()  # identity checked
        self.skipped: list[Skipped] = []  # the newest reports, for inspection (bounded)

    # -- identity -----------------------------------------------------------------------------

    def _check_identity(self, fold: FoldBase[Any]) -> None:
        fold.validate()
        if fold.can_checkpoint:
            key = (fold.name, fold.version)
            other = self._checkpointing.setdefault(key, fold)
            if other is not fold:
                raise FoldDefinitionError(
                    f"fold-checkpoint-shared: two different folds taking checkpoints are named "
                    f"{fold.name}@{fold.version} on this journal; each would restore the other's "
                    "checkpoints. Define each fold once and share the object, or rename/version one"
                )
        # Two checkpointing folds of one name and version failed above; any other pair of
        # folds sharing a name (versions differing included) shares its metrics.
        other = self._names.setdefault(fold.name, fold)
        if other is not fold:
            log.warning(
                "fold-name-shared: different folds are named %r (versions %d and %d); "
                "metrics report them as one: rename one",
                fold.name,
                other.version,
                fold.version,
            )

    # -- reporting ----------------------------------------------------------------------------

    def _report(self, fold: FoldBase[Any], reason: Any, event: StoredEvent, detail: str) -> None:
        key = (fold.name, reason, event.meta.event_id)
        if key in self._reported:
            self._reported.move_to_end(key)
            return
        self._reported[key] = None
        if len(self._reported) > 1000:
            self._reported.popitem(last=False)
        item = Skipped(fold.name, reason, event.stream, event.position, event.meta.event_id, detail)
        self.skipped.append(item)
        del self.skipped[:-1000]
        log.warning(
            "fold %s left out %s@%d (%s): %s",
            fold.name,
            event.stream,
            event.position,
            reason,
            detail,
        )
        _skipped_counter.add(1, {"fold": fold.name, "reason": reason})

    # -- reading ------------------------------------------------------------------------------

    async def read(
        self, fold: FoldBase[S], namespace: str, stream: str, *, run_id: str | None = None
    ) -> S:
        """The fold's state, up to date with every event stored before the call."""
        state, _ = await self.read_with_cursor(fold, namespace, stream, run_id=run_id)
        return state

    async def read_with_cursor(
        self,
        fold: FoldBase[S],
        namespace: str,
        stream: str,
        *,
        run_id: str | None = None,
        known_head: Any = _UNASKED,
        known_version: int | None = None,
    ) -> tuple[S, str | None]:
        """The state and its cursor. ``known_head``/``known_version``: the stream's head or
        version as the caller knows it without asking the store (a lease holder's own last
        append, a notification, its claim), taken as it is: a state whose last event is
        there is returned without a read."""
        if fold not in self._checked:
            self._check_identity(fold)
            self._checked.add(fold)
        if fold.scope == "run" and run_id is None:
            raise FoldDefinitionError(f"fold {fold.name} is run-scoped: read it with run_id=…")
        # The fold object itself, not id(fold): a dead fold's id may be reused by another.
        key = (namespace, stream, fold, run_id if fold.scope == "run" else None)
        # An append folded in last: the state is current while its last event is still the
        # stream's head. Any head seen during this call will do: a state at it holds every
        # event stored before the call. With no read in flight that takes no lock to see.
        seen: Any = known_head
        # A known version alone tells the state current (a state at it); with a known head,
        # the head decides (a stream deleted and made again reaches an old version, never an
        # old head: global positions are not reused).
        version = known_version if known_head is _UNASKED else None

        flight = self._locks.get(key)
        if flight is None:
            cached = self.cache.get(key, self._clock())
            if cached is not None and version is not None and version == cached.version:
                return cached.state, cached.cursor
            # A known head also tells a read's state current: at it, nothing follows its last.
            if cached is not None and (cached.applied or seen is not _UNASKED):
                state, cursor, head = cached.state, cached.cursor, cached.head
                if seen is _UNASKED:
                    seen = await self.store.head(namespace, stream)
                if seen == head:
                    return state, cursor
            flight = self._locks.get(key)
            if flight is None:
                flight = self._locks[key] = _Flight()
        flight.users += 1
        try:
            async with flight.lock:
                cached = self.cache.get(key, self._clock())
                if cached is not None and version is not None and version == cached.version:
                    return cached.state, cached.cursor
                if cached is not None and (cached.applied or seen is not _UNASKED):
                    state, cursor, head = cached.state, cached.cursor, cached.head
                    if seen is _UNASKED:
                        seen = await self.store.head(namespace, stream)
                    if seen == head:
                        return state, cursor
                start: Start = "warm"
                if cached is None or cached.state is None:
                    start = "cold"
                    cached = await self._cold(fold, namespace, stream)
                # The cached entry stays as it was until the catch-up succeeds: a handler
                # that raises fails every read alike, warm or cold, never skipping its event.
                entry, folded, reset = await self._catch_up(fold, namespace, stream, cached, run_id)
                # Rebuilt until a catch-up ends without a reset: the history can be deleted
                # again during the rebuild, and a reset catch-up is not caught up at all.
                for _ in range(MAX_RESETS):
                    if not reset:
                        break
                    start = "reset"
                    cached = await self._cold(fold, namespace, stream)
                    entry, folded, reset = await self._catch_up(
                        fold, namespace, stream, cached, run_id
                    )
                if reset:
                    raise StoreError(
                        f"fold {fold.name}: the store reset the history of stream {stream!r} "
                        f"on {MAX_RESETS + 1} reads in a row (deleted during every rebuild, or "
                        "its contains() knows a cursor its read() does not)"
                    )
                if not flight.ended:
                    self.cache.put(key, entry)
                _events_counter.add(folded, {"fold": fold.name, "start": start})
                return entry.state, entry.cursor
        finally:
            flight.users -= 1
            if flight.users == 0:  # keep locks only while reads are in flight
                del self._locks[key]

    def appended(
        self,
        namespace: str,
        stream: str,
        events: Sequence[StoredEvent],
        *,
        previous: str | None = None,
    ) -> None:
        """Fold ``events``, which one append just stored (exactly as the store holds them),
        into the cached states of the stream that they continue.

        A state is continued when it is at the stream position just before them and nothing
        was stored anywhere in between (the stream was empty, or their global positions
        follow its head's): no other writer got in, not even a delete and recreate. Every
        other state, and one whose fold meets its own checkpoint among them or whose
        handler raises, is left as it was for its next read to catch up (and raise).
        ``previous``, the cursor of the event the store put just before them, proves the
        same where global positions can have gaps (another stream's appends in between).
        """
        if not events:
            return
        first, last = events[0], events[-1]
        before, head = first.position - 1, last.cursor
        decoded: dict[tuple[int, int], Any] = {}  # payloads, shared by the folds below
        for key, entry in self.cache.of_stream(namespace, stream):
            if entry.state is None or entry.version != before:
                continue
            if before > 0 and (
                entry.head is None
                or (previous is None and int(entry.head) + 1 != first.global_position)
                or (previous is not None and entry.head != previous)
            ):
                continue
            fold: FoldBase[Any] = key[2]
            reading = fold.reading()

            def skip(reason: Any, event: StoredEvent, detail: str, fold: Any = fold) -> None:
                self._report(fold, reason, event, detail)

            try:
                state, index, folded = fold._fold_appended(
                    entry.state, events, reading, key[3], skip, decoded
                )
            except Exception:  # the next read folds the same events and raises it
                log.debug("fold %s: an append's events are left to the next read", fold.name)
                continue
            if index < len(events):
                continue  # its checkpoint: the read restores it
            # No read, so its recency stays as it was.
            entry.state = state
            # The last event is mostly one of the fold's types: its cursor is the head.
            if last.type in reading.types:
                entry.cursor = head
            else:
                entry.cursor = _last_cursor(events, reading, entry.cursor)
            entry.version = last.position
            entry.head = head
            entry.applied = True
            if folded:
                _events_counter.add(folded, {"fold": fold.name, "start": "append"})

    def end_run(self, namespace: str, stream: str, run_id: str) -> None:
        """Drop the run-scoped states of a run that ended."""

        def of_run(key: tuple[Any, ...]) -> bool:
            return bool(key[0] == namespace and key[1] == stream and key[3] == run_id)

        self.cache.drop(of_run)
        # A read in flight would put the ended run's state back, kept until LRU or TTL.
        for key, flight in self._locks.items():
            if of_run(key):
                flight.ended = True

    async def _cold(self, fold: FoldBase[S], namespace: str, stream: str) -> _Entry:
        """The newest usable checkpoint, else the fold's materialization, else the initial
        state; not yet caught up."""
        if fold.can_checkpoint:
            before: str | None = None
            while True:
                found = await self.store.latest(
                    namespace, stream, [fold.checkpoint_type], before=before, limit=20
                )
                for event in found:
                    restored = await self._restore(fold, namespace, stream, event)
                    if restored is not None:
                        return restored
                if len(found) < 20:
                    break
                before = found[-1].cursor
        materialized = await fold.restore(self.store, namespace, stream)
        if materialized is not None:
            return _Entry(materialized[0], materialized[1], 0, self._clock())
        return _Entry(fold.initial_state(), None, 0, self._clock(), version=0)

    async def _restore(
        self, fold: FoldBase[S], namespace: str, stream: str, event: StoredEvent
    ) -> _Entry | None:
        """A checkpoint as a cache entry, or None (reported) when it cannot be used."""
        try:
            payload = event.payload
            through = payload["through"]
            state = fold.decode_state(payload["state"])
        except (ValueError, ValidationError, KeyError, TypeError) as exc:
            self._report(fold, "checkpoint", event, f"state does not decode: {exc}")
            return None
        if through is not None and not await self.store.contains(namespace, stream, through):
            self._report(fold, "checkpoint", event, f"through {through!r} is not in this history")
            return None
        return _Entry(state, through, event.global_position, self._clock())

    async def _catch_up(
        self, fold: FoldBase[S], namespace: str, stream: str, entry: _Entry, run_id: str | None
    ) -> tuple[_Entry, int, bool]:
        """A new entry: ``entry`` with the events after its cursor folded in (``entry`` is left
        as it is). Returns (new entry, events folded, reset)."""
        types = fold.reading().read_types
        work, cursor, checkpoint_at = (
            fold._open_read(entry.state),
            entry.cursor,
            entry.checkpoint_at,
        )
        version, head = entry.version, entry.head
        folded = 0
        # Young collections only over the whole catch-up, store reads included: every
        # handler makes objects that live as long as the state, and passes of the older
        # generations over a growing state (full ones at 100k events) cost more than
        # folding them.
        with self._collections():
            while True:
                page = await self.store.read(
                    namespace, stream, after=cursor, types=types, limit=PAGE
                )
                if page.reset and cursor is not None:
                    return entry, folded, True
                work, cursor, checkpoint_at, folded, rebased = await self._fold_page(
                    fold,
                    namespace,
                    stream,
                    page.events,
                    work,
                    cursor,
                    checkpoint_at,
                    run_id,
                    folded,
                )
                if rebased:
                    version, head = -1, None
                elif page.events:
                    version, head = page.events[-1].position, page.events[-1].cursor
                if not rebased and not page.more:
                    state = fold._close_read(work)
                    made = _Entry(state, cursor, checkpoint_at, self._clock(), version, head)
                    return made, folded, False

    async def _fold_page(
        self,
        fold: FoldBase[S],
        namespace: str,
        stream: str,
        events: Sequence[StoredEvent],
        work: Any,
        cursor: str | None,
        checkpoint_at: int,
        run_id: str | None,
        folded: int,
    ) -> tuple[Any, str | None, int, int, bool]:
        """``events`` folded into the read's working form: (work, cursor, checkpoint_at,
        folded, rebased); stops at a checkpoint that restores (rebased)."""
        reading = fold.reading()
        checkpoint, run_scoped = reading.stop, reading.run_scoped

        def skip(reason: str, event: StoredEvent, detail: str) -> None:
            self._report(fold, reason, event, detail)

        index = 0
        while index < len(events):
            work, index, count = fold._fold_into(
                work, events, index, checkpoint, run_id, run_scoped, skip
            )
            folded += count
            if index == len(events):
                break
            event = events[index]  # a checkpoint
            index += 1
            if event.global_position <= checkpoint_at:
                continue
            restored = await self._restore(fold, namespace, stream, event)
            if restored is not None:
                # Rebase: the checkpoint replaces the state; events after its through are
                # folded again on top of it (some of them were folded already).
                rebased = fold._open_read(restored.state)
                return rebased, restored.cursor, restored.checkpoint_at, folded, True
        if events:
            cursor = events[-1].cursor
        return work, cursor, checkpoint_at, folded, False


def _last_cursor(events: Sequence[StoredEvent], reading: Reading, cursor: str | None) -> str | None:
    """The cursor of the newest of ``events`` of the fold's types (a read's cursor), else
    ``cursor``."""
    types = reading.types
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if event.type in types:
            return event.cursor
    return cursor


_NEVER = 2**31 - 1
LONGEST_SPELL = 2.0
"""Seconds after which reads that keep overlapping let the older generations run again."""


class _Collector:
    """Keeps the garbage collector to its youngest generation while reads fold.

    A read makes objects that live as long as the state: collected young, while they are
    still in the cache, they cost little; the older generations would walk the whole
    state again and again as it grows. A spell starts with a read when no other runs,
    and ends as the last read running ends, or, when reads keep overlapping (a busy
    server), as one ends after ``longest`` seconds of it: the others finish under the
    usual thresholds, so cyclic garbage is never held for long. It ends with the
    thresholds as the spell found them, unless something else changed them meanwhile; a
    caller that disabled the collector keeps it disabled.
    """

    def __init__(
        self, *, clock: Callable[[], float] = time.monotonic, longest: float = LONGEST_SPELL
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._longest = longest
        self._readers = 0
        self._saved: tuple[int, int, int] | None = None  # the thresholds, during a spell
        self._since = 0.0

    @contextmanager
    def young_only(self) -> Iterator[None]:
        with self._lock:
            if self._readers == 0:
                self._saved = gc.get_threshold()
                self._since = self._clock()
                gc.set_threshold(self._saved[0], _NEVER, _NEVER)
            self._readers += 1
        try:
            yield
        finally:
            with self._lock:
                self._readers -= 1
                saved = self._saved
                if saved is not None and (
                    self._readers == 0 or self._clock() - self._since > self._longest
                ):
                    if gc.get_threshold() == (saved[0], _NEVER, _NEVER):
                        gc.set_threshold(*saved)
                    self._saved = None


_young_collections_only = _Collector().young_only
