"""Reading the LangGraph saver's records back, and cutting values into records.

The thread index says where each record is; :class:`RecordReader` fetches a record with one
indexed read (a long chain of them with one range read), rebuilds a list channel from its
chain of additions, starting at the newest list it holds in memory, and finds how much of
the previous list a new list keeps. The part builders cut a value into records of bounded
size. Everything here handles serialized values (:data:`Item`); the saver's serde turns them
into objects and back.
"""

from __future__ import annotations

import asyncio
import functools
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import orjson

from ..errors import StoreError
from ..events import Event, StoredEvent
from ..journal import Journal
from ._langgraph_index import BlobEntry, ChannelBlob, Located, ThreadIndex, WriteRecord

__all__ = [
    "BlobKey",
    "Item",
    "RecordReader",
    "Stale",
    "decode",
    "item_parts",
    "parts",
    "value_parts",
    "write_size",
]

E = TypeVar("E", bound=Event)
T = TypeVar("T")
Item = tuple[str, str]
"""One serialized value: the serde type tag and the base64 bytes."""
BlobKey = tuple[str, str, str]
"""(namespace, channel, version key) of a channel blob."""

_ONE_BY_ONE = 8  # records fetched by single reads; more are read as one range


class Stale(Exception):
    """The index named a record its stream no longer holds (deleted since it was read)."""


