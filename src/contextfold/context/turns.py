"""The journal's record of event-driven turns, and the manifest each request of one carries.

A dispatched turn is one append: :class:`TurnCompiled` (its coalesced events and the
manifest of its envelope) then the envelope itself, the ``ContextAdded`` item the model
sees. A steer accepted into the open turn is another such pair: :class:`SteerAccepted`
then its item. The turn stays open until the agent's answer to a request made after the
turn's last accepted steer asks for no tool (the turn settled): every accepted steer is
answered inside its turn, and a steer can never join a settled one.

The manifest of request @N is the open turn's, folded through N: the turn's layers then
each accepted steer's, in :func:`~contextfold.context.manifest.manifest_of` order. A
request outside any open turn has none. Only the runtime's own records count (journal
meta actor ``agent``), and a record whose promised item does not follow it in the same
append is reported (``problems``), so ``verify`` catches a manifest that does not
describe what the model saw.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..events import Envelope, Event, StoredEvent
from .events import ContextAdded, LlmResponse
from .manifest import Manifest, ManifestLayer, manifest_of
from .materialized import SnapshotFold

__all__ = [
    "SteerAccepted",
    "TurnCompiled",
    "TurnState",
    "Turns",
    "fold_turns",
    "item_sha256",
    "manifest_at",
    "turn_state",
    "turns_through",
]

_RUNTIME = "agent"  # the journal meta actor of the runtime's own appends


def item_sha256(content: str) -> str:
    """Hex SHA-256 of an item's UTF-8 content: how a record names the item after it."""
    return hashlib.sha256(content.encode()).hexdigest()


class TurnCompiled(Event, type="contextfold.agent/turn-compiled", runtime_only=True):
    """A turn dispatched from coalesced external events; its envelope item is next.

    ``actor`` and ``destination`` are the batch's authority (the signing actor; the thread
    root, or the event itself for a top-level event).
    """

    actor: str = Field(min_length=1)
    destination: str = Field(min_length=1)
    event_ids: tuple[str, ...] = Field(min_length=1)
    manifest: Manifest
    item_sha256: str = Field(min_length=64, max_length=64)
    """:func:`item_sha256` of the envelope item appended right after this record."""


class SteerAccepted(Event, type="contextfold.agent/steer-accepted", runtime_only=True):
    """An event injected into the open turn at ``turn_at``; its item is next."""

    turn_at: int = Field(ge=1)
    event_id: str = Field(min_length=1)
    layers: tuple[ManifestLayer, ...] = Field(min_length=1)
    """The steer's own layers, added to the turn's manifest."""
    item_sha256: str = Field(min_length=64, max_length=64)


class TurnState(BaseModel):
    """The latest dispatched turn, as far as the journal has been folded."""

    model_config = ConfigDict(frozen=True)

    turn_at: int | None = None
    """Position of the turn's :class:`TurnCompiled` (None: no turn yet)."""
    actor: str | None = None
    destination: str | None = None
    event_ids: tuple[str, ...] = ()
    """The turn's events, then its accepted steers' (the per-batch limit counts them)."""
    layers: tuple[ManifestLayer, ...] = ()
    """The turn's layers, then each accepted steer's, in acceptance order."""
    open: bool = False
    steered_at: int = 0
    """Position of the newest accepted steer (0: none)."""
    changed_at: int = 0
    """Position of the newest event that changed this state: it holds at every later one."""
    awaiting: tuple[int, str] | None = None
    """Position and :func:`item_sha256` of the item the latest record promised."""
    problems: tuple[str, ...] = ()
    """What does not hold in this turn's records (verify reports its requests)."""

    def problems_at(self, offset: int) -> tuple[str, ...]:
        """:attr:`problems`, and a promised item still missing at ``offset``."""
        if self.awaiting is not None and self.awaiting[0] <= offset:
            return (*self.problems, f"no item at @{self.awaiting[0]} follows its record")
        return self.problems

    @property
    def manifest(self) -> Manifest | None:
        """The open turn's manifest with its accepted steers; None outside a turn."""
        return manifest_of(self.layers) if self.open else None


Turns: SnapshotFold[TurnState] = SnapshotFold("agent_turns", state=TurnState, checkpoints=False)
"""The fold of dispatched turns over a stream (a runtime record: no checkpoints; a restarted
agent starts from the snapshot the runtime stored of it, ``materialized.SnapshotFold``)."""


def _missed(state: TurnState, position: int, *, item: bool = False) -> TurnState:
    """``state`` at an event at ``position``: a promised item that this event passes by
    (any event at or after the promised position, or an item after it) is reported."""
    if state.awaiting is None:
        return state
    at = state.awaiting[0]
    if at > position or (item and at == position):
        return state
    problem = f"no item at @{at} follows its record: the manifest describes nothing sent"
    return state.model_copy(
        update={"awaiting": None, "problems": (*state.problems, problem), "changed_at": position}
    )


