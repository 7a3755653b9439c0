"""The transcript store interface: session, message and part rows of one namespace.

Backends (:mod:`.sqlite`, :mod:`.postgres`) implement a handful of methods; argument
checks, cursors and the crash-cleanup rule live here so every backend behaves alike.

Rows are upserted: writing a message or part with the session and id of an existing row
overwrites it, but the row keeps its place in the order (its first write decides it).
Messages are paged in that order, ``(created order, id)``, with opaque cursors over the
full history of a session; parts of a message come in the order they were created.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ..errors import InvalidCursorError, InvalidInputError, StoreError
from .parts import (
    PART_TYPES,
    Message,
    Part,
    close_message,
    close_part,
    decode_part,
    is_unfinished,
)

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "MAX_PAGE_SIZE",
    "CleanupResult",
    "MessagePage",
    "SessionInfo",
    "TranscriptStore",
    "check_limit",
    "check_rows",
    "check_session",
    "close_rows",
    "decode_message_row",
    "decode_part_row",
    "format_cursor",
    "open_transcript_store",
    "parse_cursor",
]

DEFAULT_PAGE_SIZE = 100
MAX_PAGE_SIZE = 1000
_MAX_NAME = 512


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


class TranscriptStore(abc.ABC):
    """Message and part rows of one namespace (tenant) in a database.

    Use as an async context manager, or call :meth:`open` and :meth:`close`. A store never
    shows rows of another namespace.
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

    @abc.abstractmethod
    async def write(self, *, messages: Sequence[Message] = (), parts: Sequence[Part] = ()) -> None:
        """Upsert rows atomically, all or none (messages first, then parts, each in order)."""

    async def write_message(self, message: Message) -> None:
        """Upsert one message row (it overwrites the row with its session and id)."""
        await self.write(messages=(message,))

    async def write_part(self, part: Part) -> None:
        """Upsert one part row (it overwrites the row with its session and id)."""
        await self.write(parts=(part,))

    @abc.abstractmethod
    async def cleanup_unfinished(
        self, session: str, confirmed: Mapping[str, str] | None = None, *, now: str | None = None
    ) -> CleanupResult:
        """Close every unfinished row of ``session`` in one transaction (see :func:`close_rows`).

        ``confirmed`` maps a text or reasoning part id to the text a live writer had joined
        from its deltas; after a crash nobody has it, and parts close with their stored text.
        ``now`` (ISO-8601) is the closing time; the current UTC time when None.
        """

    # -- reading ------------------------------------------------------------------------

    @abc.abstractmethod
    async def get_message(self, session: str, message_id: str) -> Message | None:
        """The message row, or None."""

    @abc.abstractmethod
    async def get_part(self, session: str, part_id: str) -> Part | None:
        """The part row, or None."""

    @abc.abstractmethod
    async def page_messages(
        self, session: str, *, after: str | None = None, limit: int = DEFAULT_PAGE_SIZE
    ) -> MessagePage:
        """Up to ``limit`` messages after the cursor ``after`` (from the start when None).

        Raises InvalidCursorError for a cursor no page returned, InvalidInputError for a
        limit outside 1..MAX_PAGE_SIZE.
        """

    @abc.abstractmethod
    async def parts_of(
        self, session: str, message_ids: Sequence[str]
    ) -> Mapping[str, tuple[Part, ...]]:
        """The parts of each given message in creation order (an empty tuple for none)."""

    @abc.abstractmethod
    async def unfinished(self, session: str) -> tuple[tuple[Message, ...], tuple[Part, ...]]:
        """The unfinished messages and parts of ``session``, in order."""

    @abc.abstractmethod
    async def sessions(self, *, limit: int | None = None) -> tuple[SessionInfo, ...]:
        """Sessions of the namespace, oldest first."""


# -- shared by the backends ------------------------------------------------------------


def close_rows(
    messages: Sequence[Message],
    parts: Sequence[Part],
    confirmed: Mapping[str, str] | None,
    now: str | None,
) -> CleanupResult:
    """The closed versions of the unfinished rows given (finished ones are left out)."""
    at = now if now is not None else datetime.now(UTC).isoformat()
    confirmed = confirmed or {}
    return CleanupResult(
        messages=tuple(close_message(m, now=at) for m in messages if is_unfinished(m)),
        parts=tuple(
            close_part(p, now=at, confirmed=confirmed.get(p.id)) for p in parts if is_unfinished(p)
        ),
    )


def check_session(session: object) -> str:
    """Return ``session`` or raise InvalidInputError saying what is wrong with it."""
    if not isinstance(session, str) or not session or len(session) > _MAX_NAME:
        raise InvalidInputError(
            f"session must be a non-empty str of at most {_MAX_NAME} characters, got {session!r}"
        )
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in session):
        raise InvalidInputError(f"session {session!r} contains a control character")
    return session


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
        check_session(message.session)
    for index, part in enumerate(parts):
        if not isinstance(part, PART_TYPES):
            raise InvalidInputError(f"parts[{index}] is a {type(part).__name__}, not a Part")
        check_session(part.session)


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


def open_transcript_store(
    url: str, *, namespace: str = "default", **options: Any
) -> TranscriptStore:
    """A transcript store for ``sqlite:///path.db`` (``sqlite:///:memory:``) or
    ``postgresql://…``; it connects on :meth:`~TranscriptStore.open`. Other options go to
    the backend. Raises InvalidInputError for another URL."""
    if not isinstance(url, str):
        raise InvalidInputError(f"transcript URL must be a str, got {type(url).__name__}")
    if url.startswith("sqlite:///") and len(url) > len("sqlite:///"):
        from .sqlite import SQLiteTranscriptStore

        return SQLiteTranscriptStore(url[len("sqlite:///") :], namespace=namespace, **options)
    if url.startswith(("postgresql://", "postgres://")):
        try:
            from .postgres import PostgresTranscriptStore
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise InvalidInputError(
                "PostgreSQL support needs the postgres extra: pip install 'contextfold[postgres]'"
            ) from exc
        return PostgresTranscriptStore(url, namespace=namespace, **options)
    raise InvalidInputError(
        f"unknown transcript URL {url!r}: use sqlite:///path.db or postgresql://…"
    )
