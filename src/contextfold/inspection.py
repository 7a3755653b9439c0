"""What the read-only surfaces (the CLI and the HTTP API) answer about a journal, so that
neither ever reports success on a mistake.

A stream must hold events (else :class:`~contextfold.errors.UnknownStreamError` with the
closest names the journal has), a cursor must name one of its events (else
:class:`~contextfold.errors.UnknownCursorError`: the library's reads reset on it, a user
typing one has made a mistake), and a verification says how many requests it checked.
A verification streams (:class:`~contextfold.context.rebuild.RequestVerifier`): it holds
one request at a time and only the drifts it is asked to keep. A stream holding a
framework's call records (``contextfold.calls/``) has them verified too
(:func:`~contextfold.context.call_records.verify_calls`), and each of its requests can be
rebuilt (:func:`rebuild_framework_request`). Nothing here writes.
"""

from __future__ import annotations

import difflib
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import ValidationError

from .canonical import sha256_hex
from .context.call_records import CALL_TYPES, CallProblem, Calls, call_body, verify_calls
from .context.rebuild import RequestDrift, RequestVerifier
from .errors import ContextfoldError, CorruptEventError, UnknownCursorError, UnknownStreamError
from .events import Event, StoredEvent
from .store.base import MAX_LIMIT, StreamInfo, parse_cursor
from .store.rows import CorruptRow, SkipCorrupt
from .timeline.langgraph_values import LANGGRAPH_TYPES, shown_payload

__all__ = [
    "MAX_SUGGESTIONS",
    "FrameworkRequest",
    "Problem",
    "Progress",
    "Verification",
    "event_json",
    "read_call_records",
    "rebuild_framework_request",
    "require_cursor",
    "require_stream",
    "verification_json",
    "verify_stream",
]

MAX_SUGGESTIONS = 3
"""Most stream names an unknown-stream error suggests."""

Progress = Callable[[str, int, int], None]
"""``progress(phase, position, version)``: called as a long read goes through a stream."""

Problem = Callable[[RequestDrift | CorruptRow | CallProblem], None]
"""``problem(found)``: called with each drift, corrupt row and problem of a framework's
call records as a verification finds it."""


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
    async def version(self, stream: str) -> int: ...

    async def contains(self, stream: str, cursor: str) -> bool: ...

    def all_streams(
        self, *, prefix: str | None = None, page_size: int = MAX_LIMIT
    ) -> AsyncIterator[StreamInfo]: ...


def event_json(event: StoredEvent) -> dict[str, Any]:
    """A stored event: coordinates, type, payload and meta. A payload that no longer
    decodes is ``null`` with ``payload_error`` naming the row (a listing never fails on it).

    ``payload`` is always the payload as stored, so a client may append it elsewhere as
    it is. A LangGraph checkpoint record's values, stored as LangGraph's serializer wrote
    them (base64 msgpack), are also given decoded as ``readable`` (see
    :mod:`~contextfold.timeline.langgraph_values`): ``payload_view`` says how much
    (``decoded``, ``partly decoded`` or ``as stored``), ``payload_note`` why a value stayed
    as stored.
    """
    body: dict[str, Any] = {
        "position": event.position,
        "global_position": event.global_position,
        "cursor": event.cursor,
        "type": event.type,
    }
    try:
        payload = event.payload
    except CorruptEventError as exc:
        body["payload"] = None
        body["payload_error"] = str(exc)
    else:
        body["payload"] = payload
        shown, view, note = _shown(event.type, payload)
        if view is not None:
            body["payload_view"] = view
            if shown is not payload:
                body["readable"] = shown
        if note is not None:
            body["payload_note"] = note
    meta = event.meta
    body["meta"] = {
        "event_id": meta.event_id,
        "time": meta.time,
        "run_id": meta.run_id,
        "actor": meta.actor,
        "idempotency_key": meta.idempotency_key,
        "channels": list(meta.channels),
    }
    return body


def _shown(event_type: str, payload: Any) -> tuple[Any, str | None, str | None]:
    """The payload as listed, how (None: as stored, nothing to decode), and why a value
    stayed as stored."""
    if not event_type.startswith(LANGGRAPH_TYPES):
        return payload, None, None
    shown, note = shown_payload(event_type, payload)
    changed = shown != payload
    if note is None:
        return shown, "decoded" if changed else None, None
    return shown, "partly decoded" if changed else "as stored", note


