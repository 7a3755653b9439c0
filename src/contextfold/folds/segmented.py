"""Segmented folds: state as atomic segments (a prompt, a model step with all its tool
results, an answer) plus an optional summary, so views can trim without splitting a step
from its results.

Segments live in a persistent vector, with an index from segment id to position beside it,
so opening a segment or attaching to one (a late tool result for an old step too) costs
about the same on a state of ten segments or of a hundred thousand: O(log n) amortized.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from threading import Lock
from typing import Any, Generic, Literal, TypeVar, overload

from pydantic import TypeAdapter, ValidationError
from pyrsistent import PVector, pvector

from ..errors import (
    CheckpointError,
    FoldDefinitionError,
    InvalidInputError,
    MissingSegmentError,
)
from ..events import E, Envelope
from .fold import STRICT_EXTRA, FoldBase, Scope
from .freeze import _LEAVES, freeze

__all__ = ["OnMissing", "Segment", "SegmentedFold", "SegmentedState"]

D = TypeVar("D")
M = TypeVar("M")
OnMissing = Literal["report", "ignore"]


@dataclass(frozen=True, slots=True, init=False)
class Segment(Generic[D]):
    """One atomic unit of a segmented state: its id (unique, addresses it in views) and data."""

    id: str
    data: D
    # Per-segment memo (token counts per counter, elided forms): segments are immutable,
    # so whatever is computed from one stays true for as long as it lives. Not an init
    # field: dataclasses.replace(segment, data=…) would hand the copy the original's memo.
    _memo: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __init__(self, id: str, data: D) -> None:
        # The slots' own setters: a frozen dataclass's generated __init__ goes through
        # object.__setattr__ per field, and a cold read makes a segment per open and attach.
        _SET_ID(self, id)
        _SET_DATA(self, data)
        _SET_MEMO(self, {})


_SLOTS: Any = vars(Segment)
_SET_ID = _SLOTS["id"].__set__
_SET_DATA = _SLOTS["data"].__set__
_SET_MEMO = _SLOTS["_memo"].__set__


# The concrete vector type: PVector is an abstract base class, and an isinstance check
# against it (its __instancecheck__) cost more than the append it guarded in every handler.
_PVECTOR: type[Any] = type(pvector())


class _Ids:
    """Segment id -> position, shared by a line of states: an open by the newest state
    (the one as long as the index) adds to it in place, O(1); an open by an older one (a
    fork) gets no index and builds its own on its first attach. A state reads only the
    positions below its length, which its own segments wrote. An id held by one segment
    (the usual case) maps to its position, an id held by several to their positions
    ascending: one list per segment would be one more object per segment for the collector
    to walk. Not a pyrsistent pmap: a young-generation GC pass traverses its new nodes, and
    merging immutable levels cost O(log n) per open, growing with the history."""

    __slots__ = ("_lock", "length", "positions")

    def __init__(self, segments: Any) -> None:
        """The index of ``segments``: a sequence, or a vector's evolver (indexable only)."""
        self.positions: dict[str, int | list[int]] = {}
        self.length = len(segments)
        for position in range(self.length):
            self._add(segments[position].id, position)
        self._lock = Lock()

    def _add(self, segment_id: str, position: int) -> None:
        held = self.positions.get(segment_id)
        if held is None:
            self.positions[segment_id] = position
        elif isinstance(held, int):
            self.positions[segment_id] = [held, position]
        else:
            held.append(position)

    def opened(self, segment_id: str, position: int) -> _Ids | None:
        """This index with the segment at ``position`` added, or None when a later state
        took that position already (the opening state is a fork)."""
        with self._lock:
            if self.length != position:
                return None
            self._add(segment_id, position)
            self.length += 1
            return self


@dataclass(frozen=True, slots=True)
class SegmentedState(Generic[D, M]):
    """``{summary, segments}``: the summary of what came before, then the segments, oldest first."""

    segments: Sequence[Segment[D]] = field(default_factory=lambda: pvector())
    summary: M | None = None
    # Derived from segments (neither compared nor encoded): built on the first attach to a
    # state a handler or a checkpoint made, then kept up by open and attach.
    _ids: _Ids | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if type(self.segments) is not _PVECTOR:
            object.__setattr__(self, "segments", pvector(self.segments))

    def __iter__(self) -> Iterator[Segment[D]]:
        return iter(self.segments)

    def __len__(self) -> int:
        return len(self.segments)


def _derived(
    segments: PVector[Segment[Any]], summary: Any, ids: _Ids | None
) -> SegmentedState[Any, Any]:
    # Not through __init__: the vector is one already.
    state: SegmentedState[Any, Any] = object.__new__(SegmentedState)
    object.__setattr__(state, "segments", segments)
    object.__setattr__(state, "summary", summary)
    object.__setattr__(state, "_ids", ids)
    return state


