"""Typed events and the frozen envelope they are stored in.

An :class:`Event` is a frozen pydantic model with a stable type name given at class
definition (``class UserPrompt(Event, type="user-prompt")``). The name, not the Python
class, is what the journal stores, so classes can move between modules freely.

A :class:`StoredEvent` is what the journal hands back: namespace, stream, positions,
the type name, the payload as the exact JSON bytes that were written, and :class:`EventMeta`.
It never needs the Event class: an unknown type is still readable as raw JSON.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from . import canonical
from .errors import CorruptEventError, EventDefinitionError, UnknownEventTypeError

__all__ = [
    "Envelope",
    "Event",
    "EventMeta",
    "NewEvent",
    "RawEvent",
    "StoredEvent",
    "event_class",
    "registered_types",
]

E = TypeVar("E", bound="Event")

_TYPE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")
_REGISTRY: dict[str, type[Event]] = {}


class Event(BaseModel):
    """Base of every journal event: a frozen pydantic model with a stable type name.

    Unknown fields are ignored on decode, so a stored payload with a field removed from
    the schema since still folds. Subclasses without ``type=`` are abstract bases.
    """

    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")

    event_type: ClassVar[str] = ""

    def __init_subclass__(cls, type: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if type is None:
            cls.event_type = ""
            return
        if not isinstance(type, str) or not _TYPE_NAME.match(type):
            raise EventDefinitionError(
                f"{cls.__qualname__}: event type {type!r} must be 1-200 characters of letters, "
                "digits and . _ : / @ + -, starting with a letter or digit"
            )
        existing = _REGISTRY.get(type)
        if existing is not None and not _same_definition(existing, cls):
            raise EventDefinitionError(
                f"event type {type!r} is already defined by {existing.__module__}."
                f"{existing.__qualname__}; {cls.__module__}.{cls.__qualname__} needs another name"
            )
        cls.event_type = type
        _REGISTRY[type] = cls

    def to_json(self) -> bytes:
        """The payload as stored: compact JSON of the model's JSON-mode dump.

        Raises ValueError naming the field when the dump is not finite, plain JSON.
        """
        value = self.model_dump(mode="json")
        canonical.check_json_value(value, where=f"{self.event_type or type(self).__name__} payload")
        return canonical.dumps(value)


def _same_definition(a: type[Event], b: type[Event]) -> bool:
    # Re-executing a module (reload, notebook cell) redefines the same class: allowed.
    return a.__module__ == b.__module__ and a.__qualname__ == b.__qualname__


def event_class(type_name: str) -> type[Event]:
    """The registered Event class for a type name, or UnknownEventTypeError."""
    try:
        return _REGISTRY[type_name]
    except KeyError:
        raise UnknownEventTypeError(
            f"no Event class is registered for type {type_name!r}: import the module that "
            "defines it, or read the event raw (StoredEvent.payload)"
        ) from None


def registered_types() -> Mapping[str, type[Event]]:
    """A read-only snapshot of the registry: type name -> Event class."""
    return dict(_REGISTRY)


@dataclass(frozen=True, slots=True)
class EventMeta:
    """Metadata recorded with every event. Time and ids are injected by the journal's edge."""

    event_id: str
    """Unique id of this event (generated at append unless given)."""
    time: str
    """ISO-8601 UTC time the event was appended (from the journal's injected clock)."""
    run_id: str | None = None
    """The run (agent invocation) that produced it, if any."""
    actor: str | None = None
    """Who supplied it (e.g. ``"user"``, ``"agent"``, ``"webhook"``), if known."""
    idempotency_key: str | None = None
    """The idempotency key of the append call that wrote it."""
    channels: tuple[str, ...] = ()
    """Channels it is delivered on; a fold checkpoint has none."""


@dataclass(frozen=True, slots=True)
class RawEvent:
    """An event given by type name and JSON payload, without an Event class."""

    type: str
    payload: Any


@dataclass(frozen=True, slots=True)
class NewEvent:
    """An event ready to append: its type name, payload JSON bytes and metadata."""

    type: str
    data: bytes
    meta: EventMeta


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event as the journal stored it. Frozen; ``data`` are the exact JSON bytes written."""

    namespace: str
    stream: str
    position: int
    """1-based position in the stream; consecutive within one append."""
    global_position: int
    """Position in the whole journal; only grows, never reused (also after a delete)."""
    type: str
    data: bytes
    meta: EventMeta
    _payload: list[Any] = field(default_factory=list, repr=False, compare=False)

    @property
    def cursor(self) -> str:
        """The cursor to read after this event (opaque; stable across versions)."""
        return str(self.global_position)

    @property
    def payload(self) -> Any:
        """The payload decoded from JSON (cached). Raises CorruptEventError naming the row."""
        if not self._payload:
            try:
                self._payload.append(canonical.loads(self.data))
            except ValueError as exc:
                raise CorruptEventError(
                    f"stream {self.stream!r} position {self.position} (type {self.type!r}): "
                    f"stored payload is not valid JSON ({exc}); the row is corrupt",
                    stream=self.stream,
                    position=self.position,
                ) from exc
        return self._payload[0]

    def decode(self, cls: type[E] | None = None) -> E | Event:
        """The typed event, with ``cls`` or the registered class of ``type``.

        Raises UnknownEventTypeError, CorruptEventError, or pydantic's ValidationError.
        """
        target: type[Event] = cls if cls is not None else event_class(self.type)
        try:
            return target.model_validate_json(self.data)
        except ValidationError:
            self.payload  # noqa: B018 - raises CorruptEventError first when it is not JSON
            raise


@dataclass(frozen=True, slots=True)
class Envelope(Generic[E]):
    """What a fold handler gets: the decoded payload with its stored coordinates and meta."""

    payload: E
    meta: EventMeta
    stream: str
    position: int
    """Position in the stream: the item offset ``@N`` the context model renders."""
    global_position: int
    type: str

    @property
    def cursor(self) -> str:
        return str(self.global_position)

    @classmethod
    def of(cls, stored: StoredEvent, payload: E) -> Envelope[E]:
        return cls(payload, stored.meta, stored.stream, stored.position, stored.global_position, stored.type)

    @classmethod
    def make(
        cls,
        payload: E,
        *,
        position: int,
        stream: str = "test",
        meta: EventMeta | None = None,
        global_position: int | None = None,
    ) -> Envelope[E]:
        """An envelope for tests and pure use of folds (``Fold.apply_all``)."""
        return cls(
            payload,
            meta or EventMeta(event_id=f"ev-{position}", time="2026-01-01T00:00:00+00:00"),
            stream,
            position,
            global_position if global_position is not None else position,
            type(payload).event_type,
        )