@Turns.on(TurnCompiled)
def _compiled(state: TurnState, ev: Envelope[TurnCompiled]) -> TurnState:
    state = _missed(state, ev.position)
    if ev.meta.actor != _RUNTIME:
        return state
    p = ev.payload
    return TurnState(
        turn_at=ev.position,
        actor=p.actor,
        destination=p.destination,
        event_ids=p.event_ids,
        layers=p.manifest.layers,
        open=True,
        changed_at=ev.position,
        awaiting=(ev.position + 1, p.item_sha256),
    )


@Turns.on(SteerAccepted)
def _steered(state: TurnState, ev: Envelope[SteerAccepted]) -> TurnState:
    state = _missed(state, ev.position)
    p = ev.payload
    if ev.meta.actor != _RUNTIME or not state.open or state.turn_at != p.turn_at:
        return state
    return state.model_copy(
        update={
            "event_ids": (*state.event_ids, p.event_id),
            "layers": (*state.layers, *p.layers),
            "steered_at": ev.position,
            "changed_at": ev.position,
            "awaiting": (ev.position + 1, p.item_sha256),
        }
    )


@Turns.on(ContextAdded)
def _item(state: TurnState, ev: Envelope[ContextAdded]) -> TurnState:
    state = _missed(state, ev.position, item=True)
    if state.awaiting is None or state.awaiting[0] != ev.position:
        return state
    at, sha = state.awaiting
    problems = state.problems
    if item_sha256(ev.payload.content) != sha:
        problems = (*problems, f"the item @{at} is not the envelope its record compiled")
    return state.model_copy(
        update={"awaiting": None, "problems": problems, "changed_at": ev.position}
    )


@Turns.on(LlmResponse)
def _answered(state: TurnState, ev: Envelope[LlmResponse]) -> TurnState:
    state = _missed(state, ev.position)
    p = ev.payload
    if (
        ev.meta.actor != _RUNTIME
        or not state.open
        or p.tool_calls
        or state.turn_at is None
        or p.request_offset <= max(state.turn_at, state.steered_at)
    ):
        return state
    # A final answer to a request that saw every accepted steer settles the turn.
    return state.model_copy(update={"open": False, "changed_at": ev.position})


class _Reader(Protocol):
    def read_all(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[StoredEvent]: ...


class _Journal(_Reader, Protocol):
    async def latest(
        self,
        stream: str,
        types: Sequence[str | type[Event]],
        *,
        before: str | None = None,
        limit: int = 1,
    ) -> tuple[StoredEvent, ...]: ...


# Made once: the state is frozen, and every request's turn state is folded from it (making
# one validates each field).
_EMPTY = Turns.initial_state()


def fold_turns(state: TurnState, stored: StoredEvent) -> TurnState:
    """``state`` with one stored event folded in; what does not decode is skipped, as the
    fold reader skips it."""
    try:
        envelope = Turns.decode(stored)
    except (ValueError, ValidationError):
        return state
    return state if envelope is None else Turns.apply(state, envelope)


async def turns_through(journal: _Reader, stream: str, offset: int | None = None) -> TurnState:
    """The turn state folded through ``offset`` (inclusive; None: the head), from the
    stream's start."""
    state = _EMPTY
    events = journal.read_all(stream, types=Turns.event_types)
    async with aclosing(events):  # type: ignore[type-var]
        async for stored in events:
            if offset is not None and stored.position > offset:
                break
            state = fold_turns(state, stored)
    return state


async def turn_state(journal: _Journal, stream: str, through: int | None = None) -> TurnState:
    """The latest turn folded through ``through`` (inclusive; None: the head).

    Read from the newest turn record on, so it costs the turn's length, not the stream's
    (a stream without turns costs one indexed look-up). Only for a position before the
    newest record (a retry of an older request), or a newest record that is not the
    runtime's, is the stream folded from its start.
    """
    newest = await journal.latest(stream, [TurnCompiled])
    if not newest:
        return _EMPTY
    start = newest[0]
    state = fold_turns(_EMPTY, start)
    if (through is not None and start.position > through) or state.turn_at is None:
        return await turns_through(journal, stream, through)
    events = journal.read_all(stream, after=start.cursor, types=Turns.event_types)
    async with aclosing(events):  # type: ignore[type-var]
        async for stored in events:
            if through is not None and stored.position > through:
                break
            state = fold_turns(state, stored)
    return state


async def manifest_at(journal: _Journal, stream: str, offset: int) -> Manifest | None:
    """The manifest of request @``offset``: the open turn's through it, else None."""
    return (await turn_state(journal, stream, offset)).manifest
