"""Materializing the agent's folds, so a restarted agent starts from stored state instead
of refolding its whole journal.

:func:`materialize_context` stores the agent context in chunks with its cursor
(:mod:`contextfold.context.materialized`), and the small, bounded states of the other
folds the loop reads: the scheduler's as a checkpoint of itself, the dispatched turns' as
a snapshot (it takes no checkpoints). The loop does it every ``materialize_every`` stream
positions of the agent's settings (:data:`MATERIALIZE_EVERY` unless changed); a new
instance's first reads then load those and fold only the events after them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..context.materialized import (
    CHUNK_BYTES,
    ContextMaterialized,
    SnapshotFold,
    plan_materialization,
    snapshot_event,
)
from ..context.projection import AgentContext
from ..context.state import AGENT_WRITER, AgentContextState
from ..context.turns import Turns
from ..errors import CheckpointError, InvalidInputError
from ..journal import Journal
from .instance import MATERIALIZE_EVERY, Run
from .scheduling import Scheduler

__all__ = [
    "MATERIALIZE_EVERY",
    "Materialized",
    "materialization_due",
    "materialize_context",
    "materialize_if_due",
    "seen_through",
]

log = logging.getLogger("contextfold.runtime")

_SNAPSHOTTED: tuple[SnapshotFold[Any], ...] = (Turns,)


@dataclass(frozen=True, slots=True)
class Materialized:
    """What one :func:`materialize_context` stored."""

    position: int
    """The manifest's stream position."""
    written: int
    """Chunks appended (the others were referenced from earlier materializations)."""
    referenced: int
    """Chunks of the manifest in all."""
    version: int = 0
    """The stream's version after the last event it stored."""


async def materialize_context(journal: Journal, stream: str) -> Materialized | None:
    """Store the agent context of ``stream`` in chunks with its cursor, the scheduler's
    state as a checkpoint and the turns' as a snapshot, as the agent (journal meta actor
    ``agent``). None when the newest materialization is already up to date.

    Chunks take at most half the journal's payload limit; raises PayloadError (nothing
    stored) when a single item's chunk is still over it.
    """
    state, through = await journal.folds.read_with_cursor(AgentContext, journal.namespace, stream)
    found = await journal.latest(stream, [ContextMaterialized])
    previous: ContextMaterialized | None = None
    previous_cursor: str | None = None
    if found and found[0].meta.actor == AGENT_WRITER:
        try:
            decoded = ContextMaterialized.model_validate_json(found[0].data)
        except ValueError:
            decoded = None  # unusable: every chunk is written again
        if decoded is not None and decoded.fold_version == AgentContext.version:
            if decoded.through == through:
                return None
            previous, previous_cursor = decoded, found[0].cursor
    chunks, manifest = plan_materialization(
        state,
        through,
        fold_version=AgentContext.version,
        previous=previous,
        previous_cursor=previous_cursor,
        chunk_bytes=min(CHUNK_BYTES, journal.max_payload_bytes // 2),
    )
    appended = await journal.append(stream, [*chunks, manifest], actor=AGENT_WRITER, channels=())
    await journal.checkpoint(Scheduler, stream, lambda current: current)
    version = appended.last_position
    for small in _SNAPSHOTTED:
        state_of, cursor = await journal.folds.read_with_cursor(small, journal.namespace, stream)
        snapshot = snapshot_event(small, state_of, cursor)
        done = await journal.append(stream, snapshot, actor=AGENT_WRITER, channels=())
        version = done.last_position
    return Materialized(appended.last_position, len(chunks), len(manifest.chunks), version)


def seen_through(context: AgentContextState) -> int:
    """The newest stream position ``context`` shows: its latest request, result record or
    published position, or the last item of a lane (a slot settled in place may be newer:
    then an append expecting this version finds the stream further, and looks again)."""
    newest = [context.request_offset or 0, context.published_through]
    newest += [lane[-1].offset for lane in (context.system, context.history) if lane]
    if context.tool_result is not None:
        newest.append(context.tool_result[0])
    return max(newest)


def materialization_due(run: Run, position: int) -> bool:
    """Whether a context seen through ``position`` may be due (True also while the newest
    materialization is still to be looked up)."""
    every = run.settings.materialize_every
    if position < every:
        return False  # not due, wherever the newest materialization is: no look-up
    done = run.state.materialized_at
    return done is None or position - done >= every


async def materialize_if_due(run: Run, context: AgentContextState) -> bool:
    """Materialize when the context has seen ``materialize_every`` positions since the
    newest materialization; True when it did (the states read before are behind its
    events). A chunk or state that cannot be stored is logged, not raised: it only costs
    the next instance a longer first read."""
    position = seen_through(context)
    if not materialization_due(run, position):
        return False
    state = run.state
    if state.materialized_at is None:
        found = await run.journal.latest(run.stream, [ContextMaterialized])
        state.materialized_at = found[0].position if found else 0
    if position - state.materialized_at < run.settings.materialize_every:
        return False
    try:
        done = await materialize_context(run.journal, run.stream)
    except (InvalidInputError, CheckpointError) as exc:
        # Only what cannot be stored: a store error or a lost lease stops the loop, as
        # any other append's does.
        log.warning("agent on %r did not materialize its context: %s", run.stream, exc)
        done = None
    state.materialized_at = done.position if done is not None else position
    if done is not None:
        state.version_seen = max(state.version_seen, done.version)
    return True
