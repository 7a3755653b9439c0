"""What the LangGraph checkpoint saver records in the journal, and the fold that indexes it.

One stream per LangGraph thread holds five kinds of records:

- :class:`ChannelBlob`: one channel's value at one version, written once per (namespace,
  channel, version). A list value is stored as a delta of the newest stored list of that
  channel (``keep`` items of ``base``, then ``items``), so a growing message list costs what
  it grew by, not its whole length again. A large value is split over several parts.
- :class:`CheckpointPut`: a checkpoint without its channel values (they are blobs), its
  metadata and its parent (forks are parent pointers).
- :class:`WritesPut`: pending writes of one task against one checkpoint.
- :class:`CheckpointsRetracted` and :class:`ThreadCleared`: what ``prune``,
  ``delete_for_runs`` and ``delete_thread`` leave in the append-only journal: the records
  stay, the saver no longer sees them.

:data:`THREAD_INDEX` folds a stream into a :class:`ThreadIndex`: where each record is (the
cursor right before it, so one indexed read fetches it), never the values themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field
from pyrsistent import PMap, pmap

from ..events import Envelope, Event, RawEvent, StoredEvent
from ..folds.fold import Fold

__all__ = [
    "RECORD_TYPES",
    "THREAD_INDEX",
    "BlobEntry",
    "ChannelBlob",
    "CheckpointEntry",
    "CheckpointPut",
    "CheckpointsRetracted",
    "Located",
    "ThreadCleared",
    "ThreadIndex",
    "Typed",
    "WriteEntry",
    "WriteRecord",
    "WritesPut",
    "version_key",
    "visible_record",
]

Version = int | float | str
"""A LangGraph channel version, stored as the JSON value it is."""


def version_key(version: Version) -> str:
    """The index key of a version: its JSON text (``1``, ``1.5`` and ``"1"`` stay apart)."""
    return orjson.dumps(version).decode()


class Typed(BaseModel):
    """A value serialized by the saver's ``serde``: its type tag and base64 bytes."""

    model_config = ConfigDict(frozen=True)
    type: str
    data: str


class ChannelBlob(Event, type="contextfold.langgraph/channel-blob", runtime_only=True):
    """One part of a channel's value at one version (``more``: the next part follows).

    ``kind``: ``value`` (``serde_type`` and base64 ``data``, concatenated over the parts),
    ``items`` (a list: the first ``keep`` items of the list at version ``base``, then
    ``items`` of every part) or ``empty`` (the channel has a version but no value).
    """

    ns: str
    channel: str
    version: Version
    kind: Literal["value", "items", "empty"]
    nonce: str
    """Unique per blob: names it in the saver's in-process cache."""
    serde_type: str = ""
    data: str = ""
    base: Version | None = None
    keep: int = 0
    items: tuple[tuple[str, str], ...] = ()
    more: bool = False


class CheckpointPut(Event, type="contextfold.langgraph/checkpoint-put", runtime_only=True):
    """A checkpoint without ``channel_values``; a later put of the same id replaces it."""

    ns: str
    checkpoint_id: str
    parent_id: str | None = None
    checkpoint: Typed
    metadata: dict[str, Any] = Field(default_factory=dict)


class WriteRecord(BaseModel):
    """One pending write: its index (negative for LangGraph's special channels)."""

    model_config = ConfigDict(frozen=True)
    idx: int
    channel: str
    value: Typed


class WritesPut(Event, type="contextfold.langgraph/writes-put", runtime_only=True):
    """Pending writes of one task against one checkpoint. A write whose (task, idx) is
    already recorded is ignored, unless its idx is negative (then it replaces)."""

    ns: str
    checkpoint_id: str
    task_id: str
    task_path: str = ""
    writes: tuple[WriteRecord, ...]


class CheckpointsRetracted(
    Event, type="contextfold.langgraph/checkpoints-retracted", runtime_only=True
):
    """These checkpoints (``[ns, checkpoint_id]``) and their writes are no longer seen."""

    checkpoints: tuple[tuple[str, str], ...]
    reason: Literal["prune", "delete_for_runs"]
    run_ids: tuple[str, ...] = ()


class ThreadCleared(Event, type="contextfold.langgraph/thread-cleared", runtime_only=True):
    """Nothing recorded before this is seen any more (a soft ``delete_thread``)."""

    reason: Literal["delete_thread", "prune"]


RECORD_TYPES = tuple(
    cls.event_type
    for cls in (ChannelBlob, CheckpointPut, WritesPut, CheckpointsRetracted, ThreadCleared)
)


@dataclass(frozen=True, slots=True)
class Located:
    """Where a record is: the first ``type`` event after cursor ``after`` of its stream."""

    after: str | None
    global_position: int
    type: str


@dataclass(frozen=True, slots=True)
class CheckpointEntry:
    at: Located
    ns: str
    checkpoint_id: str
    parent_id: str | None
    metadata: bytes
    """The metadata's JSON (bytes: immutable, and decoded only by the list filter)."""
    run_id: str | None


@dataclass(frozen=True, slots=True)
class BlobEntry:
    kind: Literal["value", "items", "empty"]
    nonce: str
    parts: tuple[Located, ...]
    base: str | None
    """The version key of the list this one extends (kind ``items``)."""
    keep: int
    complete: bool


@dataclass(frozen=True, slots=True)
class WriteEntry:
    at: Located
    slot: int
    """Index of the write in its event's ``writes``."""
    task_id: str
    idx: int
    channel: str
    task_path: str


_Writes = PMap[tuple[str, int], WriteEntry]


def _empty() -> PMap[Any, Any]:
    return pmap()


