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
from .freeze import freeze

__all__ = ["OnMissing", "Segment", "SegmentedFold", "SegmentedState"]

D = TypeVar("D")
M = TypeVar("M")
OnMissing = Literal["report", "ignore"]


@dataclass(frozen=True, slots=True)
class Segment(Generic[D]):
    """One atomic unit of a segmented state: its id (unique, addresses it in views) and data."""

    id: str
    data: D
    # Per-segment memo (token counts per counter, elided forms): segments are immutable,
    # so whatever is computed from one stays true for as long as it lives. Not an init
    # field: dataclasses.replace(segment, data=…) would hand the copy the original's memo.
    _memo: dict[Any, Any] = field(default_factory=dict, init=False, repr=False, compare=False)


# The concrete vector type: PVector is an abstract base class, and an isinstance check
# against it (its __instancecheck__) cost more than the append it guarded in every handler.
_PVECTOR: type[Any] = type(pvector())


class _Ids:
    """Segment id -> positions (ascending), shared by a line of states: an open by the
    newest state (the one as long as the index) appends to it in place, O(1); an open by
    an older one (a fork) gets no index and builds its own on its first attach. A state
    reads only the positions below its length, which its own segments wrote. Not a
    pyrsistent pmap: a young-generation GC pass traverses its new nodes, and merging
    immutable levels cost O(log n) per open, growing with the history."""

    __slots__ = ("_lock", "length", "positions")

    def __init__(self, segments: Sequence[Segment[Any]]) -> None:
        self.positions: dict[str, list[int]] = {}
        for position, segment in enumerate(segments):
            self.positions.setdefault(segment.id, []).append(position)
        self.length = len(segments)
        self._lock = Lock()

    def opened(self, segment_id: str, position: int) -> _Ids | None:
        """This index with the segment at ``position`` added, or None when a later state
        took that position already (the opening state is a fork)."""
        with self._lock:
            if self.length != position:
                return None
            self.positions.setdefault(segment_id, []).append(position)
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

    def _positions(self, segment_id: str) -> Iterator[int]:
        """The positions of the segments with this id, newest first."""
        ids = self._ids
        if ids is None:
            ids = _Ids(self.segments)
            object.__setattr__(self, "_ids", ids)
        length = len(self.segments)
        for position in reversed(ids.positions.get(segment_id, ())):
            if position < length:
                yield position

    def __iter__(self) -> Iterator[Segment[D]]:
        return iter(self.segments)

    def __len__(self) -> int:
        return len(self.segments)


def _derived(
    segments: PVector[Segment[Any]], summary: Any, ids: _Ids | None
) -> SegmentedState[Any, Any]:
    # Not through __init__: the vector is one already, and this runs in every handler.
    state: SegmentedState[Any, Any] = object.__new__(SegmentedState)
    object.__setattr__(state, "segments", segments)
    object.__setattr__(state, "summary", summary)
    object.__setattr__(state, "_ids", ids)
    return state


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

    # -- handlers -----------------------------------------------------------------------------

    def open(
        self, event: type[E]
    ) -> Callable[[Callable[[Envelope[E]], Segment[Any]]], Callable[[Envelope[E]], Segment[Any]]]:
        """Open a segment per event: ``fn(envelope) -> Segment(id, data)``, appended as newest."""

        def register(
            fn: Callable[[Envelope[E]], Segment[Any]],
        ) -> Callable[[Envelope[E]], Segment[Any]]:
            def apply(
                state: SegmentedState[Any, Any], env: Envelope[Any]
            ) -> SegmentedState[Any, Any]:
                segment = fn(env)
                if not isinstance(segment, Segment):
                    raise FoldDefinitionError(
                        f"fold {self.name}: open handler for {env.type} must return a Segment"
                    )
                data = freeze(segment.data)
                if data is not segment.data or type(segment) is not Segment:
                    segment = Segment(segment.id, data)
                segments: Any = state.segments  # a pvector (__post_init__ makes one)
                ids = state._ids
                if ids is not None:
                    ids = ids.opened(segment.id, len(segments))
                return _derived(segments.append(segment), state.summary, ids)

            self._register(event, apply)
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
        tag = self.tag

        def register(fn: Callable[[Any, Envelope[E]], Any]) -> Callable[[Any, Envelope[E]], Any]:
            def apply(
                state: SegmentedState[Any, Any], env: Envelope[Any]
            ) -> SegmentedState[Any, Any]:
                target = to(env)
                segments: Any = state.segments  # a pvector (__post_init__ makes one)
                for index in state._positions(target):
                    segment = segments[index]
                    if kind is not None and tag is not None and _kind_of(segment.data, tag) != kind:
                        continue
                    data = fn(segment.data, env)
                    if data is segment.data:
                        return state
                    updated = Segment(segment.id, freeze(data))
                    return _derived(segments.set(index, updated), state.summary, state._ids)
                if on_missing == "report":
                    raise MissingSegmentError(target)
                return state

            self._register(event, apply)
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
            self._register(event, fn)
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
