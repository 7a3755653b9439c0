"""The agent context materialized in chunks, so a new reader need not refold the journal.

A materialization is one append, written by the agent runtime (runtime-only events):

- :class:`ContextChunk` events, each a bounded run of one sequence of the state (the
  system lane's items, the history's, or the request offsets), by chunk index;
- a :class:`ContextMaterialized` manifest: the projection cursor (``through``, the last
  event folded), the lifecycle metadata (every other field of the state) and a reference
  to each chunk. A chunk an earlier materialization wrote is referenced, not written
  again, so only the chunks that changed (the tail, or everything after a compaction)
  are rewritten: no stored value grows with the stream.

It is a cache of the fold, not a checkpoint: it holds exactly the agent context folded
through ``through``, so a read that starts from it and folds the events after the cursor
equals a fold from the start, and request rebuilds and ``verify`` still fold the events
alone. A manifest that cannot be used (another writer's, another fold version or state
shape, a chunk missing or not the one named, a cursor no longer in the history) is
skipped, and the read folds from the start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..canonical import canonical_json, sha256_hex
from ..errors import ContextfoldError, InvalidInputError
from ..events import Event, RawEvent, StoredEvent
from ..folds.fold import Fold, FoldBase
from ..store.base import Store
from .state import AGENT_WRITER, AgentContextState, ContextItem

__all__ = [
    "CHUNK_BYTES",
    "CHUNK_ITEMS",
    "CHUNK_OFFSETS",
    "MAX_BATCHES",
    "ChunkRef",
    "ContextChunk",
    "ContextMaterialized",
    "Lane",
    "SnapshotFold",
    "load_materialized",
    "plan_materialization",
    "restore_state",
    "snapshot_event",
]

S = TypeVar("S")

log = logging.getLogger("contextfold.context")

Lane = Literal["system", "history", "requests"]
"""The sequences of the state stored in chunks: the two lanes and the request offsets."""
_LANES: tuple[Lane, ...] = ("system", "history", "requests")
_FIELDS = {"system": "system", "history": "history", "requests": "request_offsets"}

CHUNK_ITEMS = 256
"""The most items of one lane in one chunk."""
CHUNK_BYTES = 256 * 1024
"""The most bytes of items' JSON in one chunk (a single bigger item is a chunk alone)."""
CHUNK_OFFSETS = 4096
"""The most request offsets in one chunk."""
MAX_BATCHES = 8
"""The most appends whose chunks one manifest references: a load costs one store read per
append, so a materialization that would reference more rewrites every chunk."""
_TRIED = 3  # newest manifests a load tries before it folds from the start


class ChunkRef(BaseModel):
    """Where a chunk of the manifest is: the manifest it was appended with, counted back."""

    model_config = ConfigDict(frozen=True)

    lane: Lane
    index: int = Field(ge=0)
    sha256: str
    """SHA-256 of the chunk's canonical JSON, also stored in the chunk: names that chunk."""
    batch: str | None = None
    """The cursor of the manifest appended with the chunk; None: this manifest."""
    back: int = Field(ge=1)
    """The chunk's place before that manifest among chunk events: 1 is the one right before."""


class ContextChunk(Event, type="contextfold.agent/context-chunk", runtime_only=True):
    """One chunk of a materialized agent context: items of a lane, or request offsets."""

    lane: Lane
    index: int = Field(ge=0)
    sha256: str
    items: tuple[ContextItem, ...] = ()
    offsets: tuple[int, ...] = ()


class ContextMaterialized(Event, type="contextfold.agent/context-materialized", runtime_only=True):
    """The manifest of a materialized agent context (see the module)."""

    fold_version: int = Field(ge=1)
    through: str | None
    """The cursor of the last event the materialized state folded (None: none yet)."""
    state: dict[str, Any]
    """The state's fields other than its chunked sequences, as JSON."""
    chunks: tuple[ChunkRef, ...]


@dataclass(frozen=True, slots=True)
class _Chunk:
    lane: Lane
    index: int
    sha256: str
    values: tuple[Any, ...]


def _pack(
    lane: Lane, values: Sequence[Any], encoded: Sequence[bytes], most: int, most_bytes: int
) -> list[_Chunk]:
    """Greedy packing from the start: whether a chunk closes depends only on its own items,
    so an unchanged prefix packs into the same chunks (as a lane grows, only its last
    chunk changes)."""
    bounds: list[tuple[int, int]] = []
    start, size = 0, 0
    for index, data in enumerate(encoded):
        if index > start and (index - start >= most or size + len(data) > most_bytes):
            bounds.append((start, index))
            start, size = index, 0
        size += len(data)
    if start < len(values):
        bounds.append((start, len(values)))
    chunks: list[_Chunk] = []
    for number, (begin, end) in enumerate(bounds):
        body = b"[" + b",".join(encoded[begin:end]) + b"]"
        digest = sha256_hex(lane.encode() + b"\x00" + body)
        chunks.append(_Chunk(lane, number, digest, tuple(values[begin:end])))
    return chunks


