"""Corrupt rows: finding stored events that no longer decode, and reading around them.

A row is corrupt when its payload is not JSON, or when the Event class registered for its
type no longer validates it (the class changed since the row was written). Tools that must
get through every row, such as the CLI's ``events`` and ``verify``, report each one with
its stream and position instead of stopping at it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from pydantic import ValidationError

from ..errors import CorruptEventError, UnknownEventTypeError
from ..events import Event, StoredEvent, event_class

__all__ = ["CorruptRow", "SkipCorrupt", "corrupt_row"]


@dataclass(frozen=True, slots=True)
class CorruptRow:
    """A stored event that does not decode: where it is and why."""

    stream: str
    position: int
    type: str
    reason: str

    def __str__(self) -> str:
        where = f"stream {self.stream!r} position {self.position} (type {self.type!r})"
        return f"{where}: {self.reason}"


def corrupt_row(event: StoredEvent) -> CorruptRow | None:
    """None when ``event`` decodes (JSON, and valid for its registered class if it has one;
    an unregistered type is raw JSON, not corrupt), else what is wrong with it."""
    try:
        event.payload  # noqa: B018 - raises CorruptEventError when the bytes are not JSON
    except CorruptEventError as exc:
        cause = exc.__cause__
        return CorruptRow(
            event.stream, event.position, event.type, f"the payload is not valid JSON ({cause})"
        )
    try:
        cls = event_class(event.type)
    except UnknownEventTypeError:
        return None
    try:
        cls.model_validate_json(event.data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the payload"
        return CorruptRow(
            event.stream,
            event.position,
            event.type,
            f"its class {cls.__qualname__} no longer decodes it ({exc.error_count()} "
            f"error(s); {where}: {first['msg']})",
        )
    return None


class _Reader(Protocol):
    def read_all(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[StoredEvent]: ...


class SkipCorrupt:
    """A reader over ``journal`` whose ``read_all`` leaves corrupt rows out and collects them.

    ``corrupt`` lists each row left out once, in the order first met, however often it was
    read. Code reading through it sees the journal as if those rows were not there.
    """

    def __init__(self, journal: _Reader) -> None:
        self._journal = journal
        self._corrupt: dict[tuple[str, int], CorruptRow] = {}

    @property
    def corrupt(self) -> tuple[CorruptRow, ...]:
        return tuple(self._corrupt.values())

    async def read_all(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[StoredEvent]:
        """The journal's ``read_all`` without the corrupt rows."""
        rows = self._journal.read_all(stream, after=after, types=types, page_size=page_size)
        try:
            async for event in rows:
                bad = corrupt_row(event)
                if bad is None:
                    yield event
                else:
                    self._corrupt.setdefault((bad.stream, bad.position), bad)
        finally:
            aclose = getattr(rows, "aclose", None)
            if aclose is not None:
                await aclose()