async def require_stream(
    journal: _Journal, stream: str, *, where: str = "", page_size: int = MAX_LIMIT
) -> int:
    """The version of ``stream``; UnknownStreamError when it has no events, naming the
    closest names among all streams, listed ``page_size`` at a time (``where``, e.g. the
    journal URL, is added to the message)."""
    version = await journal.version(stream)
    if version:
        return version
    names = [info.stream async for info in journal.all_streams(page_size=page_size)]
    close = tuple(difflib.get_close_matches(stream, names, n=MAX_SUGGESTIONS, cutoff=0.6))
    if close:
        hint = f"did you mean {' or '.join(map(repr, close))}?"
    elif names:
        hint = "no stream has a close name"
    else:
        hint = "the journal holds no stream at all"
    place = f" in {where}" if where else ""
    raise UnknownStreamError(
        f"no stream {stream!r}{place}: {hint}", stream=stream, suggestions=close
    )


async def require_cursor(journal: _Journal, stream: str, cursor: str) -> str:
    """``cursor`` when it names an event of ``stream``; UnknownCursorError saying why not."""
    if await journal.contains(stream, cursor):
        return cursor
    if parse_cursor(cursor) is None:
        reason = "is not a cursor (a cursor is the number a read printed for an event)"
    else:
        reason = (
            f"names no event of stream {stream!r} (a cursor of another stream or journal, "
            "or the stream was deleted since)"
        )
    raise UnknownCursorError(
        f"cursor {cursor[:80]!r} {reason}: pass a cursor read from this stream, or none "
        "to read from its start",
        stream=stream,
        cursor=cursor,
    )


@dataclass(frozen=True, slots=True)
class Verification:
    """The outcome of verifying a stream's recorded requests.

    ``requests``: the recorded requests checked (each offset once, retries included in
    it); ``drifts``: records whose rebuild differs or fails, the first found up to the
    number asked for, by offset; ``corrupt``: rows that no longer decode, left out of the
    rebuild as the folds leave them out; ``drift_count``: every drift found.
    ``framework_requests``: a framework's recorded requests checked, ``framework_views``
    those of them chosen by a recorded view (recomputed), ``frameworks`` the frameworks
    that recorded them; ``framework_problems``: what does not add up in the call records,
    the first up to the number asked for; ``framework_problem_count``: every one found.
    """

    stream: str
    requests: int
    drifts: tuple[RequestDrift, ...]
    corrupt: tuple[CorruptRow, ...]
    drift_count: int
    framework_requests: int = 0
    framework_views: int = 0
    frameworks: tuple[str, ...] = ()
    framework_problems: tuple[CallProblem, ...] = ()
    framework_problem_count: int = 0

    @property
    def ok(self) -> bool:
        """True only when requests were checked and every one rebuilt byte for byte (a
        framework's: to its recorded digest, its view recomputed)."""
        checked = self.requests > 0 or self.framework_requests > 0
        problems = self.drift_count or self.corrupt or self.framework_problem_count
        return checked and not problems


