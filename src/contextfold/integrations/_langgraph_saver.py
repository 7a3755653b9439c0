"""JournalSaver: LangGraph checkpoints on a contextfold journal, one stream per thread.

Storage grows with what changed, not with the size of the state: a channel's value is
written once per version (unchanged channels are never written again), and a list value
(a message list) is stored as the items it gained over the channel's previous list. Reads
are indexed: :data:`~._langgraph_index.THREAD_INDEX` folds each thread incrementally
(cached), and every record it names is fetched with one indexed read. Lists are rebuilt from
their delta chain, from the newest list this process already holds (a bounded cache), and
kept decoded per version: a read decodes only the items its version added
(:mod:`._langgraph_lists`).

Deletions keep a record, since the journal is append-only: ``delete_thread`` and
``prune(strategy="delete")`` append a ThreadCleared (or delete the stream with
``hard_delete=True``), ``prune(strategy="keep_latest")`` and ``delete_for_runs`` append a
CheckpointsRetracted naming what is no longer seen.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import secrets
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Literal, cast

import orjson
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from pyrsistent import pmap

from ..canonical import encode_checked
from ..errors import InvalidInputError, InvalidStreamNameError, PayloadError
from ..events import Event, RawEvent
from ..journal import Journal, SyncJournal
from ..journal.encode import check_stream
from ._journal_bridge import JournalBridge
from ._langgraph_delta import DeltaHistoryWalk
from ._langgraph_index import (
    RECORD_TYPES,
    THREAD_INDEX,
    BlobEntry,
    ChannelBlob,
    CheckpointEntry,
    CheckpointPut,
    CheckpointsRetracted,
    ThreadCleared,
    ThreadIndex,
    Typed,
    WriteRecord,
    WritesPut,
    version_key,
    visible_record,
)
from ._langgraph_lists import DecodedLists
from ._langgraph_records import (
    BlobKey,
    Item,
    RecordReader,
    Stale,
    decode,
    item_parts,
    parts,
    value_parts,
    write_size,
)

__all__ = ["JournalSaver"]

_Selected = tuple[str, str, ThreadIndex, CheckpointEntry]

_PAGE = 16  # checkpoint tuples built per round trip by list()
_RETRIES = 3  # reads of a thread deleted meanwhile, before it counts as gone
_COPY_BATCH = 1000


class JournalSaver(DeltaHistoryWalk, BaseCheckpointSaver[str]):
    """A LangGraph checkpointer storing every thread as a stream of a contextfold journal.

    ``journal``: a :class:`~contextfold.SyncJournal` (sync and async graphs) or an async
    :class:`~contextfold.Journal` (async graphs; sync calls only from other threads while its
    loop runs). Thread ``t`` is the stream ``stream_prefix + t``. ``hard_delete=True`` makes
    ``delete_thread`` and ``prune(strategy="delete")`` delete the stream instead of appending
    a ThreadCleared record. ``cache_bytes`` bounds the lists kept in memory (serialized, to
    extend and rebuild message lists without reading their whole history, and decoded, to
    hand them back without decoding them again), each.

    Raises InvalidInputError for a bad option, a config without ``thread_id`` or a thread id
    that cannot name a stream; PayloadError (naming thread, checkpoint and record) when a
    value is over the journal's payload limit; nothing is written then.
    """

    def __init__(
        self,
        journal: Journal | SyncJournal,
        *,
        serde: SerializerProtocol | None = None,
        stream_prefix: str = "langgraph/",
        hard_delete: bool = False,
        cache_bytes: int = 64 * 2**20,
    ) -> None:
        super().__init__(serde=serde)
        self._bridge = JournalBridge(journal, what="JournalSaver")
        if not isinstance(stream_prefix, str):
            raise InvalidInputError(f"stream_prefix must be a str, got {stream_prefix!r}")
        try:
            check_stream(f"{stream_prefix}thread")
        except InvalidStreamNameError as exc:
            raise InvalidStreamNameError(f"stream_prefix {stream_prefix!r}: {exc}") from exc
        if not isinstance(hard_delete, bool):
            raise InvalidInputError(f"hard_delete must be True or False, got {hard_delete!r}")
        if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
            raise InvalidInputError(f"cache_bytes must be an int >= 0, got {cache_bytes!r}")
        self.stream_prefix = stream_prefix
        self.hard_delete = hard_delete
        self._records = RecordReader(self._bridge.journal, cache_bytes)
        self._lists = DecodedLists(self._records, self._load, cache_bytes)

    @property
    def journal(self) -> Journal:
        """The async journal the saver writes to."""
        return self._bridge.journal

    def stream_of(self, thread_id: object) -> str:
        """The journal stream of a thread. Raises InvalidStreamNameError naming the thread."""
        tid = str(thread_id)
        try:
            return check_stream(self.stream_prefix + tid)
        except InvalidStreamNameError as exc:
            raise InvalidStreamNameError(
                f"thread_id {tid!r} cannot name a journal stream: {exc}"
            ) from exc

    # -- the sync and async protocol ------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._bridge.run(functools.partial(self._get_tuple, config))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._bridge.arun(functools.partial(self._get_tuple, config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        selected = self._bridge.run(functools.partial(self._select, config, filter, before, limit))
        for start in range(0, len(selected), _PAGE):
            page = selected[start : start + _PAGE]
            yield from self._bridge.run(functools.partial(self._tuples, page))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        run = self._bridge.arun
        selected = await run(functools.partial(self._select, config, filter, before, limit))
        for start in range(0, len(selected), _PAGE):
            page = selected[start : start + _PAGE]
            for item in await run(functools.partial(self._tuples, page)):
                yield item

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        work = functools.partial(self._put, config, checkpoint, metadata, new_versions)
        return self._bridge.run(work)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        work = functools.partial(self._put, config, checkpoint, metadata, new_versions)
        return await self._bridge.arun(work)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._bridge.run(functools.partial(self._put_writes, config, writes, task_id, task_path))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        work = functools.partial(self._put_writes, config, writes, task_id, task_path)
        await self._bridge.arun(work)

    def delete_thread(self, thread_id: str) -> None:
        self._bridge.run(functools.partial(self._clear, thread_id, "delete_thread"))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._bridge.arun(functools.partial(self._clear, thread_id, "delete_thread"))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._bridge.run(functools.partial(self._delete_for_runs, run_ids))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._bridge.arun(functools.partial(self._delete_for_runs, run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._bridge.run(functools.partial(self._copy, source_thread_id, target_thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._bridge.arun(functools.partial(self._copy, source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._bridge.run(functools.partial(self._prune, thread_ids, strategy))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._bridge.arun(functools.partial(self._prune, thread_ids, strategy))

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A version greater than ``current``, with a random tail: two forks of one parent
        write different values under different versions (a version names one value)."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032d}.{secrets.randbelow(10**16):016d}"

    # -- reading ---------------------------------------------------------------------------------

    def _target(self, config: RunnableConfig) -> tuple[str, str, str]:
        """(thread id, checkpoint namespace, stream) of a config."""
        configurable = config.get("configurable") if isinstance(config, Mapping) else None
        if not isinstance(configurable, Mapping) or configurable.get("thread_id") is None:
            raise InvalidInputError(
                "config['configurable']['thread_id'] is missing: pass "
                '{"configurable": {"thread_id": ...}} to invoke, stream or get_state'
            )
        ns = configurable.get("checkpoint_ns") or ""
        if not isinstance(ns, str):
            raise InvalidInputError(
                f"config['configurable']['checkpoint_ns'] must be a str, got {ns!r}"
            )
        thread_id = str(configurable["thread_id"])
        return thread_id, ns, self.stream_of(thread_id)

    async def _index(self, stream: str) -> ThreadIndex:
        return await self.journal.fold(THREAD_INDEX, stream)

    async def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id, ns, stream = self._target(config)
        wanted = get_checkpoint_id(config)
        for _ in range(_RETRIES):
            index = await self._index(stream)
            checkpoint_id = wanted or index.latest.get(ns)
            entry = index.checkpoints.get((ns, checkpoint_id)) if checkpoint_id else None
            if entry is None:
                return None
            try:
                return await self._tuple(thread_id, stream, index, entry)
            except Stale:
                continue
        return None

    async def _select(
        self,
        config: RunnableConfig | None,
        filter: Mapping[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Sequence[_Selected]:
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidInputError(f"list limit must be an int or None, got {limit!r}")
        if filter is not None and not isinstance(filter, Mapping):
            raise InvalidInputError(f"list filter must be a mapping, got {filter!r}")
        ns: str | None = None
        only: str | None = None
        if config is not None:
            thread_id, _, stream = self._target(config)
            ns = config["configurable"].get("checkpoint_ns")
            only = get_checkpoint_id(config)
            threads = [(thread_id, stream)]
        else:
            infos = await self.journal.list_streams(prefix=self.stream_prefix)
            threads = [(info.stream[len(self.stream_prefix) :], info.stream) for info in infos]
        before_id = get_checkpoint_id(before) if before is not None else None
        selected: list[_Selected] = []
        if limit is not None and limit <= 0:
            return selected
        for thread_id, stream in threads:
            index = await self._index(stream)
            entries = sorted(
                index.checkpoints.values(), key=lambda e: (e.checkpoint_id, e.ns), reverse=True
            )
            for entry in entries:
                if (ns is not None and entry.ns != ns) or (only and entry.checkpoint_id != only):
                    continue
                if before_id and entry.checkpoint_id >= before_id:
                    continue
                if filter and not _matches(entry.metadata, filter):
                    continue
                selected.append((thread_id, stream, index, entry))
                if limit is not None and len(selected) >= limit:
                    return selected
        return selected

    async def _tuples(self, page: Sequence[_Selected]) -> Sequence[CheckpointTuple]:
        built = []
        for thread_id, stream, index, entry in page:
            try:
                built.append(await self._tuple(thread_id, stream, index, entry))
            except Stale:  # deleted since it was selected: no longer listed
                continue
        return built

    async def _tuple(
        self, thread_id: str, stream: str, index: ThreadIndex, entry: CheckpointEntry
    ) -> CheckpointTuple:
        put = decode(await self._records.fetch(stream, entry.at), CheckpointPut)
        skeleton = self._load((put.checkpoint.type, put.checkpoint.data))
        ns = entry.ns
        wanted: list[tuple[str, BlobKey, BlobEntry]] = []
        for channel, version in skeleton.get("channel_versions", {}).items():
            key = (ns, channel, version_key(version))
            blob = index.blobs.get(key)
            if blob is not None and blob.complete and blob.kind != "empty":
                wanted.append((channel, key, blob))
        values = await asyncio.gather(
            *(self._value(stream, index, key, blob) for _, key, blob in wanted)
        )
        writes = sorted(
            index.writes.get((ns, entry.checkpoint_id), pmap()).values(),
            key=lambda w: writes_sort_key(w.task_path, w.task_id, w.idx),
        )
        events = await self._records.fetch_all(stream, [w.at for w in writes])
        decoded = {gp: decode(event, WritesPut) for gp, event in events.items()}
        pending: list[PendingWrite] = []
        for w in writes:
            value = decoded[w.at.global_position].writes[w.slot].value
            pending.append((w.task_id, w.channel, self._load((value.type, value.data))))
        channel_values = {c: v for (c, _, _), v in zip(wanted, values, strict=True)}
        checkpoint = cast(Checkpoint, {**skeleton, "channel_values": channel_values})
        parent = (
            RunnableConfig(
                configurable={
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": entry.parent_id,
                }
            )
            if entry.parent_id
            else None
        )
        return CheckpointTuple(
            config=_config(thread_id, ns, entry.checkpoint_id),
            checkpoint=checkpoint,
            metadata=cast(CheckpointMetadata, put.metadata),
            parent_config=parent,
            pending_writes=pending,
        )

    async def _value(self, stream: str, index: ThreadIndex, key: BlobKey, blob: BlobEntry) -> Any:
        if blob.kind == "items":
            return await self._lists.read(stream, index, key)
        return self._load(await self._records.value(stream, blob))

    def _load(self, item: Item) -> Any:
        return self.serde.loads_typed((item[0], base64.b64decode(item[1])))

    def _dump(self, value: Any) -> Item:
        type_, data = self.serde.dumps_typed(value)
        return type_, base64.b64encode(data).decode("ascii")

    # -- writing ---------------------------------------------------------------------------------

    def _part_bytes(self) -> int:
        return max(4096, self.journal.max_payload_bytes // 2)

    async def _append(self, stream: str, records: Sequence[Event | RawEvent], where: str) -> None:
        try:
            await self.journal.append(stream, records)
        except PayloadError as exc:
            raise PayloadError(f"{where}: {exc}; nothing was written") from exc

    async def _put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id, ns, stream = self._target(config)
        checkpoint_id = checkpoint["id"]
        where = f"thread {thread_id!r} checkpoint {checkpoint_id!r}"
        index = await self._index(stream)
        values = checkpoint.get("channel_values", {})
        records: list[ChannelBlob | CheckpointPut] = []
        lists: list[tuple[str, tuple[Item, ...]]] = []
        for channel, version in new_versions.items():
            if isinstance(version, bool) or not isinstance(version, (int, float, str)):
                raise InvalidInputError(
                    f"{where}: channel {channel!r} version {version!r} must be an int, float "
                    "or str; nothing was written"
                )
            known = index.blobs.get((ns, channel, version_key(version)))
            if known is not None and known.complete:
                continue  # a version names one value, stored once
            nonce = secrets.token_hex(8)
            blob = functools.partial(
                ChannelBlob, ns=ns, channel=channel, version=version, nonce=nonce
            )
            if channel not in values:
                records.append(blob(kind="empty"))
            elif type(values[channel]) is list:
                items = tuple(self._dump(v) for v in values[channel])
                base, keep = await self._records.kept(stream, index, ns, channel, items)
                records.extend(item_parts(blob, items[keep:], base, keep, self._part_bytes()))
                lists.append((nonce, items))
            else:
                item = self._dump(values[channel])
                records.extend(value_parts(blob, item, self._part_bytes()))
        meta = dict(get_serializable_checkpoint_metadata(config, metadata))
        try:
            encode_checked(meta, where="metadata")
        except ValueError as exc:
            raise PayloadError(f"{where}: {exc}; nothing was written") from exc
        skeleton = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        type_, data = self._dump(skeleton)
        parent_id = config["configurable"].get("checkpoint_id")
        records.append(
            CheckpointPut(
                ns=ns,
                checkpoint_id=checkpoint_id,
                parent_id=parent_id,
                checkpoint=Typed(type=type_, data=data),
                metadata=meta,
            )
        )
        await self._append(stream, records, where)
        for nonce, items in lists:
            self._records.remember(stream, nonce, items)
        return _config(thread_id, ns, checkpoint_id)

    async def _put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str,
    ) -> None:
        thread_id, ns, stream = self._target(config)
        checkpoint_id = config["configurable"].get("checkpoint_id")
        if not isinstance(checkpoint_id, str) or not checkpoint_id:
            raise InvalidInputError(
                f"put_writes on thread {thread_id!r}: config['configurable']['checkpoint_id'] "
                f"must name the checkpoint the writes belong to, got {checkpoint_id!r}"
            )
        index = await self._index(stream)
        known = index.writes.get((ns, checkpoint_id), pmap())
        fresh = []
        for i, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, i)
            if idx >= 0 and (task_id, idx) in known:
                continue  # a retried task: its writes are recorded once
            type_, data = self._dump(value)
            fresh.append(WriteRecord(idx=idx, channel=channel, value=Typed(type=type_, data=data)))
        if not fresh:
            return
        records = [
            WritesPut(
                ns=ns,
                checkpoint_id=checkpoint_id,
                task_id=task_id,
                task_path=task_path,
                writes=part,
            )
            for part, _ in parts(tuple(fresh), self._part_bytes(), write_size)
        ]
        where = f"thread {thread_id!r} checkpoint {checkpoint_id!r} task {task_id!r}"
        await self._append(stream, records, where)

    # -- deleting and copying --------------------------------------------------------------------

    async def _clear(self, thread_id: str, reason: Literal["delete_thread", "prune"]) -> None:
        stream = self.stream_of(thread_id)
        if self.hard_delete:
            await self.journal.delete_stream(stream)
            return
        index = await self._index(stream)
        if index.checkpoints or index.blobs or index.writes:
            await self.journal.append(stream, ThreadCleared(reason=reason))

    async def _delete_for_runs(self, run_ids: Sequence[str]) -> None:
        if isinstance(run_ids, str):
            raise InvalidInputError(
                f"delete_for_runs takes a sequence of run ids, got the str {run_ids!r}"
            )
        wanted = {str(run_id) for run_id in run_ids}
        if not wanted:
            return
        for info in await self.journal.list_streams(prefix=self.stream_prefix):
            index = await self._index(info.stream)
            victims = sorted(
                (e.ns, e.checkpoint_id) for e in index.checkpoints.values() if e.run_id in wanted
            )
            if victims:
                runs = {e.run_id for e in index.checkpoints.values() if e.run_id in wanted}
                record = CheckpointsRetracted(
                    checkpoints=tuple(victims),
                    reason="delete_for_runs",
                    run_ids=tuple(sorted(r for r in runs if r is not None)),
                )
                await self.journal.append(info.stream, record)

    async def _prune(self, thread_ids: Sequence[str], strategy: str) -> None:
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInputError(
                f"prune strategy {strategy!r} is unknown: use 'keep_latest' or 'delete'"
            )
        if isinstance(thread_ids, str):
            raise InvalidInputError(f"prune takes a sequence of thread ids, got {thread_ids!r}")
        for thread_id in thread_ids:
            if strategy == "delete":
                await self._clear(str(thread_id), "prune")
                continue
            stream = self.stream_of(thread_id)
            index = await self._index(stream)
            kept = set(index.latest.items())
            victims = sorted(key for key in index.checkpoints if key not in kept)
            if victims:
                record = CheckpointsRetracted(checkpoints=tuple(victims), reason="prune")
                await self.journal.append(stream, record)

    async def _copy(self, source_thread_id: str, target_thread_id: str) -> None:
        source, target = self.stream_of(source_thread_id), self.stream_of(target_thread_id)
        if source == target:
            raise InvalidInputError(
                f"copy_thread: source and target are the same thread {source_thread_id!r}"
            )
        index = await self._index(source)
        if not index.checkpoints:
            return
        batch: list[RawEvent] = []
        cursor = index.cleared
        where = f"copy_thread {source_thread_id!r} -> {target_thread_id!r}"
        while True:
            page = await self.journal.read(source, after=cursor, types=RECORD_TYPES, limit=1000)
            for event in page.events:
                copied = visible_record(event, index)
                if copied is not None:
                    batch.append(copied)
                if len(batch) >= _COPY_BATCH:
                    await self._append(target, batch, where)
                    batch = []
            if not page.more:
                break
            cursor = page.cursor
        if batch:
            await self._append(target, batch, where)


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return RunnableConfig(
        configurable={"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
    )


def _matches(metadata: bytes, query: Mapping[str, Any]) -> bool:
    stored = orjson.loads(metadata)
    return all(stored.get(key) == value for key, value in query.items())
