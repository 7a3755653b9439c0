"""The transcript store interface: session, message and part rows of one namespace.

:class:`TranscriptStore` checks every argument and builds pages and cleanups itself, then
calls a handful of storage hooks (the underscored abstract methods) that each backend
implements; so every backend refuses bad input with the same error and closes rows by the
same rule. Names follow the journal's rules (:mod:`contextfold.store.base`): a session name
is checked like a stream name, a namespace like the journal's namespace.

Rows are upserted: writing a message or part with the session and id of an existing row
overwrites it, but the row keeps its place in the order (its first write decides it).
Messages are paged in that order with opaque cursors over the full history of a session;
parts of a message come in the order they were created.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ...errors import InvalidCursorError, InvalidInputError, InvalidStreamNameError, StoreError
from ...journal.encode import check_stream
from ..parts import PART_TYPES, Message, Part, close_message, close_part, decode_part, is_unfinished

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "CleanupResult",
    "CloseRows",
    "MessagePage",
    "SessionInfo",
    "TranscriptStore",
    "check_confirmed",
    "check_limit",
    "check_now",
    "check_row_id",
    "check_rows",
    "check_session",
    "close_rows",
    "decode_message_row",
    "decode_part_row",
    "format_cursor",
    "parse_cursor",
]

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000


@dataclass(frozen=True, slots=True)
class MessagePage:
    """Messages of a session in order, and where the next page starts.

    ``cursor`` is what to pass as ``after`` to continue (the given ``after`` when the page
    is empty, None for an empty session read from its start); ``more`` is true while
    messages after this page exist.
    """

    messages: tuple[Message, ...]
    cursor: str | None
    more: bool


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session of the namespace: when its first message was created, when it last changed."""

    id: str
    created: str
    updated: str


@dataclass(frozen=True, slots=True)
class CleanupResult:
    """The rows cleanup closed (each as written); empty when nothing was unfinished."""

    messages: tuple[Message, ...] = ()
    parts: tuple[Part, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.messages or self.parts)


CloseRows = Callable[[Sequence[Message], Sequence[Part]], CleanupResult]
"""What a backend's cleanup hook applies to the unfinished rows it read in its transaction."""