@dataclass(frozen=True, slots=True)
class ThreadIndex:
    """The visible checkpoints, blobs and writes of one thread, by where they are stored."""

    checkpoints: PMap[tuple[str, str], CheckpointEntry] = field(default_factory=_empty)
    latest: PMap[str, str] = field(default_factory=_empty)
    """Namespace -> its greatest checkpoint id."""
    blobs: PMap[tuple[str, str, str], BlobEntry] = field(default_factory=_empty)
    newest_blob: PMap[tuple[str, str], str] = field(default_factory=_empty)
    """(namespace, channel) -> version key of its blob stored last."""
    writes: PMap[tuple[str, str], _Writes] = field(default_factory=_empty)
    last: str | None = None
    """Cursor of the newest record folded: where the next one is found from."""
    cleared: str | None = None
    """Cursor of the newest ThreadCleared: what is visible was recorded after it."""

    def namespace(self, ns: str) -> list[CheckpointEntry]:
        """The checkpoints of one namespace, newest (greatest id) first."""
        found = [entry for (n, _), entry in self.checkpoints.items() if n == ns]
        return sorted(found, key=lambda e: e.checkpoint_id, reverse=True)


THREAD_INDEX: Fold[ThreadIndex] = Fold(
    "langgraph_thread_index", initial=ThreadIndex, checkpoints=False
)


def _at(state: ThreadIndex, env: Envelope[Any]) -> Located:
    return Located(state.last, env.global_position, env.type)


@THREAD_INDEX.on(ChannelBlob)
def _blob(state: ThreadIndex, env: Envelope[ChannelBlob]) -> ThreadIndex:
    p = env.payload
    key = (p.ns, p.channel, version_key(p.version))
    known = state.blobs.get(key)
    if known is not None and (known.complete or known.nonce != p.nonce):
        # First write wins, as in LangGraph's own savers: a version names one value.
        return replace(state, last=env.cursor)
    parts = (*known.parts, _at(state, env)) if known is not None else (_at(state, env),)
    base = version_key(p.base) if p.base is not None else None
    entry = BlobEntry(p.kind, p.nonce, parts, base, p.keep, not p.more)
    newest = state.newest_blob.set(key[:2], key[2]) if entry.complete else state.newest_blob
    return replace(state, blobs=state.blobs.set(key, entry), newest_blob=newest, last=env.cursor)


@THREAD_INDEX.on(CheckpointPut)
def _checkpoint(state: ThreadIndex, env: Envelope[CheckpointPut]) -> ThreadIndex:
    p = env.payload
    run_id = p.metadata.get("run_id")
    entry = CheckpointEntry(
        _at(state, env),
        p.ns,
        p.checkpoint_id,
        p.parent_id,
        orjson.dumps(p.metadata),
        run_id if isinstance(run_id, str) else None,
    )
    latest = state.latest.get(p.ns)
    if latest is None or p.checkpoint_id > latest:
        state = replace(state, latest=state.latest.set(p.ns, p.checkpoint_id))
    checkpoints = state.checkpoints.set((p.ns, p.checkpoint_id), entry)
    return replace(state, checkpoints=checkpoints, last=env.cursor)


@THREAD_INDEX.on(WritesPut)
def _writes(state: ThreadIndex, env: Envelope[WritesPut]) -> ThreadIndex:
    p = env.payload
    key = (p.ns, p.checkpoint_id)
    bucket: _Writes = state.writes.get(key, pmap())
    at = _at(state, env)
    for slot, write in enumerate(p.writes):
        inner = (p.task_id, write.idx)
        if write.idx >= 0 and inner in bucket:
            continue
        bucket = bucket.set(
            inner, WriteEntry(at, slot, p.task_id, write.idx, write.channel, p.task_path)
        )
    return replace(state, writes=state.writes.set(key, bucket), last=env.cursor)


@THREAD_INDEX.on(CheckpointsRetracted)
def _retracted(state: ThreadIndex, env: Envelope[CheckpointsRetracted]) -> ThreadIndex:
    checkpoints, writes, latest = state.checkpoints, state.writes, state.latest
    touched = set()
    for ns, checkpoint_id in env.payload.checkpoints:
        checkpoints = checkpoints.discard((ns, checkpoint_id))
        writes = writes.discard((ns, checkpoint_id))
        touched.add(ns)
    for ns in touched:
        ids = [cid for (n, cid) in checkpoints if n == ns]
        latest = latest.set(ns, max(ids)) if ids else latest.discard(ns)
    return replace(state, checkpoints=checkpoints, writes=writes, latest=latest, last=env.cursor)


@THREAD_INDEX.on(ThreadCleared)
def _cleared(state: ThreadIndex, env: Envelope[ThreadCleared]) -> ThreadIndex:
    return ThreadIndex(last=env.cursor, cleared=env.cursor)


def visible_record(event: StoredEvent, index: ThreadIndex) -> RawEvent | None:
    """A record of a thread as a copy of it gets it (``copy_thread``): what the index still
    sees of it, or None."""
    payload = event.payload
    if event.type == ChannelBlob.event_type:
        return RawEvent(event.type, payload)
    if event.type == CheckpointPut.event_type:
        entry = index.checkpoints.get((payload["ns"], payload["checkpoint_id"]))
        seen = entry is not None and entry.at.global_position == event.global_position
        return RawEvent(event.type, payload) if seen else None
    if event.type == WritesPut.event_type:
        bucket = index.writes.get((payload["ns"], payload["checkpoint_id"]), pmap())
        slots = {w.slot for w in bucket.values() if w.at.global_position == event.global_position}
        if not slots:
            return None
        kept = [w for slot, w in enumerate(payload["writes"]) if slot in slots]
        return RawEvent(event.type, {**payload, "writes": kept})
    return None