def _chunks(state: AgentContextState, items: int, most_bytes: int, offsets: int) -> list[_Chunk]:
    chunks: list[_Chunk] = []
    for lane in ("system", "history"):
        lane_items: tuple[ContextItem, ...] = getattr(state, lane)
        encoded = [canonical_json(item.model_dump(mode="json")) for item in lane_items]
        chunks += _pack(lane, lane_items, encoded, items, most_bytes)
    requests = state.request_offsets
    encoded_offsets = [str(offset).encode() for offset in requests]
    chunks += _pack("requests", requests, encoded_offsets, offsets, most_bytes)
    return chunks


def _lifecycle(state: AgentContextState) -> dict[str, Any]:
    return state.model_dump(mode="json", exclude=set(_FIELDS.values()))


def plan_materialization(
    state: AgentContextState,
    through: str | None,
    *,
    fold_version: int,
    previous: ContextMaterialized | None = None,
    previous_cursor: str | None = None,
    chunk_items: int = CHUNK_ITEMS,
    chunk_bytes: int = CHUNK_BYTES,
    chunk_offsets: int = CHUNK_OFFSETS,
) -> tuple[tuple[ContextChunk, ...], ContextMaterialized]:
    """The chunk events to append and the manifest to append after them (one append, in
    this order), for ``state`` folded through ``through``. Pure.

    Chunks equal to ones ``previous`` (the newest manifest, stored at ``previous_cursor``)
    references are referenced again instead of written, unless that would reference
    more than :data:`MAX_BATCHES` appends. ``chunk_*`` bound each chunk (items of a lane,
    bytes of their JSON, request offsets).
    """
    planned = _chunks(state, chunk_items, chunk_bytes, chunk_offsets)
    known: dict[tuple[str, int, str], ChunkRef] = {}
    if previous is not None and previous_cursor is not None:
        for ref in previous.chunks:
            batch = ref.batch if ref.batch is not None else previous_cursor
            known[(ref.lane, ref.index, ref.sha256)] = ref.model_copy(update={"batch": batch})
    reused = {
        key: known[key] for key in ((c.lane, c.index, c.sha256) for c in planned) if key in known
    }
    if len({ref.batch for ref in reused.values()}) >= MAX_BATCHES:
        reused = {}
    fresh = [c for c in planned if (c.lane, c.index, c.sha256) not in reused]
    refs: list[ChunkRef] = []
    events: list[ContextChunk] = []
    for chunk in planned:
        key = (chunk.lane, chunk.index, chunk.sha256)
        if key in reused:
            refs.append(reused[key])
            continue
        back = len(fresh) - len(events)
        refs.append(ChunkRef(lane=chunk.lane, index=chunk.index, sha256=chunk.sha256, back=back))
        values = {"offsets": chunk.values} if chunk.lane == "requests" else {"items": chunk.values}
        events.append(
            ContextChunk(lane=chunk.lane, index=chunk.index, sha256=chunk.sha256, **values)
        )
    manifest = ContextMaterialized(
        fold_version=fold_version, through=through, state=_lifecycle(state), chunks=tuple(refs)
    )
    return tuple(events), manifest


def restore_state(
    fold: FoldBase[AgentContextState],
    manifest: ContextMaterialized,
    chunks: Iterable[ContextChunk],
) -> AgentContextState:
    """The state a manifest and its chunks hold, deep-frozen. Raises InvalidInputError when a
    chunk is not the one named, one is missing, or the fields are not the state's."""
    by_key = {(c.lane, c.index): c for c in chunks}
    values: dict[str, list[Any]] = {field: [] for field in _FIELDS.values()}
    for lane in _LANES:
        refs = sorted((r for r in manifest.chunks if r.lane == lane), key=lambda r: r.index)
        if [r.index for r in refs] != list(range(len(refs))):
            raise InvalidInputError(f"the {lane} chunks are not numbered 0..{len(refs) - 1}")
        for ref in refs:
            chunk = by_key.get((lane, ref.index))
            if chunk is None or chunk.sha256 != ref.sha256:
                raise InvalidInputError(f"{lane} chunk {ref.index} is missing or not the one named")
            values[_FIELDS[lane]] += chunk.offsets if lane == "requests" else chunk.items
    expected = set(AgentContextState.model_fields) - set(_FIELDS.values())
    if set(manifest.state) != expected:
        raise InvalidInputError(
            f"the manifest's fields {sorted(manifest.state)} are not the state's"
        )
    return fold.decode_state({**manifest.state, **values})


