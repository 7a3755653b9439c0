"""What the ADK session service stores: its event types, stream names and folds.

Private to :mod:`contextfold.integrations.adk`, which documents the scheme and re-exports
the public names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from google.adk.sessions.state import State
from pydantic import BaseModel, ConfigDict, Field
from pyrsistent import PVector, pvector

from ..errors import InvalidInputError, InvalidStreamNameError
from ..events import Envelope
from ..events import Event as JournalEvent
from ..folds.fold import Fold
from ..folds.freeze import FrozenDict, freeze
from ..journal.encode import check_stream, check_text
from ._stream_names import stream_part

__all__ = [
    "ADK_EVENT",
    "SESSION_FOLD",
    "SHARED_FOLD",
    "AdkEventHeader",
    "AdkSessionCreated",
    "AdkSessionDeleted",
    "AdkStateChanged",
    "Indexed",
    "SessionRecord",
    "Shared",
    "app_stream",
    "check_name",
    "session_stream",
    "sessions_prefix",
    "shared_of",
    "split_delta",
    "thaw",
    "user_stream",
]

ADK_EVENT = "adk/event"


# -- events -----------------------------------------------------------------------------------


class AdkSessionCreated(JournalEvent, type="adk/session-created", runtime_only=True):
    """A session began (again, after a deletion): who owns it and its initial state.

    ``state`` is the JSON form of what ``create_session`` got, ``temp:`` keys left out;
    its ``app:`` and ``user:`` keys go to the shared streams too.
    """

    app_name: str
    user_id: str
    session_id: str
    state: dict[str, Any] = Field(default_factory=dict)
    time: float


class _Header(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class _Actions(_Header):
    state_delta: dict[str, Any] = {}


class _Ref(_Header):
    id: str | None = None


class _Part(_Header):
    function_call: _Ref | None = None
    function_response: _Ref | None = None


class _Content(_Header):
    parts: tuple[_Part, ...] | None = None


class AdkEventHeader(JournalEvent, type=ADK_EVENT, runtime_only=True):
    """What the session fold reads of a stored ADK event; the payload is ADK's whole JSON
    (decode it with ``google.adk.events.Event.model_validate_json``)."""

    id: str
    timestamp: float
    actions: _Actions = _Actions()
    content: _Content | None = None

    def call_ids(self) -> tuple[list[str], list[str]]:
        """The ids of the function calls the event makes, and of those it answers."""
        calls: list[str] = []
        answers: list[str] = []
        for part in (self.content.parts if self.content else None) or ():
            if part.function_call is not None and part.function_call.id:
                calls.append(part.function_call.id)
            if part.function_response is not None and part.function_response.id:
                answers.append(part.function_response.id)
        return calls, answers


class AdkSessionDeleted(JournalEvent, type="adk/session-deleted", runtime_only=True):
    """The session was deleted: ADK no longer sees it; its events stay in the journal."""

    time: float


class AdkStateChanged(JournalEvent, type="adk/state-changed", runtime_only=True):
    """A delta to app or user state (keys without their prefix), and the session record it
    came from (``{session stream}@{cursor}``, also its idempotency key)."""

    delta: dict[str, Any]
    source: str


# -- folds ------------------------------------------------------------------------------------


class Indexed(NamedTuple):
    """One ADK event of a session: the cursor it is stored at, its timestamp and id, and the
    index of the oldest event whose function calls it answers (-1: it answers none)."""

    cursor: str
    timestamp: float
    event_id: str
    answers_from: int = -1


@dataclass(frozen=True, slots=True)
class Shared:
    """The shared deltas of the newest session record that carried any."""

    source: str  # cursor of that record
    app: Mapping[str, Any]
    user: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """The session fold's state: what ``get_session`` needs without reading every event.

    ``head``/``version`` are the cursor and stream position of the last event folded;
    ``base`` the cursor of the session's ``adk/session-created`` event; ``events`` the
    index of its ADK events, oldest first; ``open_calls`` the function calls not answered
    yet, by id, with the index of the event that made them.
    """

    exists: bool = False
    head: str | None = None
    version: int = 0
    app_name: str = ""
    user_id: str = ""
    session_id: str = ""
    base: str | None = None
    state: Mapping[str, Any] = field(default_factory=FrozenDict)
    last_update_time: float = 0.0
    events: PVector[Indexed] = field(default_factory=pvector)
    open_calls: Mapping[str, int] = field(default_factory=FrozenDict)
    shared: Shared | None = None


SESSION_FOLD: Fold[SessionRecord] = Fold("adk_session", initial=SessionRecord)
SHARED_FOLD: Fold[Mapping[str, Any]] = Fold("adk_shared_state", initial=FrozenDict)
"""The app or user state of an ``adk/app/…`` or ``adk/user/…`` stream, keys without prefix."""


def split_delta(delta: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """``(app, user, session)`` parts of a prefixed delta, prefixes removed; ``temp:`` dropped."""
    app: dict[str, Any] = {}
    user: dict[str, Any] = {}
    own: dict[str, Any] = {}
    for key, value in delta.items():
        if key.startswith(State.APP_PREFIX):
            app[key.removeprefix(State.APP_PREFIX)] = value
        elif key.startswith(State.USER_PREFIX):
            user[key.removeprefix(State.USER_PREFIX)] = value
        elif not key.startswith(State.TEMP_PREFIX):
            own[key] = value
    return app, user, own


def shared_of(cursor: str, app: dict[str, Any], user: dict[str, Any]) -> Shared | None:
    return Shared(cursor, freeze(app), freeze(user)) if app or user else None


@SESSION_FOLD.on(AdkSessionCreated)
def _created(record: SessionRecord, ev: Envelope[AdkSessionCreated]) -> SessionRecord:
    app, user, own = split_delta(ev.payload.state)
    return SessionRecord(
        exists=True,
        head=ev.cursor,
        version=ev.position,
        app_name=ev.payload.app_name,
        user_id=ev.payload.user_id,
        session_id=ev.payload.session_id,
        base=ev.cursor,
        state=freeze(own),
        last_update_time=ev.payload.time,
        shared=shared_of(ev.cursor, app, user),
    )


@SESSION_FOLD.on(AdkEventHeader)
def _appended(record: SessionRecord, ev: Envelope[AdkEventHeader]) -> SessionRecord:
    if not record.exists:  # only ever after a deletion raced an append: not the session's
        return replace(record, head=ev.cursor, version=ev.position)
    app, user, own = split_delta(ev.payload.actions.state_delta)
    calls, answers = ev.payload.call_ids()
    open_calls = record.open_calls
    answered = [open_calls[call] for call in answers if call in open_calls]
    if calls or answered:
        at = len(record.events)
        kept = {call: made for call, made in open_calls.items() if call not in answers}
        open_calls = FrozenDict({**kept, **dict.fromkeys(calls, at)})
    entry = Indexed(ev.cursor, ev.payload.timestamp, ev.payload.id, min(answered, default=-1))
    return replace(
        record,
        head=ev.cursor,
        version=ev.position,
        state=freeze({**record.state, **own}) if own else record.state,
        last_update_time=ev.payload.timestamp,
        events=record.events.append(entry),
        open_calls=open_calls,
        shared=shared_of(ev.cursor, app, user) or record.shared,
    )


@SESSION_FOLD.on(AdkSessionDeleted)
def _deleted(record: SessionRecord, ev: Envelope[AdkSessionDeleted]) -> SessionRecord:
    return SessionRecord(head=ev.cursor, version=ev.position)


@SHARED_FOLD.on(AdkStateChanged)
def _changed(state: Mapping[str, Any], ev: Envelope[AdkStateChanged]) -> Mapping[str, Any]:
    return freeze({**state, **ev.payload.delta})  # type: ignore[no-any-return]


# -- stream names -----------------------------------------------------------------------------


def check_name(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidInputError(f"{name} must be a str, got {type(value).__name__}")
    return check_text(name, value)


def _stream(kind: str, fields: Sequence[tuple[str, object]]) -> str:
    parts = [stream_part(check_name(name, value)) for name, value in fields]
    stream = "/".join(("adk", kind, *parts))
    try:
        return check_stream(stream)
    except InvalidStreamNameError as exc:
        names = ", ".join(name for name, _ in fields)
        raise InvalidStreamNameError(f"{names} make no usable stream name: {exc}") from exc


def session_stream(app_name: str, user_id: str, session_id: str) -> str:
    """The stream of one ADK session. Raises InvalidInputError naming the field at fault."""
    return _stream(
        "session", (("app_name", app_name), ("user_id", user_id), ("session_id", session_id))
    )


def sessions_prefix(app_name: str, user_id: str | None = None) -> str:
    """The prefix of the session streams of an app, or of one user of it."""
    fields: list[tuple[str, object]] = [("app_name", app_name)]
    if user_id is not None:
        fields.append(("user_id", user_id))
    return _stream("session", fields) + "/"


def app_stream(app_name: str) -> str:
    """The stream of an app's ``app:`` state."""
    return _stream("app", (("app_name", app_name),))


def user_stream(app_name: str, user_id: str) -> str:
    """The stream of a user's ``user:`` state within an app."""
    return _stream("user", (("app_name", app_name), ("user_id", user_id)))


# -- values handed out --------------------------------------------------------------------


def thaw(value: Any) -> Any:
    """A fresh mutable copy of frozen fold state (the caller may change what it gets)."""
    if isinstance(value, dict):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [thaw(item) for item in value]
    return value
