"""Google ADK on the journal: :class:`JournalSessionService`, a ``BaseSessionService``, and
:class:`ContextPlugin`, contextfold's context engine in every model call of a runner
(budget, compaction, recording; see ``_adk_plugin``), with :func:`untrusted_metadata` and
:func:`untrusted_content` for external content.

Streams, one per session plus one per app and one per (app, user) for shared state::

    adk/session/{app}/{user}/{session}  adk/session-created, then adk/event (ADK's JSON)
                                        each, adk/session-deleted when deleted
    adk/app/{app}                       adk/state-changed: app: state, for all the app's sessions
    adk/user/{app}/{user}               adk/state-changed: user: state, for all the user's ones

Each name part is escaped (``%``, ``/``, whitespace and unprintable characters become
``%XX`` of their UTF-8 bytes), so the scheme is one to one. An ADK event is stored as
``Event.model_dump(mode="json", exclude_none=True)``: ``Event.model_validate`` of the stored
payload equals the event appended. A fold over the session stream keeps the session's state
and an index of its events (cursor, timestamp, id), so a warm ``get_session`` reads only the
events it returns. The session append is the commit point; the shared deltas follow with
idempotency keys, and a crash between the two is repaired by the session's next append.
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from importlib import metadata
from typing import Any

from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from ..errors import (
    CorruptEventError,
    IdempotencyConflictError,
    InvalidInputError,
    PayloadError,
    StoreError,
    WrongExpectedVersionError,
)
from ..events import Event as JournalEvent
from ..events import RawEvent, StoredEvent
from ..folds.freeze import freeze
from ..journal import Journal
from ..journal.encode import bounded_key
from ..store.base import AppendResult

try:
    from google.adk.errors import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.platform import time as platform_time
    from google.adk.platform import uuid as platform_uuid
    from google.adk.sessions.base_session_service import (
        BaseSessionService,
        GetSessionConfig,
        ListSessionsResponse,
    )
    from google.adk.sessions.session import Session
    from google.adk.sessions.state import State

    from ._adk_calls import untrusted_content, untrusted_metadata
    from ._adk_plugin import ContextPlugin
    from ._adk_records import (
        ADK_EVENT,
        SESSION_FOLD,
        SHARED_FOLD,
        AdkEventHeader,
        AdkSessionCreated,
        AdkSessionDeleted,
        AdkStateChanged,
        Indexed,
        SessionRecord,
        Shared,
        app_stream,
        check_name,
        session_stream,
        sessions_prefix,
        shared_of,
        split_delta,
        thaw,
        user_stream,
    )
except ImportError as exc:  # pragma: no cover - exercised in a child process by the tests
    raise ImportError(
        "contextfold.integrations.adk needs Google ADK: pip install 'contextfold[adk]'"
    ) from exc

__all__ = [
    "ADK_EVENT",
    "SESSION_FOLD",
    "SHARED_FOLD",
    "AdkEventHeader",
    "AdkSessionCreated",
    "AdkSessionDeleted",
    "AdkStateChanged",
    "ContextPlugin",
    "JournalSessionService",
    "SessionRecord",
    "app_stream",
    "session_stream",
    "sessions_prefix",
    "untrusted_content",
    "untrusted_metadata",
    "user_stream",
]

log = logging.getLogger("contextfold.integrations.adk")

_MARKER = "contextfold:"  # Session._storage_update_marker: this prefix, then the head cursor
_ATTEMPTS = 16  # appends retried when only events of other types moved the stream's version
_PAGE = 1000
_CONFIRMED_MAX = 10_000


# -- helpers ----------------------------------------------------------------------------------


def _json_state(state: object) -> dict[str, Any]:
    """The JSON form of an initial state, as ADK's own database services store it."""
    if not isinstance(state, dict) or not all(isinstance(key, str) for key in state):
        raise InvalidInputError(f"state must be a dict with str keys, got {state!r:.80}")
    try:
        safe = to_jsonable_python(state)
    except Exception:  # the values no encoder knows (callables): stored as their repr
        log.warning("create_session: state values that are not JSON are stored as text")
        safe = to_jsonable_python(state, serialize_unknown=True)
    return {key: value for key, value in safe.items() if not key.startswith(State.TEMP_PREFIX)}


def _marker(cursor: str) -> str:
    return _MARKER + cursor


def _stale(session: Session, stream: str) -> StaleSessionError:
    return StaleSessionError(
        f"session {session.id!r} was modified in storage since it was loaded (stream "
        f"{stream!r}): reload it with get_session and append again; nothing was written"
    )