class _Folding:
    """A segmented state while events fold into it: the segments as an evolver of its
    vector, set and appended in place, so opens and attaches make no state and copy no
    vector path per event; settled into a state once (at the end of a read, after one
    event of ``apply``, or before a whole-state handler). The state it started from is
    left as it is."""

    __slots__ = ("ids", "origin", "segments")

    def __init__(self, state: SegmentedState[Any, Any]) -> None:
        self.origin = state
        self.segments: Any = state.segments.evolver()  # type: ignore[attr-defined]
        self.ids = state._ids

    def settled(self) -> SegmentedState[Any, Any]:
        """The state folded so far: the one it started from when nothing changed."""
        origin = self.origin
        if not self.segments.is_dirty():
            if origin._ids is None and self.ids is not None:
                object.__setattr__(origin, "_ids", self.ids)  # its own segments' index
            return origin
        return _derived(self.segments.persistent(), origin.summary, self.ids)

    def newest(self, held: list[int], kind: Any, tag: str | None) -> int | None:
        """The newest of ``held`` (the positions of one id) below this state's length with
        the kind, when given: positions at or past it were written by longer states sharing
        the index."""
        length = len(self.segments)
        for position in reversed(held):
            if position < length and (
                kind is None or tag is None or _kind_of(self.segments[position].data, tag) == kind
            ):
                return position
        return None


def _kind_of(data: Any, tag: str) -> Any:
    if isinstance(data, dict):
        return data.get(tag)
    return getattr(data, tag, None)


