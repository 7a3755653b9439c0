"""Rebuilding recorded requests from the journal, byte for byte, and verifying them.

A request @N is a pure function of the journal through N: the context fold through the
request event (which carries its header snapshot) rendered for the header's transport.
Whatever is appended later, the rebuild gives the same bytes. ``RequestRecorded`` keeps
the hash of the bytes actually sent, so :class:`RequestVerifier` (and
:func:`verify_requests`) can prove it, and the manifest of a request of an event-driven
turn (``turns``), which the rebuild recomputes from the turn records through the request
(:func:`rebuild_manifest`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import Field, SerializerFunctionWrapHandler, ValidationError, model_serializer

from ..errors import RebuildError
from ..events import Event, StoredEvent
from ..wire import RenderedRequest, render_request
from .events import ContextAdded, LlmResponse
from .manifest import Manifest
from .projection import AgentContext
from .request import Built, build
from .state import AgentContextState
from .turns import Turns, TurnState, fold_turns, turns_through

__all__ = [
    "RequestDrift",
    "RequestRecorded",
    "RequestVerifier",
    "VerifySummary",
    "rebuild_manifest",
    "rebuild_request",
    "rebuild_state",
    "verify_requests",
]


class RequestRecorded(Event, type="contextfold.agent/request-recorded", runtime_only=True):
    """What was sent for request ``request_offset``: transport, size and SHA-256 of the body,
    and the manifest of the event-driven turn it belongs to (None outside one)."""

    request_offset: int = Field(ge=1)
    transport: str
    sha256: str
    size: int = Field(ge=0)
    manifest: Manifest | None = None

    @model_serializer(mode="wrap")
    def _canonical_absence(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # No manifest is no field: a request outside a turn is recorded as before.
        data: dict[str, Any] = handler(self)
        if data.get("manifest") is None:
            data.pop("manifest", None)
        return data


class _Reader(Protocol):
    def read_all(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[StoredEvent]: ...


@dataclass(frozen=True, slots=True)
class RequestDrift:
    """A recorded request whose rebuild differs (or fails); ``recorded_at`` is the position
    of the record that says so."""

    request_offset: int
    recorded: str
    rebuilt: str | None
    error: str | None = None
    recorded_at: int | None = None


def _fold(state: AgentContextState, stored: StoredEvent) -> AgentContextState:
    try:
        envelope = AgentContext.decode(stored)
    except (ValueError, ValidationError):
        return state  # the fold skips what does not decode; the rebuild must agree
    return state if envelope is None else AgentContext.apply(state, envelope)


async def rebuild_state(journal: _Reader, stream: str, offset: int) -> AgentContextState:
    """The agent context folded through ``offset`` (inclusive), from the journal's start.

    Reads only the event types of the ``AgentContext`` fold.
    """
    state = AgentContext.initial_state()
    events = journal.read_all(stream, types=AgentContext.event_types)
    async with aclosing(events):  # type: ignore[type-var]
        async for stored in events:
            if stored.position > offset:
                break
            state = _fold(state, stored)
    return state


_Rebuilt = tuple[Built, RenderedRequest]
"""A request's build and body: passed back as ``previous`` to rebuild a later request of
the same stream, whose shared history and messages are then not built again."""


def _render(
    state: AgentContextState, stream: str, offset: int, previous: _Rebuilt | None = None
) -> _Rebuilt:
    """Request @``offset`` from ``state``, the context folded exactly through it, reusing
    ``previous`` (an earlier request's, any: it changes only the cost)."""
    if state.request_offset != offset or state.header is None:
        raise RebuildError(
            f"stream {stream!r} position {offset} is not a model request with a header "
            "(an LlmRequestRequested); pass the offset of a request event"
        )
    last_built, last_body = previous if previous is not None else (None, None)
    try:
        built = build(state, previous=last_built)
        return built, render_request(built.request, state.header.transport, previous=last_body)
    except Exception as exc:
        raise RebuildError(
            f"request @{offset} of stream {stream!r} cannot be rebuilt: {exc}"
        ) from exc


async def rebuild_request(journal: _Reader, stream: str, offset: int) -> RenderedRequest:
    """The exact request body of request @``offset``. Raises RebuildError when @offset is not
    a request event or cannot be rendered."""
    return _render(await rebuild_state(journal, stream, offset), stream, offset)[1]


async def rebuild_manifest(journal: _Reader, stream: str, offset: int) -> Manifest | None:
    """The manifest of request @``offset``, recomputed from the turn records through it:
    the open turn's layers and its steers accepted before the request; None outside a turn.
    Pair it with :func:`rebuild_request`, which checks that @offset is a request."""
    return (await turns_through(journal, stream, offset)).manifest


@dataclass(frozen=True, slots=True)
class VerifySummary:
    """What a verification found so far; its size does not depend on the stream's.

    ``requests``: distinct request offsets recorded (a retry's record counts once);
    ``records``: records read; ``drifts``: drifts found, ``first_drift`` the first of them;
    ``largest``: bytes of the largest request body rebuilt.
    """

    requests: int = 0
    records: int = 0
    drifts: int = 0
    first_drift: RequestDrift | None = None
    largest: int = 0


@dataclass(frozen=True, slots=True)
class _Record:
    sha256: str
    manifest: str | None


@dataclass(frozen=True, slots=True)
class _Check:
    """What a record of one request must match: the hash of its rebuilt body (None, and
    why, when it cannot be rebuilt), its manifest's hash from the turn records through it,
    and what does not hold in those records."""

    rebuilt: str | None
    error: str | None
    manifest: str | None
    problems: tuple[str, ...]
    size: int


_RECORD = RequestRecorded.event_type


def _check(
    state: AgentContextState,
    turns: TurnState,
    stream: str,
    offset: int,
    previous: _Rebuilt | None,
) -> tuple[_Check, _Rebuilt | None]:
    """The check of request @``offset`` from the states folded exactly through it, and what
    the next check reuses: this request's build and body (``previous`` when it has none).
    Only the body's hash and size go into the check."""
    try:
        rebuilt = _render(state, stream, offset, previous)
    except RebuildError as exc:
        return _Check(None, str(exc), None, (), 0), previous
    rendered = rebuilt[1]
    manifest = turns.manifest
    problems = turns.problems_at(offset) if manifest is not None else ()
    hashed = manifest.hash if manifest is not None else None
    return _Check(rendered.sha256, None, hashed, problems, len(rendered.body)), rebuilt


def _drift(
    check: _Check, record: _Record, stream: str, offset: int, position: int
) -> RequestDrift | None:
    """The drift of the record at ``position`` of request @``offset`` from its check, None
    when it holds."""
    error = check.error
    if record.sha256 == check.rebuilt:
        if record.manifest != check.manifest:
            error = (
                f"request @{offset} of stream {stream!r} recorded manifest "
                f"{record.manifest}; its turn records through it give {check.manifest}"
            )
        elif check.problems:
            error = (
                f"request @{offset} of stream {stream!r}: its turn's records do not "
                f"hold: {'; '.join(check.problems)}"
            )
        else:
            return None
    return RequestDrift(offset, record.sha256, check.rebuilt, error, position)


def _record(stored: StoredEvent) -> tuple[int, _Record]:
    record = stored.decode(RequestRecorded)
    assert isinstance(record, RequestRecorded)
    manifest = record.manifest.hash if record.manifest is not None else None
    return record.request_offset, _Record(record.sha256, manifest)


def _in_order(latest: int | None, position: int, offset: int) -> bool:
    """Whether a record at ``position`` naming ``offset`` is checked where it is read: it
    names the latest request before it, or a position between that request and itself
    (which is then no request). Every other record is checked after the pass."""
    return offset == latest or (latest or 0) < offset < position


def _matters(turns: TurnState, type_name: str) -> bool:
    """Whether the turn records can change on an event of this type: an item only where a
    record promised one, an answer only to an open turn (so a stream without turns decodes
    no extra event)."""
    if turns.awaiting is not None:
        return True
    if type_name == ContextAdded.event_type:
        return False
    return type_name != LlmResponse.event_type or turns.open


class RequestVerifier:
    """Rebuilds every recorded request of ``stream`` and yields each record whose hash the
    rebuild does not give (different bytes, or an offset that is no request: an error), or
    whose manifest the turn records through the request do not give, or whose turn's
    envelope is not the item that followed its record. Iterate it once; :attr:`summary`
    holds the counts so far, final when the iteration ends.

    One pass, page by page: records and events are read together in stream order, and a
    record naming the latest request (as the runtime writes them) is checked against that
    request rebuilt from the state folded exactly through it, reusing the build and body
    of the request checked before it (so a request costs what it adds to that one), which
    it then replaces. Memory is the fold state and two requests, whatever the number of
    requests. A record naming an older request (written by hand) is checked after the
    pass, by a second one up to the same position. A record identical to an earlier one
    of the same request is checked once; a request never recorded is not checked.
    Raises what the journal raises, and CorruptEventError for a record that does not decode.
    """

    def __init__(self, journal: _Reader, stream: str, *, page_size: int = 1000) -> None:
        self._journal = journal
        self._stream = stream
        self._page_size = page_size
        self._requests = self._records = self._drifts = self._largest = 0
        self._first: RequestDrift | None = None
        self._context_types = frozenset(AgentContext.event_types)
        self._turn_types = frozenset(Turns.event_types)
        self._run = self._verify()

    @property
    def summary(self) -> VerifySummary:
        """The counts so far."""
        return VerifySummary(
            self._requests, self._records, self._drifts, self._first, self._largest
        )

    def __aiter__(self) -> RequestVerifier:
        return self

    async def __anext__(self) -> RequestDrift:
        return await self._run.__anext__()

    async def aclose(self) -> None:
        """Stop verifying (the journal reads are closed)."""
        await self._run.aclose()

    def _read(self) -> AsyncIterator[StoredEvent]:
        types = sorted({*self._context_types, *self._turn_types, _RECORD})
        return self._journal.read_all(self._stream, types=types, page_size=self._page_size)

    def _step(
        self, state: AgentContextState, turns: TurnState, stored: StoredEvent
    ) -> tuple[AgentContextState, TurnState]:
        """Both states with one event that is no record folded in."""
        if stored.type in self._context_types:
            state = _fold(state, stored)
        if stored.type in self._turn_types and _matters(turns, stored.type):
            turns = fold_turns(turns, stored)
        return state, turns

    def _counted(self, check: _Check) -> None:
        self._requests += 1
        self._largest = max(self._largest, check.size)

    def _found(self, drift: RequestDrift) -> RequestDrift:
        self._drifts += 1
        if self._first is None:
            self._first = drift
        return drift

    async def _verify(self) -> AsyncGenerator[RequestDrift, None]:
        stream = self._stream
        state = AgentContext.initial_state()
        turns = Turns.initial_state()
        at: tuple[AgentContextState, TurnState] | None = None  # through the latest request
        window: dict[int, tuple[_Check, set[_Record]]] = {}  # checked since that request
        later: dict[int, dict[_Record, int]] = {}  # checked after the pass, by position
        last = 0
        rebuilt: _Rebuilt | None = None  # of the request checked last, for the next one
        events = self._read()
        async with aclosing(events):  # type: ignore[type-var]
            async for stored in events:
                last = stored.position
                if stored.type == _RECORD:
                    offset, record = _record(stored)
                    self._records += 1
                    if not _in_order(state.request_offset, stored.position, offset):
                        later.setdefault(offset, {}).setdefault(record, stored.position)
                        continue
                    entry = window.get(offset)
                    if entry is None:
                        if offset == state.request_offset:
                            assert at is not None  # taken at the request, used once
                            check, rebuilt = _check(*at, stream, offset, rebuilt)
                            at = None
                        else:  # no request: any state says so
                            check, rebuilt = _check(state, turns, stream, offset, rebuilt)
                        entry = window[offset] = (check, set())
                        self._counted(check)
                    check, seen = entry
                    if record not in seen:
                        seen.add(record)
                        drift = _drift(check, record, stream, offset, stored.position)
                        if drift is not None:
                            yield self._found(drift)
                    continue
                state, turns = self._step(state, turns, stored)
                if state.request_offset == stored.position:
                    at, window = (state, turns), {}
        if later:
            async for drift in self._recheck(later, last):
                yield drift

    async def _recheck(
        self, later: dict[int, dict[_Record, int]], last: int
    ) -> AsyncGenerator[RequestDrift, None]:
        """The records the pass left for later, by offset: each request rebuilt from the
        states folded through it, the pass's own checks of the same request recognised
        by replaying it (so nothing is counted or reported twice)."""
        stream = self._stream
        pending = sorted(later)
        checks: dict[int, _Check] = {}
        checked: dict[int, set[_Record]] = {}  # what the pass checked of those offsets
        state = AgentContext.initial_state()
        turns = Turns.initial_state()
        index = 0
        rebuilt: _Rebuilt | None = None  # of the request checked last, for the next one
        events = self._read()
        async with aclosing(events):  # type: ignore[type-var]
            async for stored in events:
                if stored.position > last:
                    break  # appended since the pass: not part of this verification
                # The states now hold every event before this one.
                while index < len(pending) and pending[index] < stored.position:
                    offset = pending[index]
                    checks[offset], rebuilt = _check(state, turns, stream, offset, rebuilt)
                    index += 1
                if stored.type == _RECORD:
                    offset, record = _record(stored)
                    if offset in later and _in_order(state.request_offset, stored.position, offset):
                        checked.setdefault(offset, set()).add(record)
                    continue
                state, turns = self._step(state, turns, stored)
        for offset in pending[index:]:
            checks[offset], rebuilt = _check(state, turns, stream, offset, rebuilt)
        for offset in pending:
            check, seen = checks[offset], checked.get(offset, set())
            if not seen:
                self._counted(check)
            for record, position in later[offset].items():
                if record not in seen:
                    drift = _drift(check, record, stream, offset, position)
                    if drift is not None:
                        yield self._found(drift)


async def verify_requests(journal: _Reader, stream: str) -> tuple[RequestDrift, ...]:
    """Every drift :class:`RequestVerifier` finds in ``stream``, by request offset, then
    record position. Holds the drifts only: iterate a :class:`RequestVerifier` to hold none."""
    async with aclosing(RequestVerifier(journal, stream)) as verifier:
        found = [drift async for drift in verifier]
    return tuple(sorted(found, key=_drift_order))


def _drift_order(drift: RequestDrift) -> tuple[int, int]:
    return drift.request_offset, drift.recorded_at or 0