class _Changed(Exception):
    """The session's own events moved on since the record an append was based on."""

    def __init__(self, record: SessionRecord) -> None:
        super().__init__(record.head)
        self.record = record


# -- the service ------------------------------------------------------------------------------


class JournalSessionService(BaseSessionService):
    """ADK sessions stored in a contextfold journal (memory, SQLite or PostgreSQL).

    A warm ``get_session`` reads only the events it returns (the session fold keeps state
    and the event index); appends are optimistic: an append from a session loaded before
    another writer's raises ``StaleSessionError`` and writes nothing. ``delete_session``
    appends an ``adk/session-deleted`` record and keeps the history; with
    ``hard_delete=True`` it deletes the session's stream instead (its share of app and user
    state stays, as in ADK's own services).
    """

    def __init__(self, journal: Journal, *, hard_delete: bool = False) -> None:
        self.journal = journal
        self.hard_delete = hard_delete
        # The shared deltas known applied, per session stream (a bounded memo: forgetting one
        # costs a deduplicated append, never a lost or doubled delta).
        self._confirmed: OrderedDict[str, str] = OrderedDict()

    # -- reads ----------------------------------------------------------------------------

    async def _record(self, stream: str) -> SessionRecord:
        return await self.journal.fold(SESSION_FOLD, stream)

    async def _merged(
        self, record: SessionRecord, read: dict[str, Mapping[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The session's state with its app's and user's (``read``: states already read)."""
        read = {} if read is None else read
        merged: dict[str, Any] = thaw(record.state)
        for prefix, stream in (
            (State.APP_PREFIX, app_stream(record.app_name)),
            (State.USER_PREFIX, user_stream(record.app_name, record.user_id)),
        ):
            if stream not in read:
                read[stream] = await self.journal.fold(SHARED_FOLD, stream)
            merged.update({prefix + key: thaw(value) for key, value in read[stream].items()})
        return merged

    def _session(
        self, record: SessionRecord, state: dict[str, Any], events: list[Event]
    ) -> Session:
        session = Session(
            id=record.session_id,
            app_name=record.app_name,
            user_id=record.user_id,
            state=state,
            events=events,
            last_update_time=record.last_update_time,
        )
        session._storage_update_marker = _marker(record.head or "")
        return session

    async def _load(
        self, stream: str, record: SessionRecord, wanted: Sequence[int]
    ) -> list[Event] | None:
        """The ADK events at the ``wanted`` indices of ``record.events`` (ascending), or None
        when the stream changed under the read (deleted and written again): the caller reads
        the record again. It reads from the first wanted event on and keeps the wanted ones."""
        index = record.events
        if not wanted:
            return []
        keep = set(wanted)
        at = wanted[0]
        cursor = index[at - 1].cursor if at else record.base
        events: list[Event] = []
        while at <= wanted[-1]:
            limit = min(_PAGE, wanted[-1] + 1 - at)
            page = await self.journal.read(stream, after=cursor, types=[ADK_EVENT], limit=limit)
            if page.reset or not page.events:
                return None
            for stored in page.events:
                if stored.cursor != index[at].cursor:
                    return None
                if at in keep:
                    events.append(_decode(stored))
                at += 1
            cursor = page.cursor
        return events

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its events (all, or as ``config`` selects, in append order), or
        None. ``num_recent_events`` keeps the newest n; ``after_timestamp`` then keeps the
        newest events whose timestamps are at or after it (ADK's in-memory rules); then the
        results of function calls left out are left out too, so no result lacks its call."""
        stream = session_stream(app_name, user_id, check_name("session_id", session_id).strip())
        for _ in range(_ATTEMPTS):
            record = await self._record(stream)
            if not record.exists:
                return None
            events = await self._load(stream, record, _wanted(record.events, config))
            if events is not None:
                return self._session(record, await self._merged(record), events)
        raise StoreError(f"stream {stream!r} changed under {_ATTEMPTS} reads in a row")

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The sessions of an app (of one user, or of all users when ``user_id`` is None),
        without events, least recently updated first."""
        prefix = sessions_prefix(app_name, user_id)
        sessions = []
        shared: dict[str, Mapping[str, Any]] = {}
        for info in await self.journal.list_streams(prefix=prefix):
            record = await self._record(info.stream)
            if record.exists:
                sessions.append(self._session(record, await self._merged(record, shared), []))
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The ``user:`` state of a user, keys without the prefix (``{}`` when none)."""
        state = await self.journal.fold(SHARED_FOLD, user_stream(app_name, user_id))
        thawed: dict[str, Any] = thaw(state)
        return thawed

    # -- writes ---------------------------------------------------------------------------

    async def _append_unchanged(
        self, stream: str, event: JournalEvent | RawEvent, record: SessionRecord
    ) -> AppendResult:
        """Append while the session's own events are still those ``record`` folded (events
        of other types moving the version are no reason to refuse). Raises _Changed."""
        expected = record.version
        for _ in range(_ATTEMPTS):
            try:
                return await self.journal.append(stream, event, expected_version=expected)
            except WrongExpectedVersionError as exc:
                fresh = await self._record(stream)  # read after the refusal: sees its cause
                if fresh.head != record.head:
                    raise _Changed(fresh) from exc
                expected = exc.actual
        raise StoreError(f"stream {stream!r} moved under {_ATTEMPTS} appends in a row")

    async def _share(self, stream: str, app_name: str, user_id: str, shared: Shared | None) -> None:
        """Apply a session record's app and user deltas, at most once each (idempotent)."""
        if shared is None or self._confirmed.get(stream) == shared.source:
            return
        key = f"{stream}@{shared.source}"
        for target, delta in (
            (app_stream(app_name), shared.app),
            (user_stream(app_name, user_id), shared.user),
        ):
            if delta:
                change = AdkStateChanged(delta=thaw(delta), source=key)
                with contextlib.suppress(IdempotencyConflictError):  # applied before, by then
                    await self.journal.append(target, change, idempotency_key=bounded_key(key))
        self._confirmed[stream] = shared.source
        self._confirmed.move_to_end(stream)
        while len(self._confirmed) > _CONFIRMED_MAX:
            self._confirmed.popitem(last=False)

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """A new session (id stripped, or generated when blank) with ``state``, its ``app:``
        and ``user:`` keys shared. Raises AlreadyExistsError for an id in use."""
        if session_id is not None:
            session_id = check_name("session_id", session_id).strip()
        session_id = session_id or platform_uuid.new_uuid()
        stream = session_stream(app_name, user_id, session_id)
        created = AdkSessionCreated(
            app_name=app_name,
            user_id=user_id,
            session_id=session_id,
            state=_json_state(state if state is not None else {}),
            time=platform_time.get_time(),
        )
        record = await self._record(stream)
        for _ in range(_ATTEMPTS):
            if record.exists:
                raise AlreadyExistsError(f"Session with id {session_id} already exists.")
            try:
                done = await self._append_unchanged(stream, created, record)
            except _Changed as changed:
                record = changed.record
                continue
            except PayloadError as exc:
                raise PayloadError(
                    f"session {session_id!r}: state cannot be stored: {exc}"
                ) from exc
            app, user, own = split_delta(created.state)
            record = SessionRecord(
                exists=True,
                head=done.cursor,
                version=done.version,
                app_name=app_name,
                user_id=user_id,
                session_id=session_id,
                base=done.cursor,
                state=freeze(own),
                last_update_time=created.time,
                shared=shared_of(done.cursor, app, user),
            )
            await self._share(stream, app_name, user_id, record.shared)
            return self._session(record, await self._merged(record), [])
        raise StoreError(f"stream {stream!r} changed under {_ATTEMPTS} creations in a row")

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Delete a session (nothing when there is none): a deletion record, or with
        ``hard_delete`` the whole stream."""
        stream = session_stream(app_name, user_id, check_name("session_id", session_id).strip())
        if self.hard_delete:
            await self.journal.delete_stream(stream)
            return
        record = await self._record(stream)
        for _ in range(_ATTEMPTS):
            if not record.exists:
                return
            try:
                await self._append_unchanged(
                    stream, AdkSessionDeleted(time=platform_time.get_time()), record
                )
                return
            except _Changed as changed:
                record = changed.record
        raise StoreError(f"stream {stream!r} changed under {_ATTEMPTS} deletions in a row")

    async def append_event(self, session: Session, event: Event) -> Event:
        """Store ``event`` and apply it to ``session`` (ADK's rules: partial events are not
        stored, ``temp:`` state lives only in the session object). An equal event that is
        already the session's last is not stored again.

        Raises SessionNotFoundError, StaleSessionError when the session was loaded before
        another write to it, PayloadError for an event too large or not JSON; in each case
        the event is not stored and ``session`` and ``event`` are left as they were.
        """
        if event.partial:
            return event
        stream = session_stream(session.app_name, session.user_id, session.id)
        delta = event.actions.state_delta if event.actions else {}
        kept = {k: v for k, v in delta.items() if not k.startswith(State.TEMP_PREFIX)}
        stored = event
        if len(kept) != len(delta):
            actions = event.actions.model_copy(update={"state_delta": kept})
            stored = event.model_copy(update={"actions": actions})
        payload = stored.model_dump(mode="json", exclude_none=True)
        record = await self._record(stream)
        if not record.exists:
            raise SessionNotFoundError(f"Session {session.id} not found.")
        await self._share(stream, record.app_name, record.user_id, record.shared)
        if record.events and record.events[-1].event_id == event.id:
            last = await self._load(stream, record, [len(record.events) - 1])
            if last is not None and last[0] == stored:
                return event  # a re-delivery: stored once, applied once
        _check_fresh(session, record, stream)
        try:
            done = await self._append_unchanged(stream, RawEvent(ADK_EVENT, payload), record)
        except _Changed as changed:
            if not changed.record.exists:
                raise SessionNotFoundError(f"Session {session.id} not found.") from None
            raise _stale(session, stream) from None
        except PayloadError as exc:
            raise PayloadError(
                f"session {session.id!r}: event {event.id!r} cannot be stored: {exc}"
            ) from exc
        # Committed: the session object follows at once, the shared state after it (a failure
        # there leaves the record pending; the session's next append applies it).
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        self._commit_event_to_session(session, event)
        session.last_update_time = event.timestamp
        session._storage_update_marker = _marker(done.cursor)
        app, user, _ = split_delta(payload.get("actions", {}).get("state_delta", {}))
        await self._share(
            stream, session.app_name, session.user_id, shared_of(done.cursor, app, user)
        )
        return event


def _adk_version() -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in metadata.version("google-adk").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return (0,)


_FILTERS_EVERY_EVENT = _adk_version() >= (2, 15)
"""ADK 2.15 changed ``get_session``'s selection: ``after_timestamp`` keeps every event at or
after it, before ``num_recent_events`` keeps the newest; before, the newest were taken first,
then those from the last one earlier than the timestamp on. The two differ only for events
whose timestamps are out of order; the service follows the installed ADK's in-memory one."""


def _wanted(index: Sequence[Indexed], config: GetSessionConfig | None) -> list[int]:
    """The indices of the events ``config`` selects, ascending: ADK's selection, less the
    results of function calls it cut off. A selection that is a suffix stays one: it starts
    past any result whose call it cut (so a trimmed session never holds a tool's result
    without its call); any other selection leaves out just those results."""
    if config is not None and _FILTERS_EVERY_EVENT:
        selected = list(range(len(index)))
        if config.after_timestamp is not None:
            selected = [at for at in selected if index[at].timestamp >= config.after_timestamp]
        if config.num_recent_events is not None:
            recent = config.num_recent_events
            selected = selected[-recent:] if recent else []
        start = selected[0] if selected else len(index)
        if selected != list(range(start, len(index))):
            kept = set(selected)
            return [
                at
                for at in selected
                if index[at].answers_from in kept or index[at].answers_from < 0
            ]
    else:
        start = 0
        if config is not None and config.num_recent_events is not None:
            start = max(0, len(index) - config.num_recent_events)
        if config is not None and config.after_timestamp is not None:
            at = len(index)
            while at > start and index[at - 1].timestamp >= config.after_timestamp:
                at -= 1
            start = at
    while start:  # each pass only looks at the events it returns
        cut = [at for at in range(start, len(index)) if 0 <= index[at].answers_from < start]
        if not cut:
            break
        start = cut[-1] + 1
    return list(range(start, len(index)))


def _check_fresh(session: Session, record: SessionRecord, stream: str) -> None:
    """Raise StaleSessionError when ``session`` was loaded before the stored head: by its
    marker, or for a session without one, ADK's rule (newer storage time and another last
    event)."""
    marker = session._storage_update_marker
    if isinstance(marker, str) and marker.startswith(_MARKER):
        if marker != _marker(record.head or ""):
            raise _stale(session, stream)
        return
    if record.last_update_time > session.last_update_time:
        stored_last = record.events[-1].event_id if record.events else None
        held_last = session.events[-1].id if session.events else None
        if stored_last != held_last:
            raise _stale(session, stream)


def _decode(stored: StoredEvent) -> Event:
    try:
        return Event.model_validate_json(stored.data)
    except ValidationError as exc:
        first = str(exc).splitlines()[0]
        raise CorruptEventError(
            f"stream {stored.stream!r} position {stored.position}: the stored ADK event does "
            f"not validate as google.adk's Event ({first}); was it written by a newer ADK?",
            stream=stored.stream,
            position=stored.position,
        ) from exc