async def _read_chunks(
    store: Store, namespace: str, stream: str, manifest: ContextMaterialized, cursor: str
) -> list[ContextChunk]:
    """The chunks a manifest stored at ``cursor`` references: one read per append."""
    wanted: dict[str, list[ChunkRef]] = {}
    for ref in manifest.chunks:
        wanted.setdefault(ref.batch if ref.batch is not None else cursor, []).append(ref)
    found: list[ContextChunk] = []
    for batch, refs in wanted.items():
        stored = await store.latest(
            namespace,
            stream,
            [ContextChunk.event_type],
            before=batch,
            limit=max(ref.back for ref in refs),
        )
        for ref in refs:
            if ref.back > len(stored) or stored[ref.back - 1].meta.actor != AGENT_WRITER:
                raise InvalidInputError(f"{ref.lane} chunk {ref.index} is not in the stream")
            found.append(ContextChunk.model_validate_json(stored[ref.back - 1].data))
    return found


async def _restore(
    fold: FoldBase[AgentContextState],
    store: Store,
    namespace: str,
    stream: str,
    stored: StoredEvent,
) -> tuple[AgentContextState, str | None]:
    if stored.meta.actor != AGENT_WRITER:
        raise InvalidInputError(f"written by {stored.meta.actor!r}, not the agent")
    manifest = ContextMaterialized.model_validate_json(stored.data)
    if manifest.fold_version != fold.version:
        raise InvalidInputError(f"fold version {manifest.fold_version}, not {fold.version}")
    if manifest.through is not None and not await store.contains(
        namespace, stream, manifest.through
    ):
        raise InvalidInputError(f"its cursor {manifest.through!r} is not in this history")
    chunks = await _read_chunks(store, namespace, stream, manifest, stored.cursor)
    return restore_state(fold, manifest, chunks), manifest.through


async def load_materialized(
    fold: FoldBase[AgentContextState], store: Store, namespace: str, stream: str
) -> tuple[AgentContextState, str | None] | None:
    """The newest usable materialization of ``stream``: the state and the cursor to fold
    on from; None when there is none (each unusable one is logged and skipped)."""
    for stored in await store.latest(
        namespace, stream, [ContextMaterialized.event_type], limit=_TRIED
    ):
        try:
            return await _restore(fold, store, namespace, stream, stored)
        except (ValueError, ValidationError, ContextfoldError) as exc:
            log.warning(
                "materialized context %s@%d not used (the read folds on from an older one or "
                "from the start): %s",
                stream,
                stored.position,
                str(exc).splitlines()[0],
            )
    return None


class SnapshotFold(Fold[S]):
    """A fold with a small, bounded state that takes no checkpoints, whose cold reads start
    from the newest snapshot the agent runtime stored of it (:func:`snapshot_event`): its
    state through a cursor, exactly, never a replacement. Rebuilds that fold the events
    alone agree with it. (The agent context, which grows, is stored in chunks instead.)"""

    @property
    def snapshot_type(self) -> str:
        """The stored type name of this fold's snapshots: a runtime-only type."""
        return f"contextfold.agent/snapshot/{self.name}@{self.version}"

    async def restore(
        self, store: Store, namespace: str, stream: str
    ) -> tuple[S, str | None] | None:
        for stored in await store.latest(namespace, stream, [self.snapshot_type], limit=_TRIED):
            try:
                if stored.meta.actor != AGENT_WRITER:
                    raise InvalidInputError(f"written by {stored.meta.actor!r}, not the agent")
                payload = stored.payload
                through = payload["through"]
                if through is not None and not await store.contains(namespace, stream, through):
                    raise InvalidInputError(f"its cursor {through!r} is not in this history")
                return self.decode_state(payload["state"]), through
            except (ValueError, ValidationError, KeyError, TypeError, ContextfoldError) as exc:
                log.warning(
                    "snapshot of %s %s@%d not used: %s",
                    self.name,
                    stream,
                    stored.position,
                    str(exc).splitlines()[0],
                )
        return None


def snapshot_event(fold: SnapshotFold[S], state: S, through: str | None) -> RawEvent:
    """The snapshot of ``fold``'s ``state`` folded through ``through``, to append as the
    agent (journal meta actor ``agent``). Raises CheckpointError when it does not encode."""
    return RawEvent(fold.snapshot_type, {"through": through, "state": fold.encode_state(state)})
