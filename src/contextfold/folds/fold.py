"""Folds: a typed state derived from journal events by pure handlers.

A fold is plain data and pure functions, testable without a journal
(``F.apply_all(F.initial_state(), envelopes)``); ``journal.fold(F, stream)`` reads it
incrementally from a journal, cached (see :mod:`contextfold.folds.reader`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import TypeAdapter, ValidationError

from ..errors import (
    CheckpointError,
    FoldDefinitionError,
    InvalidInputError,
    MissingSegmentError,
)
from ..events import E, Envelope, Event, EventMeta, StoredEvent
from .freeze import _LEAVES, freeze

if TYPE_CHECKING:
    from ..store.base import Store

__all__ = ["Fold", "FoldBase", "Handler", "Reading", "Scope", "Skip"]

S = TypeVar("S")
Scope = Literal["context", "run"]
Handler = Callable[[S, Envelope[Any]], S]
Skip = Callable[[str, StoredEvent, str], None]
"""Told of a stored event a read left out: (reason, event, detail)."""


# Checkpoints encode strictly: a field the schema does not know is an error, not dropped
# (validate_python takes ``extra`` since pydantic 2.12; older versions drop such fields).
_TAKES_EXTRA = "extra" in inspect.signature(TypeAdapter.validate_python).parameters
STRICT_EXTRA: dict[str, Any] = {"extra": "forbid"} if _TAKES_EXTRA else {}


@dataclass(frozen=True, slots=True)
class _Registered:
    event: type[Event]
    apply: Callable[[Any, Envelope[Any]], Any]
    """A step on the fold's working form (see FoldBase._working)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """What a read or an append needs of a fold, made once per definition (a handler
    registered later makes it again)."""

    types: frozenset[str]
    """The type names with a handler."""
    read_types: tuple[str, ...]
    """What a read asks the store for: those types, and the checkpoint type when it takes them."""
    stop: str | None
    """The checkpoint type when the fold takes checkpoints (folding stops at one), else None."""
    run_scoped: bool


# A step of one event type: (validator, its validate_json, the handler's step, event class).
# The validator is kept to see that the class's is still it: a class completing its schema
# after the fold is defined (forward references) gets a new one.
_Steps = tuple[Any, Callable[[bytes], Any], Callable[[Any, Envelope[Any]], Any], type[Event]]
_UNSEEN: Any = object()
_MAX_UNHANDLED = 1024  # type names remembered as having no handler (raw types are unbounded)


class FoldBase(Generic[S]):
    """What the reader needs of any fold: name, version, scope, handlers, state codec."""

    def __init__(self, name: str, *, scope: Scope = "context", version: int = 1) -> None:
        if not isinstance(name, str) or not name.isidentifier():
            raise FoldDefinitionError(
                f"fold name {name!r} must be a Python identifier (letters, digits, _; "
                "not starting with a digit)"
            )
        if scope not in ("context", "run"):
            raise FoldDefinitionError(
                f"fold {name}: scope must be 'context' or 'run', not {scope!r}"
            )
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise FoldDefinitionError(
                f"fold {name}: version must be a positive int, not {version!r}"
            )
        self.name = name
        self.scope: Scope = scope
        self.version = version
        self._handlers: dict[str, _Registered] = {}
        self._reading: Reading | None = None
        self._steps: dict[str, _Steps | None] = {}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}@{self.version}>"

    # -- handlers -----------------------------------------------------------------------------

    def _register(self, event: type[Event], apply: Callable[[Any, Envelope[Any]], Any]) -> None:
        if not (isinstance(event, type) and issubclass(event, Event) and event.event_type):
            raise FoldDefinitionError(
                f"fold {self.name}: handlers take an Event class with a type name, got {event!r}"
            )
        if event.event_type in self._handlers:
            raise FoldDefinitionError(
                f"fold {self.name}: event {event.event_type!r} already has a handler; "
                "one handler per event"
            )
        self._handlers[event.event_type] = _Registered(event, apply)
        self._reading = None
        self._steps = {}

    @property
    def event_types(self) -> tuple[str, ...]:
        """The type names this fold reads."""
        return tuple(self._handlers)

    def reading(self) -> Reading:
        """The fold's :class:`Reading` (made once, again after a handler is registered)."""
        reading = self._reading
        if reading is None:
            types = tuple(self._handlers)
            stop = self.checkpoint_type if self.can_checkpoint else None
            reading = self._reading = Reading(
                frozenset(types),
                types if stop is None else (*types, stop),
                stop,
                self.scope == "run",
            )
        return reading

    def validate(self) -> None:
        """Raise FoldDefinitionError when the fold has no handler (it would read nothing)."""
        if not self._handlers:
            raise FoldDefinitionError(f"fold {self.name} has no handler: add one with .on(Event)")

    def handler_event(self, type_name: str) -> type[Event] | None:
        registered = self._handlers.get(type_name)
        return registered.event if registered else None

    # -- pure folding -------------------------------------------------------------------------

    def initial_state(self) -> S:
        raise NotImplementedError

    def apply(self, state: S, envelope: Envelope[Any]) -> S:
        """Fold one decoded envelope; events without a handler leave the state as it is."""
        return self.apply_reporting(state, envelope)[0]

    def apply_reporting(self, state: S, envelope: Envelope[Any]) -> tuple[S, str | None]:
        """Like :meth:`apply`, plus the reason to report when the event was left out
        (``"missing-segment"``), or None."""
        registered = self._handlers.get(envelope.type)
        if registered is None:
            return state, None
        seal = self._step_seal()
        try:
            work = registered.apply(self._working(state), envelope)
            # The default seal returns a state of a frozen type as it is (see _fold_steps).
            if seal is not None and not (
                type(work) in _LEAVES and getattr(seal, "__func__", None) is FoldBase._seal
            ):
                work = seal(work)
        except MissingSegmentError:
            return state, "missing-segment"
        return self._settled(work), None

    def apply_all(self, state: S, envelopes: Iterable[Envelope[Any]]) -> S:
        for envelope in envelopes:
            state = self.apply(state, envelope)
        return state

    def fold_stored(
        self,
        state: S,
        events: Sequence[StoredEvent],
        start: int = 0,
        *,
        stop: str | None = None,
        run_id: str | None = None,
        run_scoped: bool = False,
        skip: Skip,
    ) -> tuple[S, int, int]:
        """Fold ``events[start:]`` into ``state`` up to the first event of type ``stop``.

        Returns (state, index of that event or ``len(events)``, events folded). An event that
        does not decode, or that an attach finds no segment for, is left out and handed to
        ``skip(reason, event, detail)``; with ``run_scoped``, events of other runs than
        ``run_id`` are passed over. Whatever else a handler raises propagates. Equals
        :meth:`decode` then :meth:`apply_reporting` per event, which a fold overriding
        either is read through.
        """
        work, index, folded = self._fold_into(
            self._open_read(state), events, start, stop, run_id, run_scoped, skip
        )
        return self._close_read(work), index, folded

    # A read of many pages folds them all into one working form (see _working), settled
    # into a state once at its end: a state per page would be a new vector per page for
    # the collector to walk whole.

    def _open_read(self, state: S) -> Any:
        return state if self._per_event() else self._working(state)

    def _close_read(self, work: Any) -> S:
        return work if self._per_event() else self._settled(work)

    def _fold_into(
        self,
        work: Any,
        events: Sequence[StoredEvent],
        start: int,
        stop: str | None,
        run_id: str | None,
        run_scoped: bool,
        skip: Skip,
    ) -> tuple[Any, int, int]:
        """:meth:`fold_stored` on a read's working form (from :meth:`_open_read`)."""
        if self._per_event():
            return self._fold_each(work, events, start, stop, run_id, run_scoped, skip)
        return self._fold_steps(work, events, start, stop, run_id, run_scoped, skip, None)

    def _fold_appended(
        self,
        state: S,
        events: Sequence[StoredEvent],
        reading: Reading,
        run_id: str | None,
        skip: Skip,
        decoded: dict[tuple[int, int], Any],
    ) -> tuple[S, int, int]:
        """:meth:`fold_stored` of what one append stored, for the reader: ``decoded`` holds
        the payloads decoded so far by the folds of the same append, by (validator, index);
        a payload decodes alike for every fold whose handler takes the same event class."""
        if self._per_event():
            return self._fold_each(state, events, 0, reading.stop, run_id, reading.run_scoped, skip)
        work, index, folded = self._fold_steps(
            self._working(state), events, 0, reading.stop, run_id, reading.run_scoped, skip, decoded
        )
        return self._settled(work), index, folded

    def _steps_of(self, kind: str) -> _Steps | None:
        """The step of ``kind`` (None: no handler), remembered until the class's validator
        changes or a handler is registered."""
        registered = self._handlers.get(kind)
        if registered is None:
            if len(self._steps) < _MAX_UNHANDLED:
                self._steps[kind] = None
            return None
        event = registered.event
        validator = event.__pydantic_validator__
        steps = (validator, validator.validate_json, registered.apply, event)
        self._steps[kind] = steps
        return steps

    def _fold_steps(
        self,
        work: Any,
        events: Sequence[StoredEvent],
        start: int,
        stop: str | None,
        run_id: str | None,
        run_scoped: bool,
        skip: Skip,
        decoded: dict[tuple[int, int], Any] | None,
    ) -> tuple[Any, int, int]:
        """:meth:`_fold_into` through the handlers' steps; ``decoded`` as in
        :meth:`_fold_appended`, or None (every payload decoded here)."""
        known = self._steps
        seal = self._step_seal()
        # The default seal returns a state of a frozen type as it is: told apart here, it
        # costs no two calls per event.
        as_is = _LEAVES if getattr(seal, "__func__", None) is FoldBase._seal else ()
        make = tuple.__new__  # NamedTuple._make(fields) without the Python call around it
        split: dict[str, tuple[str, ...]] = {}  # each stored channels string, split once
        folded = 0
        for index in range(start, len(events)):
            event = events[index]
            kind = event.type
            if kind == stop:
                return work, index, folded
            steps = known.get(kind, _UNSEEN)
            if steps is _UNSEEN or (
                steps is not None and steps[3].__pydantic_validator__ is not steps[0]
            ):
                steps = self._steps_of(kind)
            if steps is None:
                continue
            if run_scoped and event.run_id != run_id:
                continue
            try:
                if decoded is None:
                    payload = steps[1](event.data)
                else:
                    memo = (id(steps[0]), index)
                    payload = decoded.get(memo, _UNSEEN)
                    if payload is _UNSEEN:
                        payload = decoded[memo] = steps[1](event.data)
            except ValueError as exc:  # pydantic's ValidationError is one
                skip("decode", event, str(exc).splitlines()[0])
                continue
            # Envelope.of, inlined: this runs once per event of every cold read.
            channels = split.get(event.channels)
            if channels is None:
                channels = split[event.channels] = event.meta.channels
            given = (event.event_id, event.time, event.run_id, event.actor, event.idempotency_key)
            meta = make(EventMeta, (*given, channels))
            envelope = make(
                Envelope,
                (payload, meta, event.stream, event.position, event.global_position, kind),
            )
            folded += 1
            try:
                work = steps[2](work, envelope)
                if seal is not None and type(work) not in as_is:
                    work = seal(work)
            except MissingSegmentError:
                skip("missing-segment", event, "no segment to attach to")
        return work, len(events), folded

    def _per_event(self) -> bool:
        """Whether this fold overrides decode or apply_reporting (so reads go through them)."""
        cls = type(self)
        own = self.__dict__
        return (
            cls.decode is not FoldBase.decode
            or cls.apply_reporting is not FoldBase.apply_reporting
            or "decode" in own
            or "apply_reporting" in own
        )

    def _fold_each(
        self,
        state: S,
        events: Sequence[StoredEvent],
        start: int,
        stop: str | None,
        run_id: str | None,
        run_scoped: bool,
        skip: Skip,
    ) -> tuple[S, int, int]:
        folded = 0
        for index in range(start, len(events)):
            event = events[index]
            if event.type == stop:
                return state, index, folded
            if run_scoped and event.meta.run_id != run_id:
                continue
            try:
                envelope = self.decode(event)
            except ValueError as exc:
                skip("decode", event, str(exc).splitlines()[0])
                continue
            if envelope is None:
                continue
            state, problem = self.apply_reporting(state, envelope)
            folded += 1
            if problem is not None:
                skip(problem, event, "no segment to attach to")
        return state, len(events), folded

    def decode(self, stored: StoredEvent) -> Envelope[Any] | None:
        """The stored event decoded with its handler's schema (unknown fields stripped).

        None when the fold has no handler for it. Raises ValueError/ValidationError when it
        does not decode.
        """
        registered = self._handlers.get(stored.type)
        if registered is None:
            return None
        return Envelope.of(stored, registered.event.model_validate_json(stored.data))

    def _seal(self, state: S) -> S:
        return freeze(state)  # type: ignore[no-any-return]

    # What handlers' steps fold into while a run of events folds: the state itself here; a
    # fold may work on a mutable form instead, settled into a state once per run.

    def _working(self, state: S) -> Any:
        return state

    def _settled(self, work: Any) -> S:
        return work  # type: ignore[no-any-return]

    def _step_seal(self) -> Callable[[Any], Any] | None:
        """What seals the result of each step, or None when the steps seal it themselves."""
        return self._seal

    # -- checkpoints --------------------------------------------------------------------------

    compacted_by: str | None = None
    """What compacts this fold instead of ``journal.compact`` (None: nothing), named in the
    CompactionError that ``journal.compact`` raises for it."""

    async def restore(
        self, store: Store, namespace: str, stream: str
    ) -> tuple[S, str | None] | None:
        """A stored materialization of this fold to start a cold read from when no checkpoint
        applies: the state and the cursor of the last event it folded, which it must equal the
        fold of. None (the default): fold from the start."""
        return None

    @property
    def can_checkpoint(self) -> bool:
        """Whether the fold's state can be replaced by a checkpoint (and so reads them)."""
        return False

    def check_checkpointable(self) -> None:
        """Raise CheckpointError (reason ``"unsupported"``) unless the fold takes checkpoints."""
        if not self.can_checkpoint:
            raise CheckpointError(
                f"fold {self.name} takes no checkpoints: only a context-scoped fold with a "
                "state schema (not made with checkpoints=False), or a SegmentedFold, does",
                reason="unsupported",
            )

    @property
    def checkpoint_type(self) -> str:
        """The stored type name of this fold's checkpoints: name and version both in it."""
        return f"contextfold.checkpoint/{self.name}@{self.version}"

    def encode_state(self, state: S) -> Any:
        """The state as JSON, for a checkpoint. Raises CheckpointError: ``"unsupported"``
        without a state codec, ``"invalid-state"`` when the state does not fit it."""
        self.check_checkpointable()
        raise NotImplementedError

    def decode_state(self, encoded: Any) -> S:
        raise InvalidInputError(f"fold {self.name} has no state schema")