class _ItemsCache:
    """Lists read or written last, by (stream, blob nonce); LRU bounded in bytes."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str], tuple[tuple[Item, ...], int]] = OrderedDict()
        self._bytes = 0

    def get(self, key: tuple[str, str]) -> tuple[Item, ...] | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: tuple[str, str], items: tuple[Item, ...]) -> None:
        size = sum(len(t) + len(d) for t, d in items) + 64
        if size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old[1]
        self._entries[key] = (items, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped


class RecordReader:
    """Fetches the records a thread index names, from one journal."""

    def __init__(self, journal: Journal, cache_bytes: int) -> None:
        self.journal = journal
        self._cache = _ItemsCache(cache_bytes)

    def remember(self, stream: str, nonce: str, items: tuple[Item, ...]) -> None:
        """Keep a list just written: the next put extends it, the next read starts from it."""
        self._cache.put((stream, nonce), items)

    async def fetch(self, stream: str, at: Located) -> StoredEvent:
        """The record at ``at``: the first of its type after its cursor, one indexed read.
        Raises Stale when the stream no longer holds it."""
        page = await self.journal.read(stream, after=at.after, types=[at.type], limit=1)
        while True:
            if page.reset and at.after is not None:
                raise Stale
            for event in page.events:
                if event.global_position == at.global_position:
                    return event
                if event.global_position > at.global_position:
                    raise Stale
            if not page.more:
                raise Stale
            # An undecodable record the fold skipped sits in between: read on past it.
            page = await self.journal.read(stream, after=page.cursor, types=[at.type], limit=256)

    async def fetch_all(self, stream: str, places: Sequence[Located]) -> dict[int, StoredEvent]:
        """The records at ``places``, by global position. Raises Stale."""
        unique = {at.global_position: at for at in places}
        if len(unique) <= _ONE_BY_ONE:
            found = await asyncio.gather(*(self.fetch(stream, at) for at in unique.values()))
            return {event.global_position: event for event in found}
        # A long delta chain: one range read from its oldest record, in stream order.
        first = min(unique.values(), key=lambda at: at.global_position)
        last = max(unique)
        types = sorted({at.type for at in unique.values()})
        events: dict[int, StoredEvent] = {}
        cursor = first.after
        while True:
            page = await self.journal.read(stream, after=cursor, types=types, limit=1000)
            if page.reset and cursor is not None:
                raise Stale
            for event in page.events:
                if event.global_position in unique:
                    events[event.global_position] = event
            if len(events) == len(unique):
                return events
            if not page.more or (page.events and page.events[-1].global_position >= last):
                raise Stale
            cursor = page.cursor

    async def value(self, stream: str, blob: BlobEntry) -> Item:
        """A ``value`` blob, its parts joined."""
        events = await self.fetch_all(stream, blob.parts)
        found = [decode(events[at.global_position], ChannelBlob) for at in blob.parts]
        return found[0].serde_type, "".join(p.data for p in found)

    async def items(self, stream: str, index: ThreadIndex, key: BlobKey) -> tuple[Item, ...]:
        """A list channel's items at one version: its delta chain applied from the newest
        list in the cache (or from the chain's start). Raises StoreError when the chain is
        broken, Stale when the stream no longer holds it."""
        chain: list[BlobEntry] = []
        start: tuple[Item, ...] = ()
        current: BlobKey | None = key
        seen: set[BlobKey] = set()
        while current is not None:
            blob = index.blobs.get(current)
            if blob is None or blob.kind != "items" or not blob.complete or current in seen:
                raise StoreError(
                    f"stream {stream!r}: the list of channel {key[1]!r} at version {key[2]} "
                    f"extends version {current[2]}, which is not stored as a whole list: the "
                    "thread's records are damaged (copy what is readable with copy_thread)"
                )
            seen.add(current)
            cached = self._cache.get((stream, blob.nonce))
            if cached is not None:
                start = cached
                break
            chain.append(blob)
            current = (key[0], key[1], blob.base) if blob.base is not None else None
        if not chain:
            return start
        events = await self.fetch_all(stream, [at for blob in chain for at in blob.parts])
        items = list(start)
        for blob in reversed(chain):
            del items[blob.keep :]
            for at in blob.parts:
                items.extend(decode(events[at.global_position], ChannelBlob).items)
        result = tuple(items)
        self._cache.put((stream, chain[0].nonce), result)
        return result

    async def kept(
        self, stream: str, index: ThreadIndex, ns: str, channel: str, items: tuple[Item, ...]
    ) -> tuple[int | float | str | None, int]:
        """The version of the list a new list of ``channel`` extends (the newest stored) and
        how many of its first items it keeps; (None, 0) when it keeps none."""
        newest = index.newest_blob.get((ns, channel))
        if newest is None or index.blobs[(ns, channel, newest)].kind != "items":
            return None, 0
        try:
            before = await self.items(stream, index, (ns, channel, newest))
        except Stale:
            return None, 0
        keep = 0
        for old, new in zip(before, items, strict=False):
            if old != new:
                break
            keep += 1
        return (orjson.loads(newest), keep) if keep else (None, 0)


def decode(event: StoredEvent, cls: type[E]) -> E:
    decoded = event.decode(cls)
    assert isinstance(decoded, cls)
    return decoded


def parts(
    values: tuple[T, ...], budget: int, size: Callable[[T], int]
) -> Iterator[tuple[tuple[T, ...], bool]]:
    """``values`` in consecutive groups of about ``budget`` bytes (at least one group, each
    with at least one value), each with whether another group follows."""
    groups: list[tuple[T, ...]] = []
    start, used = 0, 0
    for i, value in enumerate(values):
        cost = size(value)
        if i > start and used + cost > budget:
            groups.append(values[start:i])
            start, used = i, 0
        used += cost
    groups.append(values[start:])
    for i, group in enumerate(groups):
        yield group, i < len(groups) - 1


def _item_size(item: Item) -> int:
    return len(item[0]) + len(item[1]) + 8


def write_size(write: WriteRecord) -> int:
    return len(write.channel) + len(write.value.type) + len(write.value.data) + 64


def item_parts(
    blob: functools.partial[ChannelBlob],
    tail: tuple[Item, ...],
    base: Any,
    keep: int,
    budget: int,
) -> list[ChannelBlob]:
    """A list stored as ``keep`` items of the list at version ``base``, then ``tail``."""
    return [
        blob(kind="items", base=base, keep=keep, items=part, more=more)
        for part, more in parts(tail, budget, _item_size)
    ]


def value_parts(blob: functools.partial[ChannelBlob], item: Item, budget: int) -> list[ChannelBlob]:
    """A value stored whole, its base64 cut into parts of ``budget`` characters."""
    type_, data = item
    chunks = [data[i : i + budget] for i in range(0, len(data), budget)] or [""]
    return [
        blob(kind="value", serde_type=type_, data=chunk, more=i < len(chunks) - 1)
        for i, chunk in enumerate(chunks)
    ]