class TranscriptStore(abc.ABC):
    """Message and part rows of one namespace (tenant) in a database.

    Use as an async context manager, or call :meth:`open` and :meth:`close`; the first call
    opens the store when :meth:`open` was not called. A store never shows rows of another
    namespace. A closed store raises StoreUnavailableError.

    Backends implement :meth:`with_namespace` and the ``_``-prefixed hooks; arguments
    reaching a hook are already checked. ``contextfold.transcript.store.contract`` pins
    what they must do.
    """

    namespace: str = "default"
    url: str = ""

    async def open(self) -> None:  # noqa: B027 - optional hook
        """Create the tables and connect; called before first use."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release the connection; the store is unusable afterwards."""

    @abc.abstractmethod
    def with_namespace(self, namespace: str) -> TranscriptStore:
        """The same database, scoped to another namespace; it shares the connection."""

    async def __aenter__(self) -> TranscriptStore:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- writing ------------------------------------------------------------------------

    async def write(self, *, messages: Sequence[Message] = (), parts: Sequence[Part] = ()) -> None:
        """Upsert rows atomically, all or none (messages first, then parts, each in order).

        Raises InvalidInputError, writing nothing, when any row is not a Message or Part
        of a valid session.
        """
        messages, parts = tuple(messages), tuple(parts)
        check_rows(messages, parts)
        if messages or parts:
            await self._write_rows(messages, parts)

    async def write_message(self, message: Message) -> None:
        """Upsert one message row (it overwrites the row with its session and id)."""
        await self.write(messages=(message,))

    async def write_part(self, part: Part) -> None:
        """Upsert one part row (it overwrites the row with its session and id)."""
        await self.write(parts=(part,))

    async def cleanup_unfinished(
        self, session: str, confirmed: Mapping[str, str] | None = None, *, now: str
    ) -> CleanupResult:
        """Close every unfinished row of ``session`` in one transaction (see :func:`close_rows`).

        ``confirmed`` maps a text or reasoning part id to the text a live writer had joined
        from its deltas; after a crash nobody has it, and parts close with their stored text.
        ``now`` is the closing time, given by the caller (the store reads no clock). Raises
        InvalidInputError, closing nothing, for a bad session, ``confirmed`` or ``now``.
        """
        check_session(session)
        texts = check_confirmed(confirmed)
        at = check_now(now)
        return await self._close_unfinished(session, lambda m, p: close_rows(m, p, texts, at))

    # -- reading ------------------------------------------------------------------------

    async def get_message(self, session: str, message_id: str) -> Message | None:
        """The message row, or None."""
        check_session(session)
        return await self._read_message(session, check_row_id(message_id, "message_id"))

    async def get_part(self, session: str, part_id: str) -> Part | None:
        """The part row, or None."""
        check_session(session)
        return await self._read_part(session, check_row_id(part_id, "part_id"))

    async def page_messages(
        self, session: str, *, after: str | None = None, limit: int = DEFAULT_PAGE_SIZE
    ) -> MessagePage:
        """Up to ``limit`` messages after the cursor ``after`` (from the start when None).

        Raises InvalidCursorError for a cursor no page returned, InvalidInputError for a
        limit outside 1..MAX_PAGE_SIZE.
        """
        check_session(session)
        check_limit(limit)
        start = parse_cursor(after)
        rows = tuple(await self._read_page(session, start, limit + 1))
        more = len(rows) > limit
        rows = rows[:limit]
        cursor = format_cursor(rows[-1][0]) if rows else after
        return MessagePage(tuple(m for _, m in rows), cursor, more)

    async def parts_of(
        self, session: str, message_ids: Sequence[str]
    ) -> Mapping[str, tuple[Part, ...]]:
        """The parts of each given message in creation order (an empty tuple for none)."""
        check_session(session)
        if isinstance(message_ids, str):
            raise InvalidInputError(
                f"message_ids must be a sequence of message ids, not the str {message_ids!r}"
            )
        ids = tuple(
            dict.fromkeys(check_row_id(i, f"message_ids[{n}]") for n, i in enumerate(message_ids))
        )
        found = await self._read_parts(session, ids) if ids else {}
        return {i: tuple(found.get(i, ())) for i in ids}

    async def unfinished(self, session: str) -> tuple[tuple[Message, ...], tuple[Part, ...]]:
        """The unfinished messages and parts of ``session``, in order."""
        check_session(session)
        return await self._read_unfinished(session)

    async def sessions(self, *, limit: int | None = None) -> tuple[SessionInfo, ...]:
        """Sessions of the namespace, oldest first (by creation time, then name)."""
        if limit is not None:
            check_limit(limit)
        return tuple(await self._read_sessions(limit))

    # -- what a backend implements ---------------------------------------------------------

    @abc.abstractmethod
    async def _write_rows(self, messages: tuple[Message, ...], parts: tuple[Part, ...]) -> None:
        """Upsert the rows (at least one) in one transaction. A new row takes the next place
        in the order; an existing one keeps its place (a part may move to another message)."""

    @abc.abstractmethod
    async def _close_unfinished(self, session: str, close: CloseRows) -> CleanupResult:
        """In one transaction: read the unfinished rows of ``session`` in order, apply
        ``close``, upsert the rows it returns, and return its result."""

    @abc.abstractmethod
    async def _read_message(self, session: str, message_id: str) -> Message | None:
        """The message row, or None."""

    @abc.abstractmethod
    async def _read_part(self, session: str, part_id: str) -> Part | None:
        """The part row, or None."""

    @abc.abstractmethod
    async def _read_page(
        self, session: str, after: int, limit: int
    ) -> Sequence[tuple[int, Message]]:
        """Up to ``limit`` messages whose place in the order is after ``after``, in order,
        each with its place (a positive int that only grows)."""

    @abc.abstractmethod
    async def _read_parts(
        self, session: str, message_ids: tuple[str, ...]
    ) -> Mapping[str, Sequence[Part]]:
        """The parts of the given messages (unique, at least one) in creation order; a
        message without parts may be left out."""

    @abc.abstractmethod
    async def _read_unfinished(self, session: str) -> tuple[tuple[Message, ...], tuple[Part, ...]]:
        """The unfinished messages and parts of ``session``, in order."""

    @abc.abstractmethod
    async def _read_sessions(self, limit: int | None) -> Sequence[SessionInfo]:
        """Up to ``limit`` (all when None) sessions, ordered by creation time, then id."""


# -- shared checks and helpers --------------------------------------------------------------


def close_rows(
    messages: Sequence[Message], parts: Sequence[Part], confirmed: Mapping[str, str], now: str
) -> CleanupResult:
    """The closed versions of the unfinished rows given (finished ones are left out); pure."""
    return CleanupResult(
        messages=tuple(close_message(m, now=now) for m in messages if is_unfinished(m)),
        parts=tuple(
            close_part(p, now=now, confirmed=confirmed.get(p.id)) for p in parts if is_unfinished(p)
        ),
    )