class Fold(FoldBase[S]):
    """A fold with one pure handler per event: ``@F.on(Event) def _(state, ev): return new``.

    ``state`` is the state's type (a frozen pydantic model, ``tuple[Turn, ...]``, …); with it
    the fold takes checkpoints, which store the state encoded with it. ``initial`` makes the
    state before any event (defaults to calling ``state``). ``checkpoints=False`` refuses
    checkpoints (``journal.checkpoint`` raises, reads ignore them) for a fold that must
    always equal a fold of its events alone; ``compacted_by`` says what compacts it instead,
    for the error ``journal.compact`` raises.

    Read state is deep-frozen after each handler, which costs a check per item of every
    container the handler returned. For a state that grows with the history (a
    conversation, a log), use :class:`SegmentedFold`: its open and attach cost the same
    at any length.
    """

    def __init__(
        self,
        name: str,
        *,
        state: Any = None,
        initial: Callable[[], S] | None = None,
        scope: Scope = "context",
        version: int = 1,
        checkpoints: bool = True,
        compacted_by: str | None = None,
    ) -> None:
        super().__init__(name, scope=scope, version=version)
        if initial is None:
            if state is None or not callable(state):
                raise FoldDefinitionError(
                    f"fold {name}: give initial= (a function returning the first state)"
                )
            initial = state
        self._initial = initial
        self.state_schema = state
        self._adapter: TypeAdapter[S] | None = TypeAdapter(state) if state is not None else None
        self.checkpoints = checkpoints
        self.compacted_by = compacted_by

    def on(
        self, event: type[E]
    ) -> Callable[[Callable[[S, Envelope[E]], S]], Callable[[S, Envelope[E]], S]]:
        """Register the handler of ``event``: ``(state, envelope) -> new state``, pure."""

        def register(fn: Callable[[S, Envelope[E]], S]) -> Callable[[S, Envelope[E]], S]:
            self._register(event, fn)
            return fn

        return register

    def initial_state(self) -> S:
        return self._seal(self._initial())

    @property
    def can_checkpoint(self) -> bool:
        return self.checkpoints and self.scope == "context" and self._adapter is not None

    def encode_state(self, state: S) -> Any:
        # The codec works with checkpoints=False too; the reader refuses the checkpoint.
        if self.scope != "context" or self._adapter is None:
            return super().encode_state(state)
        try:
            checked = self._adapter.validate_python(state, strict=False, **STRICT_EXTRA)
            return self._adapter.dump_python(checked, mode="json", warnings="error")
        except (ValidationError, ValueError, TypeError) as exc:
            raise CheckpointError(
                f"fold {self.name}: the new state does not fit its schema: {exc}",
                reason="invalid-state",
            ) from exc

    def decode_state(self, encoded: Any) -> S:
        if self._adapter is None:
            return super().decode_state(encoded)
        return self._seal(self._adapter.validate_python(encoded))
