"""Decoded list channels of the LangGraph saver, materialized per version (a bounded cache).

A list channel's value at one version is built from the newest decoded list of its delta
chain this process holds: the items both versions share are the same objects, and only the
items the chain added are decoded. Every read hands back a new list, so a reducer that
changes the list it is given never changes the cache. Items that are not safe to share
(anything but a message with an id or an immutable scalar) are decoded afresh on every
read: LangGraph assigning a missing message id in place, or a node editing a dict it was
handed, never reaches the next read. Messages with an id are shared between reads, as
LangGraph's channels share them between steps: they are values (``add_messages`` replaces
a message by id, it never edits one).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

from ._langgraph_index import ThreadIndex
from ._langgraph_records import BlobKey, Item, RecordReader

__all__ = ["DecodedLists", "shareable"]

Load = Callable[[Item], Any]

_SCALARS = (str, int, float, bool, bytes, type(None))


def shareable(value: object) -> bool:
    """Whether one decoded object may be handed to every read: a message with an id (the
    only in-place edit LangGraph makes to a message is giving it a missing id) or an
    immutable scalar."""
    if type(value) in _SCALARS:
        return True
    return isinstance(value, BaseMessage) and bool(value.id)


def _size(items: tuple[Item, ...]) -> int:
    return sum(len(t) + len(d) for t, d in items)


@dataclass(frozen=True, slots=True)
class _Decoded:
    values: tuple[Any, ...]
    fresh: tuple[tuple[int, Item], ...]
    """Positions decoded anew on every read, with their serialized item."""
    size: int


class DecodedLists:
    """The decoded value of list channels by (stream, blob nonce); LRU bounded by the
    serialized size of the lists it holds (``max_bytes``; 0 keeps none)."""

    def __init__(self, records: RecordReader, load: Load, max_bytes: int) -> None:
        self._records = records
        self._load = load
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, str], _Decoded] = OrderedDict()
        self._bytes = 0

    async def read(self, stream: str, index: ThreadIndex, key: BlobKey) -> list[Any]:
        """A new list holding the channel's value at ``key`` (a complete ``items`` blob),
        equal to decoding every stored item. Raises what ``RecordReader.items`` raises."""
        nonce = index.blobs[key].nonce
        entry = self._entries.get((stream, nonce))
        if entry is None:
            entry = await self._build(stream, index, key)
        else:
            self._entries.move_to_end((stream, nonce))
        values = list(entry.values)
        for position, item in entry.fresh:
            values[position] = self._load(item)
        return values

    async def _build(self, stream: str, index: ThreadIndex, key: BlobKey) -> _Decoded:
        items = await self._records.items(stream, index, key)
        ancestor, shared = self._ancestor(stream, index, key)
        load = self._load
        added = [load(item) for item in items[shared:]]
        fresh = [(shared + i, items[shared + i]) for i, v in enumerate(added) if not shareable(v)]
        if ancestor is None or shared == 0:
            entry = _Decoded(tuple(added), tuple(fresh), _size(items))
        else:
            kept = [(i, item) for i, item in ancestor.fresh if i < shared]
            whole = shared == len(ancestor.values)
            size = ancestor.size + _size(items[shared:]) if whole else _size(items)
            entry = _Decoded((*ancestor.values[:shared], *added), (*kept, *fresh), size)
        self._put((stream, index.blobs[key].nonce), entry)
        return entry

    def _ancestor(
        self, stream: str, index: ThreadIndex, key: BlobKey
    ) -> tuple[_Decoded | None, int]:
        """The nearest decoded list ``key``'s delta chain extends, and how many of its first
        items the list at ``key`` keeps unchanged."""
        shared: int | None = None
        current = key
        seen: set[BlobKey] = set()
        while True:
            blob = index.blobs.get(current)
            if blob is None or blob.kind != "items" or not blob.complete or current in seen:
                return None, 0
            seen.add(current)
            if current != key:
                found = self._entries.get((stream, blob.nonce))
                if found is not None:
                    assert shared is not None
                    return found, min(shared, len(found.values))
            shared = blob.keep if shared is None else min(shared, blob.keep)
            if blob.base is None or shared == 0:
                return None, 0
            current = (key[0], key[1], blob.base)

    def _put(self, key: tuple[str, str], entry: _Decoded) -> None:
        if entry.size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.size
        self._entries[key] = entry
        self._bytes += entry.size
        while self._bytes > self.max_bytes:
            _, dropped = self._entries.popitem(last=False)
            self._bytes -= dropped.size