def check_session(session: object) -> str:
    """Return ``session`` or raise InvalidInputError saying what is wrong with it.

    A session name follows the journal's stream-name rules (one length limit, one set of
    refused characters): a session is usually the name of the stream it is recorded on.
    """
    try:
        return check_stream(session)
    except InvalidStreamNameError as exc:
        raise InvalidInputError(
            f"invalid session name: {exc} (session names follow the journal's stream-name rules)"
        ) from exc


def check_row_id(row_id: object, field: str) -> str:
    """Return ``row_id`` or raise InvalidInputError naming ``field``."""
    if not isinstance(row_id, str):
        raise InvalidInputError(f"{field} must be a str, got {type(row_id).__name__}")
    return row_id


def check_now(now: object) -> str:
    """Return ``now`` (a closing time) or raise InvalidInputError."""
    if not isinstance(now, str) or not now:
        raise InvalidInputError(
            f"now must be the closing time as a non-empty str (ISO-8601), got {now!r}"
        )
    return now


def check_confirmed(confirmed: object) -> Mapping[str, str]:
    """Return ``confirmed`` as a plain dict (empty for None) or raise InvalidInputError."""
    if confirmed is None:
        return {}
    if not isinstance(confirmed, Mapping):
        raise InvalidInputError(
            f"confirmed must map part ids to text, got {type(confirmed).__name__}"
        )
    for part_id, text in confirmed.items():
        if not isinstance(part_id, str) or not isinstance(text, str):
            raise InvalidInputError(
                f"confirmed must map str part ids to str text, got {part_id!r}: {text!r}"
            )
    return dict(confirmed)


def check_limit(limit: object) -> int:
    """Return ``limit`` or raise InvalidInputError."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise InvalidInputError(f"limit must be an int from 1 to {MAX_PAGE_SIZE}, got {limit!r}")
    return limit


def format_cursor(seq: int) -> str:
    """The cursor after the message with this place in the order (opaque to callers)."""
    return f"m{seq}"


def parse_cursor(cursor: object) -> int:
    """The place a cursor names; 0 for None. Raises InvalidCursorError for anything else."""
    if cursor is None:
        return 0
    if (
        isinstance(cursor, str)
        and cursor.startswith("m")
        and cursor[1:].isascii()
        and cursor[1:].isdigit()
        and len(cursor) <= 20
    ):
        return int(cursor[1:])
    raise InvalidCursorError(
        f"cursor {cursor!r} was not returned by page_messages: pass None to read from the "
        "start, or the cursor of the previous page"
    )


def check_rows(messages: Sequence[Any], parts: Sequence[Any]) -> None:
    """Raise InvalidInputError unless every row is a Message or Part of a valid session."""
    for index, message in enumerate(messages):
        if not isinstance(message, Message):
            raise InvalidInputError(
                f"messages[{index}] is a {type(message).__name__}, not a Message"
            )
        _check_row_session(message.session, f"messages[{index}]")
    for index, part in enumerate(parts):
        if not isinstance(part, PART_TYPES):
            raise InvalidInputError(f"parts[{index}] is a {type(part).__name__}, not a Part")
        _check_row_session(part.session, f"parts[{index}]")


def _check_row_session(session: str, where: str) -> None:
    try:
        check_session(session)
    except InvalidInputError as exc:
        raise InvalidInputError(f"{where}.session: {exc}; nothing was written") from exc


def decode_message_row(data: str | bytes | Mapping[str, Any], session: str) -> Message:
    """A stored message row; StoreError naming the session when it no longer decodes."""
    try:
        if isinstance(data, Mapping):
            return Message.model_validate(data)
        return Message.model_validate_json(data)
    except ValidationError as exc:
        raise _undecodable("message", session, exc) from exc


def decode_part_row(data: str | bytes | Mapping[str, Any], session: str) -> Part:
    """A stored part row; StoreError naming the session when it no longer decodes."""
    try:
        return decode_part(data)
    except ValidationError as exc:
        raise _undecodable("part", session, exc) from exc


def _undecodable(what: str, session: str, exc: ValidationError) -> StoreError:
    first = exc.errors()[0]
    where = ".".join(str(x) for x in first["loc"])
    return StoreError(
        f"a {what} row of session {session!r} no longer decodes ({where}: {first['msg']}); "
        "rewrite it with the current schema or delete it"
    )
