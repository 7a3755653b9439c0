"""The DeltaChannel history of :class:`~._langgraph_saver.JournalSaver`: LangGraph's walk of
a checkpoint's parent chain, ending where the chain comes back to a checkpoint it visited.

A ``put`` of an existing checkpoint id under a new parent replaces the parent, as LangGraph's
SqliteSaver and InMemorySaver do (PostgresSaver keeps the first parent; none of them refuses
the put), so a checkpoint put again under its own descendant makes the chain a loop. LangGraph's
default walk (``BaseCheckpointSaver.get_delta_channel_history``) then never returns; this
one stops at the first checkpoint it reaches twice, as SqliteSaver's walk does, and returns
what it collected on the way.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    CheckpointTuple,
    DeltaChannelHistory,
    PendingWrite,
    get_checkpoint_id,
)

from ._journal_bridge import JournalBridge

__all__ = ["DeltaHistoryWalk"]


class DeltaHistoryWalk:
    """JournalSaver's ``get_delta_channel_history`` and its async twin (a base listed before
    ``BaseCheckpointSaver``): the walk over ``_get_tuple`` that LangGraph's default makes over
    ``get_tuple``, each ancestor visited once."""

    _bridge: JournalBridge

    async def _get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        raise NotImplementedError  # pragma: no cover - JournalSaver's

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._bridge.run(functools.partial(self._delta_history, config, channels))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await self._bridge.arun(functools.partial(self._delta_history, config, channels))

    async def _delta_history(
        self, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        if not channels:
            return {}
        collected: dict[str, list[PendingWrite]] = {channel: [] for channel in channels}
        seeds: dict[str, Any] = {}
        remaining = set(channels)
        target = await self._get_tuple(config)
        visited = {get_checkpoint_id(target.config)} if target is not None else set()
        cursor = target.parent_config if target is not None else None
        while cursor is not None and remaining:
            checkpoint_id = get_checkpoint_id(cursor)
            if checkpoint_id in visited:
                break  # a checkpoint put again under its descendant: the chain loops here
            visited.add(checkpoint_id)
            found = await self._get_tuple(cursor)
            if found is None:
                break
            for write in reversed(found.pending_writes or ()):
                if write[1] in remaining:
                    collected[write[1]].append(write)
            values = found.checkpoint["channel_values"]
            for channel in [channel for channel in remaining if channel in values]:
                seeds[channel] = values[channel]
                remaining.discard(channel)
            cursor = found.parent_config
        result: dict[str, DeltaChannelHistory] = {}
        for channel in channels:
            entry: DeltaChannelHistory = {"writes": collected[channel][::-1]}
            if channel in seeds:
                entry["seed"] = seeds[channel]
            result[channel] = entry
        return result