class SegmentedFold(FoldBase[SegmentedState[Any, Any]]):
    """A fold whose state is :class:`SegmentedState`.

    ``data`` is the type of a segment's data (typically a union of frozen models, one per
    kind), ``summary`` the type of the summary (None: no summary). ``tag`` names the field
    holding a segment's kind, which ``attach(kind=…)`` and ``from_newest`` read.
    Every context-scoped segmented fold takes checkpoints; one with a ``summary`` type also
    compacts (``journal.compact``: older segments summarized by a view's policy).
    """

    def __init__(
        self,
        name: str,
        *,
        data: Any,
        summary: Any = None,
        tag: str | None = "_tag",
        scope: Scope = "context",
        version: int = 1,
    ) -> None:
        super().__init__(name, scope=scope, version=version)
        self.data_schema = data
        self.summary_schema = summary
        self.tag = tag
        try:
            self._data_adapter: TypeAdapter[Any] = TypeAdapter(data)
            self._summary_adapter: TypeAdapter[Any] | None = (
                TypeAdapter(summary) if summary is not None else None
            )
        except Exception as exc:  # pydantic raises several kinds for unusable types
            raise FoldDefinitionError(
                f"segmented fold {name}: data/summary is not a usable type: {exc}"
            ) from exc

    def initial_state(self) -> SegmentedState[Any, Any]:
        return SegmentedState()

    def _seal(self, state: SegmentedState[Any, Any]) -> SegmentedState[Any, Any]:
        if not isinstance(state, SegmentedState):
            raise FoldDefinitionError(
                f"fold {self.name}: a handler returned {type(state).__name__}, not a SegmentedState"
            )
        return state

    def _working(self, state: SegmentedState[Any, Any]) -> _Folding:
        return _Folding(state)

    def _settled(self, work: _Folding) -> SegmentedState[Any, Any]:
        return work.settled()

    def _step_seal(self) -> None:
        return None  # open and attach make segments frozen; on() seals what its handler returns

    # -- handlers -----------------------------------------------------------------------------

    def open(
        self, event: type[E]
    ) -> Callable[[Callable[[Envelope[E]], Segment[Any]]], Callable[[Envelope[E]], Segment[Any]]]:
        """Open a segment per event: ``fn(envelope) -> Segment(id, data)``, appended as newest."""

        def register(
            fn: Callable[[Envelope[E]], Segment[Any]],
        ) -> Callable[[Envelope[E]], Segment[Any]]:
            def step(work: _Folding, env: Envelope[Any]) -> _Folding:
                segment = fn(env)
                if type(segment) is not Segment:
                    if not isinstance(segment, Segment):
                        raise FoldDefinitionError(
                            f"fold {self.name}: open handler for {env.type} must return a Segment"
                        )
                    segment = Segment(segment.id, segment.data)
                data = segment.data
                if type(data) not in _LEAVES:  # frozen already: kept as it is
                    frozen = freeze(data)
                    if frozen is not data:
                        segment = Segment(segment.id, frozen)
                ids = work.ids
                if ids is not None:
                    work.ids = ids.opened(segment.id, len(work.segments))
                work.segments.append(segment)
                return work

            self._register(event, step)
            return fn

        return register

    def attach(
        self,
        event: type[E],
        *,
        to: Callable[[Envelope[E]], str],
        kind: str | None = None,
        on_missing: OnMissing = "report",
    ) -> Callable[[Callable[[Any, Envelope[E]], Any]], Callable[[Any, Envelope[E]], Any]]:
        """Update the newest segment with id ``to(envelope)`` (and ``kind``, when given):
        its data becomes ``fn(data, envelope)``. With no such segment the state stays as it
        is and the event is reported (``on_missing="report"``) or not (``"ignore"``)."""
        if on_missing not in ("report", "ignore"):
            raise FoldDefinitionError(f"fold {self.name}: on_missing must be 'report' or 'ignore'")
        if kind is not None and self.tag is None:
            raise FoldDefinitionError(f"fold {self.name}: attach(kind=…) needs the fold's tag= set")
        tag = self.tag or ""  # read only with kind, which needs a tag
        report = on_missing == "report"

        def register(fn: Callable[[Any, Envelope[E]], Any]) -> Callable[[Any, Envelope[E]], Any]:
            def step(work: _Folding, env: Envelope[Any]) -> _Folding:
                target = to(env)
                segments = work.segments
                ids = work.ids
                if ids is None:
                    ids = work.ids = _Ids(segments)
                held = ids.positions.get(target)
                segment = None
                if isinstance(held, int):  # one segment with the id, the usual case: inlined
                    if held < len(segments):
                        segment = segments[held]
                        if kind is not None:
                            data = segment.data
                            found = (
                                data.get(tag)
                                if isinstance(data, dict)
                                else getattr(data, tag, None)
                            )
                            if found != kind:
                                segment = None
                elif held is not None:
                    held = work.newest(held, kind, tag)
                    if held is not None:
                        segment = segments[held]
                if segment is None:
                    if report:
                        raise MissingSegmentError(target)
                    return work
                data = fn(segment.data, env)
                if data is not segment.data:
                    segments[held] = Segment(
                        segment.id, data if type(data) in _LEAVES else freeze(data)
                    )
                return work

            self._register(event, step)
            return fn

        return register

    def on(
        self, event: type[E]
    ) -> Callable[
        [Callable[[SegmentedState[Any, Any], Envelope[E]], SegmentedState[Any, Any]]], Any
    ]:
        """Handle an event with the whole state (remove or merge segments, …)."""

        def register(
            fn: Callable[[SegmentedState[Any, Any], Envelope[E]], SegmentedState[Any, Any]],
        ) -> Any:
            def step(work: _Folding, env: Envelope[Any]) -> _Folding:
                return _Folding(self._seal(fn(work.settled(), env)))

            self._register(event, step)
            return fn

        return register

    # -- checkpoints --------------------------------------------------------------------------

    @property
    def can_checkpoint(self) -> bool:
        return self.scope == "context"

    def encode_state(self, state: SegmentedState[Any, Any]) -> Any:
        if not self.can_checkpoint:
            return super().encode_state(state)
        if not isinstance(state, SegmentedState):
            raise CheckpointError(
                f"fold {self.name}: the new state must be a SegmentedState, "
                f"not {type(state).__name__}",
                reason="invalid-state",
            )
        try:
            segments = []
            for segment in state.segments:
                data = self._data_adapter.validate_python(segment.data, **STRICT_EXTRA)
                segments.append(
                    {"id": segment.id, "data": self._data_adapter.dump_python(data, mode="json")}
                )
            summary = None
            if state.summary is not None:
                if self._summary_adapter is None:
                    raise CheckpointError(
                        f"fold {self.name}: the new state has a summary but the fold has no "
                        "summary schema (give it summary=)",
                        reason="invalid-state",
                    )
                summary = self._summary_adapter.dump_python(
                    self._summary_adapter.validate_python(state.summary, **STRICT_EXTRA),
                    mode="json",
                )
        except (ValidationError, ValueError, TypeError) as exc:
            raise CheckpointError(
                f"fold {self.name}: the new state does not fit its schema: {exc}",
                reason="invalid-state",
            ) from exc
        return {"summary": summary, "segments": segments}

    def decode_state(self, encoded: Any) -> SegmentedState[Any, Any]:
        if not isinstance(encoded, dict) or not isinstance(encoded.get("segments"), list):
            raise InvalidInputError(
                f"fold {self.name}: a checkpoint state is an object with a segments list"
            )
        summary = encoded.get("summary")
        if summary is not None:
            if self._summary_adapter is None:
                raise InvalidInputError(
                    f"fold {self.name}: the checkpoint has a summary but the fold has no summary "
                    "schema"
                )
            summary = freeze(self._summary_adapter.validate_python(summary))
        segments = [
            Segment(str(item["id"]), freeze(self._data_adapter.validate_python(item["data"])))
            for item in encoded["segments"]
        ]
        return SegmentedState(pvector(segments), summary)

    @overload
    def kind(self, segment: Segment[Any]) -> Any: ...
    @overload
    def kind(self, segment: Any) -> Any: ...
    def kind(self, segment: Any) -> Any:
        """The kind of a segment, read through the fold's tag."""
        if self.tag is None:
            return None
        return _kind_of(segment.data if isinstance(segment, Segment) else segment, self.tag)