class _Watched:
    """A reader passing every event through, reporting progress as positions go by."""

    def __init__(self, reader: SkipCorrupt, version: int, progress: Progress, phase: str) -> None:
        self._reader = reader
        self._version = version
        self._progress = progress
        self._phase = phase

    async def read_all(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[StoredEvent]:
        rows = self._reader.read_all(stream, after=after, types=types, page_size=page_size)
        try:
            async for event in rows:
                self._progress(self._phase, event.position, self._version)
                yield event
        finally:
            aclose = getattr(rows, "aclose", None)
            if aclose is not None:
                await aclose()


async def read_call_records(journal: _Reader, stream: str) -> Calls:
    """Every framework call record of ``stream``, in one read of their types; a record that
    does not decode is left out (read through a ``SkipCorrupt`` reader to have it listed)."""
    calls = Calls()
    events = journal.read_all(stream, types=list(CALL_TYPES))
    async with aclosing(events):  # type: ignore[type-var]
        async for stored in events:
            try:
                event = stored.decode()
            except (ValueError, ValidationError, ContextfoldError):
                continue
            calls.add(stored.position, stored.meta.time, event)
    return calls


async def verify_stream(
    journal: _Journal,
    stream: str,
    *,
    where: str = "",
    progress: Progress | None = None,
    keep: int | None = None,
    problem: Problem | None = None,
) -> Verification:
    """Verify every recorded request of ``stream`` in one streaming pass (see
    :class:`~contextfold.context.rebuild.RequestVerifier`), reading around corrupt rows,
    then its framework call records, if any, in one read of their types.

    ``keep``: the most drifts (and call-record problems) the verification holds (None:
    all), the first found; ``problem`` is called with each drift as it is found, with
    each corrupt row before the drift that follows it, and with each call-record problem
    last. Raises UnknownStreamError for a stream without events.
    """
    version = await require_stream(journal, stream, where=where)
    reader = SkipCorrupt(journal)

    def watched(phase: str) -> SkipCorrupt | _Watched:
        return reader if progress is None else _Watched(reader, version, progress, phase)

    kept: list[RequestDrift] = []
    shown = 0
    async with aclosing(RequestVerifier(watched("rebuilding requests"), stream)) as verifier:
        async for drift in verifier:
            if problem is not None:
                shown = _report(problem, reader.corrupt, shown)
                problem(drift)
            if keep is None or len(kept) < keep:
                kept.append(drift)
        summary = verifier.summary
    calls = await read_call_records(watched("verifying framework requests"), stream)
    found = verify_calls(calls)
    corrupt = reader.corrupt
    if problem is not None:
        _report(problem, corrupt, shown)
        for each in found:
            problem(each)
    drifts = tuple(sorted(kept, key=lambda drift: drift.request_offset))
    return Verification(
        stream,
        summary.requests,
        drifts,
        corrupt,
        summary.drifts,
        framework_requests=len(calls.requests),
        framework_views=sum(1 for r in calls.requests.values() if r.view is not None),
        frameworks=tuple(sorted({r.framework for r in calls.requests.values()})),
        framework_problems=tuple(found if keep is None else found[:keep]),
        framework_problem_count=len(found),
    )


def _report(problem: Problem, corrupt: tuple[CorruptRow, ...], shown: int) -> int:
    """Report the corrupt rows after the first ``shown``; how many are reported now."""
    for row in corrupt[shown:]:
        problem(row)
    return len(corrupt)


def verification_json(done: Verification) -> dict[str, Any]:
    """A verification as JSON: ``ok`` only when requests were checked and none drifted;
    ``drifts`` lists those the verification kept, ``drift_count`` counts them all. The
    ``framework_`` fields say the same of a framework's call records, present when the
    stream holds some."""
    body: dict[str, Any] = {
        "stream": done.stream,
        "ok": done.ok,
        "requests": done.requests,
        "drift_count": done.drift_count,
        "drifts": [
            {
                "request_offset": d.request_offset,
                "recorded": d.recorded,
                "rebuilt": d.rebuilt,
                "error": d.error,
                "recorded_at": d.recorded_at,
            }
            for d in done.drifts
        ],
        "corrupt": [
            {"position": row.position, "type": row.type, "reason": row.reason}
            for row in done.corrupt
        ],
    }
    if done.framework_requests or done.framework_problem_count:
        body |= {
            "framework_requests": done.framework_requests,
            "framework_views": done.framework_views,
            "frameworks": list(done.frameworks),
            "framework_problem_count": done.framework_problem_count,
            "framework_problems": [
                {"position": p.position, "problem": p.problem} for p in done.framework_problems
            ],
        }
    return body


@dataclass(frozen=True, slots=True)
class FrameworkRequest:
    """A framework's request @``offset`` rebuilt from the stream's call records: ``body``
    is the canonical JSON of its framework, model, messages and options, whose SHA-256 the
    record holds as ``recorded_sha256``."""

    offset: int
    framework: str
    model: str
    body: bytes
    recorded_sha256: str

    @property
    def sha256(self) -> str:
        return sha256_hex(self.body)


async def rebuild_framework_request(
    journal: _Reader, stream: str, offset: int
) -> FrameworkRequest | None:
    """The framework request recorded @``offset`` of ``stream``, rebuilt; None when @offset
    holds none. Raises InvalidInputError when a message it names is not on the stream."""
    calls = await read_call_records(journal, stream)
    sent = calls.requests.get(offset)
    if sent is None:
        return None
    body = call_body(calls, offset)
    return FrameworkRequest(offset, sent.framework, sent.model, body, sent.sha256)
