"""Materializing the agent's folds, so a restarted agent starts from stored state instead
of refolding its whole journal.

:func:`materialize_context` stores the agent context in chunks with its cursor
(:mod:`contextfold.context.materialized`), and the small, bounded states of the other
folds the loop reads: the scheduler's as a checkpoint of itself, the dispatched turns' as
a snapshot (it takes no checkpoints). The loop does it every
:attr:`MaterializingSteps.materialize_every` stream positions; a new instance's first
reads then load those and fold only the events after them.
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
from ..store.base import AppendResult
from .instance import AgentInstance
from .scheduling import Scheduler

__all__ = ["MATERIALIZE_EVERY", "Materialized", "MaterializingSteps", "materialize_context"]

log = logging.getLogger("contextfold.runtime")

MATERIALIZE_EVERY = 1000
"""Stream positions between two materializations of a running agent."""

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


def _position(context: AgentContextState) -> int:
    """How far the context has seen the stream: its newest request or item."""
    newest = [context.request_offset or 0, context.published_through]
    newest += [lane[-1].offset for lane in (context.system, context.history) if lane]
    return max(newest)


class MaterializingSteps(AgentInstance):
    """The agent's materialization step (a base of :class:`~contextfold.runtime.loop.Agent`)."""

    materialize_every: int = MATERIALIZE_EVERY
    """Stream positions between two materializations (set it on an agent to change it)."""
    _materialized_at: int | None = None  # stream position of the newest one, once looked up
    # The newest stream version the agent's own appends returned: the stream had it at
    # least (a request appended at once names the version it expects from it).
    _version_seen: int = 0

    def _saw(self, appended: AppendResult) -> AppendResult:
        """Note the version ``appended`` left the stream at; returns it."""
        if not appended.deduplicated and appended.last_position > self._version_seen:
            self._version_seen = appended.last_position
        return appended

    def _materialization_due(self, position: int) -> bool:
        """Whether a context seen through ``position`` may be due (True also while the
        newest materialization is still to be looked up)."""
        if position < self.materialize_every:
            return False  # not due, wherever the newest materialization is: no look-up
        done = self._materialized_at
        return done is None or position - done >= self.materialize_every

    async def _materialize_if_due(self, context: AgentContextState) -> bool:
        """Materialize when the context has seen :attr:`materialize_every` positions since
        the newest materialization; True when it did (the states read before are behind
        its events). A chunk or state that cannot be stored is logged, not raised: it only
        costs the next instance a longer first read."""
        position = _position(context)
        if not self._materialization_due(position):
            return False
        if self._materialized_at is None:
            found = await self.journal.latest(self.stream, [ContextMaterialized])
            self._materialized_at = found[0].position if found else 0
        if position - self._materialized_at < self.materialize_every:
            return False
        try:
            done = await materialize_context(self.journal, self.stream)
        except (InvalidInputError, CheckpointError) as exc:
            # Only what cannot be stored: a store error or a lost lease stops the loop, as
            # any other append's does.
            log.warning("agent on %r did not materialize its context: %s", self.stream, exc)
            done = None
        self._materialized_at = done.position if done is not None else position
        if done is not None:
            self._version_seen = max(self._version_seen, done.version)
        return True
