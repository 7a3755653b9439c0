"""Event-driven turns: external events in, one compiled envelope per turn out.

A :class:`TurnDispatcher` takes signed external events (chat messages, mentions) for one
agent stream. Each is recorded in the journal before :meth:`~TurnDispatcher.receive`
returns, so nothing acknowledged is lost with the process:

- while a turn of the same actor and destination is open, the event is a **steer**: its
  item and :class:`~contextfold.context.turns.SteerAccepted` are appended (only if nothing
  was appended since the dispatcher looked, so a turn that settled meanwhile never takes
  it) and the turn's manifest gains its layer; the next request of the turn records it.
  A steer the store refuses raises (nothing of it is in the turn); one whose append
  failed without saying whether it was written is retried under the same idempotency key
  and raises if that fails too. Either way it was never acknowledged.
- otherwise it waits, queued (:class:`TurnEventQueued`); past ``max_pending`` events for
  one destination it is refused with :class:`~contextfold.errors.BackpressureError`.

:meth:`~TurnDispatcher.dispatch` takes the oldest waiting events that share actor and
destination (at most ``max_batch``; the rest wait for the next turn), compiles them with
:func:`~contextfold.render.envelope.compile_turn` and appends the turn record and its
envelope, the turn's model-visible item, in one append; the agent answers it like any
user item, and every request of the turn records the manifest.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict

from ..context.events import Actor, ContextAdded
from ..context.turns import SteerAccepted, TurnCompiled, TurnState, item_sha256, turn_state
from ..errors import (
    BackpressureError,
    ConfigurationError,
    ConflictError,
    ContextfoldError,
    StoreUnavailableError,
    WrongExpectedVersionError,
)
from ..events import Envelope, Event
from ..folds.fold import Fold
from ..journal import Journal
from ..journal.encode import bounded_key
from ..render.envelope import (
    CANONICAL_LAYERS,
    MAX_BATCH_EVENTS,
    CompiledTurn,
    LayerSpec,
    TurnBatch,
    TurnContext,
    TurnEvent,
    coalesce,
    compile_steer,
    compile_turn,
)
from .instance import RunReport

__all__ = [
    "MAX_PENDING_PER_DESTINATION",
    "DispatchedTurn",
    "PendingState",
    "Receipt",
    "TurnDispatcher",
    "TurnEventQueued",
    "TurnQueue",
]

MAX_PENDING_PER_DESTINATION = 500
"""The most events waiting for one destination (a thread root or a top-level event)."""

_RUNTIME = "agent"
_ATTEMPTS = 20  # a busy turn appends often; each try re-reads, so a few conflicts are normal

ContextSource = (
    TurnContext | Callable[[TurnBatch], TurnContext] | Callable[[TurnBatch], Awaitable[TurnContext]]
)


class TurnEventQueued(Event, type="contextfold.agent/turn-event-queued", runtime_only=True):
    """An external event waiting for its turn."""

    event: TurnEvent


class PendingState(BaseModel):
    """The events waiting for a turn, oldest first."""

    model_config = ConfigDict(frozen=True)

    pending: tuple[TurnEvent, ...] = ()


TurnQueue: Fold[PendingState] = Fold("agent_turn_queue", state=PendingState, checkpoints=False)
"""The waiting events of a stream: queued, less those a turn or a steer took."""


@TurnQueue.on(TurnEventQueued)
def _queued(state: PendingState, ev: Envelope[TurnEventQueued]) -> PendingState:
    if ev.meta.actor != _RUNTIME or any(
        e.event_id == ev.payload.event.event_id for e in state.pending
    ):
        return state
    return PendingState(pending=(*state.pending, ev.payload.event))


@TurnQueue.on(TurnCompiled)
def _taken(state: PendingState, ev: Envelope[TurnCompiled]) -> PendingState:
    if ev.meta.actor != _RUNTIME:
        return state
    taken = set(ev.payload.event_ids)
    return PendingState(pending=tuple(e for e in state.pending if e.event_id not in taken))


@TurnQueue.on(SteerAccepted)
def _steered(state: PendingState, ev: Envelope[SteerAccepted]) -> PendingState:
    if ev.meta.actor != _RUNTIME:
        return state
    return PendingState(
        pending=tuple(e for e in state.pending if e.event_id != ev.payload.event_id)
    )


@dataclass(frozen=True, slots=True)
class Receipt:
    """How an event was taken: ``injected`` into the open turn, ``queued`` for a turn of
    its own, or ``started-new-turn`` (a turn of its actor and destination was open but
    settled, or was full, before it could join: it waits for its own turn and is not in
    that turn's manifest). ``position`` is its record's (0 when ``deduplicated``: it was
    received before)."""

    status: Literal["injected", "queued", "started-new-turn"]
    event_id: str
    position: int
    deduplicated: bool = False


@dataclass(frozen=True, slots=True)
class DispatchedTurn:
    """A turn appended to the journal: its record's position (the item is next)."""

    position: int
    batch: TurnBatch
    compiled: CompiledTurn


class _Runs(Protocol):
    async def run_until_idle(self) -> RunReport: ...


class TurnDispatcher:
    """Turns from external events on one agent stream (see the module docstring).

    ``context`` gives each turn its standing, ambient and delivery inputs: a fixed
    :class:`~contextfold.render.envelope.TurnContext`, or a function of the batch (which
    may be async: resolve channel metadata and recent messages there; the compiler does
    no I/O). ``actor_type`` is the actor type of the turn items (the events' signers are
    its ids). Raises ConfigurationError for limits that are not positive or a batch limit
    over :data:`~contextfold.render.envelope.MAX_BATCH_EVENTS`.

    Run one dispatcher per stream, in the process that runs the stream's agent.
    """

    def __init__(
        self,
        journal: Journal,
        stream: str,
        *,
        context: ContextSource | None = None,
        specs: Mapping[str, LayerSpec] = CANONICAL_LAYERS,
        actor_type: str = "user",
        max_pending: int = MAX_PENDING_PER_DESTINATION,
        max_batch: int = MAX_BATCH_EVENTS,
    ) -> None:
        for name, value, top in (
            ("max_pending", max_pending, None),
            ("max_batch", max_batch, MAX_BATCH_EVENTS),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"TurnDispatcher {name} must be a positive int: {value!r}")
            if top is not None and value > top:
                raise ConfigurationError(f"TurnDispatcher {name} is at most {top}: {value!r}")
        self.journal = journal
        self.stream = stream
        self.context: ContextSource = context if context is not None else TurnContext()
        self.specs = specs
        self.actor = Actor(type=actor_type)
        self.max_pending = max_pending
        self.max_batch = max_batch
        self._lock = asyncio.Lock()

    async def pending(self) -> tuple[TurnEvent, ...]:
        """The events waiting for a turn, oldest first."""
        return (await self.journal.fold(TurnQueue, self.stream)).pending

    async def turn(self) -> TurnState:
        """The latest turn as the journal has it (``open`` until it settled)."""
        return await turn_state(self.journal, self.stream)

    async def receive(self, event: TurnEvent) -> Receipt:
        """Record ``event``: steered into the open turn of its actor and destination, else
        queued. Returns once it is in the journal. Raises BackpressureError past
        ``max_pending`` waiting events for its destination, and the store's error for a
        steer or an event it could not record (nothing of it is then acknowledged)."""
        async with self._lock:
            missed = False
            for _ in range(_ATTEMPTS):
                version = await self.journal.version(self.stream)
                turns = await turn_state(self.journal, self.stream)
                joins = turns.open and (turns.actor, turns.destination) == event.authority
                if joins and event.event_id in turns.event_ids:
                    return Receipt("injected", event.event_id, 0, True)
                if not joins or len(turns.event_ids) >= self.max_batch:
                    missed = missed or joins
                    return await self._queue(event, missed)
                try:
                    return await self._steer(turns, event, version)
                except WrongExpectedVersionError:
                    missed = True  # something was appended meanwhile: look again
            raise ConflictError(
                f"stream {self.stream!r} changed on each of {_ATTEMPTS} tries to steer event "
                f"{event.event_id!r} into its turn; nothing was recorded: receive it again"
            )

    async def _steer(self, turns: TurnState, event: TurnEvent, version: int) -> Receipt:
        assert turns.turn_at is not None
        compiled = compile_steer(event, specs=self.specs)
        record = SteerAccepted(
            turn_at=turns.turn_at,
            event_id=event.event_id,
            layers=compiled.layers,
            item_sha256=item_sha256(compiled.text),
        )
        item = ContextAdded(
            role="user",
            actor=self.actor.model_copy(update={"id": event.actor}),
            content=compiled.text,
        )
        key = bounded_key(f"contextfold/steer/{turns.turn_at}/{event.event_id}")
        for last in (False, True):
            try:
                result = await self.journal.append(
                    self.stream,
                    [record, item],
                    expected_version=version,
                    idempotency_key=key,
                    actor=_RUNTIME,
                )
            except WrongExpectedVersionError:
                raise
            except (StoreUnavailableError, OSError, TimeoutError):
                # The store did not say whether it wrote: the same key and expected version
                # either find the steer written (deduplicated) or write it now.
                if last:
                    raise
                continue
            except ContextfoldError:
                raise  # refused: nothing was written
            return Receipt("injected", event.event_id, result.first_position, result.deduplicated)
        raise AssertionError("unreachable")

    async def _queue(self, event: TurnEvent, missed: bool) -> Receipt:
        waiting = await self.pending()
        if any(e.event_id == event.event_id for e in waiting):
            return Receipt("queued", event.event_id, 0, True)
        count = sum(1 for e in waiting if e.destination == event.destination)
        if count >= self.max_pending:
            raise BackpressureError(
                f"stream {self.stream!r}: {count} events already wait for destination "
                f"{event.destination!r} (the limit is {self.max_pending}); event "
                f"{event.event_id!r} was refused, nothing was recorded: receive it again "
                "once the agent has answered some",
                destination=event.destination,
                limit=self.max_pending,
            )
        result = await self.journal.append(
            self.stream,
            TurnEventQueued(event=event),
            idempotency_key=bounded_key(f"contextfold/turn-event/{event.event_id}"),
            actor=_RUNTIME,
        )
        status: Literal["queued", "started-new-turn"] = "started-new-turn" if missed else "queued"
        return Receipt(status, event.event_id, result.first_position, result.deduplicated)

    async def _context_for(self, batch: TurnBatch) -> TurnContext:
        source = self.context
        if isinstance(source, TurnContext):
            return source
        made = source(batch)
        return await made if inspect.isawaitable(made) else made

    async def dispatch(self) -> DispatchedTurn | None:
        """Append the next turn: the oldest waiting events of one actor and destination,
        compiled into their envelope. None while a turn is open or nothing waits."""
        async with self._lock:
            if (await self.turn()).open:
                return None
            waiting = await self.pending()
            if not waiting:
                return None
            batch = coalesce(waiting, max_batch=self.max_batch)[0]
            compiled = compile_turn(batch, await self._context_for(batch), specs=self.specs)
            first = batch.events[0]
            record = TurnCompiled(
                actor=first.actor,
                destination=first.destination,
                event_ids=tuple(e.event_id for e in batch.events),
                manifest=compiled.manifest,
                item_sha256=item_sha256(compiled.text),
            )
            item = ContextAdded(
                role="user",
                actor=self.actor.model_copy(update={"id": first.actor}),
                content=compiled.text,
            )
            result = await self.journal.append(
                self.stream,
                [record, item],
                idempotency_key=bounded_key(f"contextfold/turn/{first.event_id}"),
                actor=_RUNTIME,
            )
            return DispatchedTurn(result.first_position, batch, compiled)

    async def run(self, agent: _Runs) -> tuple[DispatchedTurn, ...]:
        """Dispatch turn after turn and let ``agent`` answer each, until nothing waits or
        the agent stops short of idle (queued before its system prompt, or halted)."""
        turns: list[DispatchedTurn] = []
        while True:
            dispatched = await self.dispatch()
            if dispatched is not None:
                turns.append(dispatched)
            report = await agent.run_until_idle()
            if dispatched is None or report.status != "idle":
                return tuple(turns)
