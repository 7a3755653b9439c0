"""Typed events and the frozen envelope they are stored in.

An :class:`Event` is a frozen pydantic model with a stable type name given at class
definition (``class UserPrompt(Event, type="user-prompt")``). The name, not the Python
class, is what the journal stores, so classes can move between modules freely.

A :class:`StoredEvent` is what the journal hands back: namespace, stream, positions,
the type name, the payload as the exact JSON bytes that were written, and :class:`EventMeta`.
It never needs the Event class: an unknown type is still readable as raw JSON.
"""

from __future__ import annotations

import builtins
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import add
from typing import Any, ClassVar, Generic, NamedTuple, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from . import canonical
from .errors import CorruptEventError, EventDefinitionError, UnknownEventTypeError

__all__ = [
    "CLIENT_TYPES",
    "RUNTIME_TYPE_PREFIXES",
    "TYPE_NAME",
    "Envelope",
    "Event",
    "EventMeta",
    "NewEvent",
    "RawEvent",
    "StoredEvent",
    "event_class",
    "is_runtime_type",
    "registered_types",
    "runtime_only_types",
]

E = TypeVar("E", bound="Event")

TYPE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,199}$")
_REGISTRY: dict[str, type[Event]] = {}


class Event(BaseModel):
    """Base of every journal event: a frozen pydantic model with a stable type name.

    Unknown fields are ignored on decode, so a stored payload with a field removed from
    the schema since still folds. Subclasses without ``type=`` are abstract bases.
    ``runtime_only=True`` declares an event only the agent runtime writes (a model answer,
    a tool's record): surfaces taking appends from clients refuse it (inherited when not given).
    """

    model_config = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="constants")

    event_type: ClassVar[str] = ""
    runtime_only: ClassVar[bool] = False

    def __init_subclass__(
        cls, type: str | None = None, runtime_only: bool | None = None, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if runtime_only is not None:
            if not isinstance(runtime_only, bool):
                raise EventDefinitionError(
                    f"{cls.__qualname__}: runtime_only must be True or False, got {runtime_only!r}"
                )
            cls.runtime_only = runtime_only
        if type is None:
            cls.event_type = ""
            return
        if not isinstance(type, str) or not TYPE_NAME.fullmatch(type):
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
        return canonical.encode_checked(
            self.model_dump(mode="json"), where=f"{self.event_type or type(self).__name__} payload"
        )


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


def runtime_only_types() -> frozenset[str]:
    """The registered type names declared ``runtime_only`` (see :class:`Event`)."""
    return frozenset(name for name, cls in _REGISTRY.items() if cls.runtime_only)


RUNTIME_TYPE_PREFIXES = (
    "contextfold.agent/",  # the agent runtime
    "contextfold.checkpoint/",  # fold checkpoints
    "contextfold.calls/",  # a framework's model calls, recorded by its integration
    "contextfold.langgraph/",  # JournalSaver
    "openai-agents/",  # JournalSession, JournalModel
    "pydantic-ai/",  # JournalHistory, RecordingModel
    "adk/",  # JournalSessionService
)
"""Type name prefixes of the records only the runtime and its integrations write. Decided by
the name, so a process that never imported an integration still knows its records."""

CLIENT_TYPES = frozenset({"contextfold.agent/context-added"})
"""The types under :data:`RUNTIME_TYPE_PREFIXES` that clients may append too: context items
(a server checks each one's role and actor)."""


def is_runtime_type(type_name: str) -> bool:
    """Whether only the runtime or an integration writes events of ``type_name``: a name under
    :data:`RUNTIME_TYPE_PREFIXES` (bar :data:`CLIENT_TYPES`), whatever this process imported,
    or a registered class declared ``runtime_only`` (see :class:`Event`). The prefixes match
    whatever the case, so ``Contextfold.agent/...`` cannot pass for a client's own type."""
    if type_name.lower().startswith(RUNTIME_TYPE_PREFIXES):
        return type_name not in CLIENT_TYPES
    return type_name in runtime_only_types()


class EventMeta(NamedTuple):
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


class NewEvent(NamedTuple):
    """An event ready to append: its type name, payload JSON bytes and metadata."""

    type: str
    data: bytes
    meta: EventMeta


_SEPARATOR = "\x1f"  # between a stored event's channels: channel names hold no control character


def _split(channels: str) -> tuple[str, ...]:
    """A stored event's channels (joined by \\x1f) as a tuple."""
    return tuple(channels.split(_SEPARATOR)) if channels else ()


class StoredEvent(NamedTuple):
    """One event as the journal stored it: immutable; ``data`` are the exact JSON bytes written.

    Its fields are a store's columns, in their order. :attr:`meta` gathers the metadata
    ones into an :class:`EventMeta` and :attr:`payload` decodes ``data``, when asked for: a
    read of 100,000 events makes 100,000 records and nothing more. Equal and hashed by its
    fields; never equal to a plain tuple.
    """

    namespace: str
    stream: str
    global_position: int
    """Position in the whole journal; only grows, never reused (also after a delete)."""
    position: int
    """1-based position in the stream; consecutive within one append."""
    type: str
    """The event's type name."""
    data: bytes
    """The payload: the exact JSON bytes written."""
    # The metadata, field by field as EventMeta has it (see meta).
    event_id: str
    time: str
    run_id: str | None
    actor: str | None
    idempotency_key: str | None
    channels: str
    """The channels joined by ``\\x1f`` ("" for none), as stored; ``meta.channels`` is the tuple."""

    @classmethod
    def appended(
        cls, namespace: str, stream: str, global_position: int, position: int, new: NewEvent
    ) -> StoredEvent:
        """``new`` as a store keeps it, at these positions."""
        meta = new.meta
        return cls(
            namespace,
            stream,
            global_position,
            position,
            new.type,
            new.data,
            meta.event_id,
            meta.time,
            meta.run_id,
            meta.actor,
            meta.idempotency_key,
            _SEPARATOR.join(meta.channels),
        )

    @classmethod
    def from_row(cls, namespace: str, stream: str, row: Sequence[Any]) -> StoredEvent:
        """From a store row, its fields after ``stream`` in their order; channels joined by
        \\x1f, or as a list or tuple."""
        channels = row[9]
        if type(channels) is not str:
            channels = _SEPARATOR.join(channels)
        # cls._make(fields) without the Python call around it: a PostgreSQL read makes one a row.
        return tuple.__new__(cls, (namespace, stream, *row[:9], channels))

    @classmethod
    def from_rows(
        cls, namespace: str, stream: str, rows: Iterable[Sequence[Any]]
    ) -> tuple[StoredEvent, ...]:
        """:meth:`from_row` of each of ``rows`` whose channels are joined by \\x1f (as a SQL
        store keeps them), without a Python call per row: a cold read makes 100,000."""
        # cls._make(fields) without its length check: every row holds every field.
        return tuple(map(tuple.__new__, repeat(cls), map(add, repeat((namespace, stream)), rows)))

    @property
    def meta(self) -> EventMeta:
        """The metadata fields as an :class:`EventMeta` (made on each call)."""
        return EventMeta(
            self.event_id,
            self.time,
            self.run_id,
            self.actor,
            self.idempotency_key,
            _split(self.channels),
        )

    @property
    def cursor(self) -> str:
        """The cursor to read after this event (opaque; stable across versions)."""
        return str(self.global_position)

    @property
    def payload(self) -> Any:
        """The payload decoded from JSON (a fresh value each time). Raises CorruptEventError
        naming the stream and position when the stored bytes are not JSON."""
        try:
            return canonical.loads(self.data)
        except ValueError as exc:
            raise CorruptEventError(
                f"stream {self.stream!r} position {self.position} (type {self.type!r}): "
                f"stored payload is not valid JSON ({exc}); the row is corrupt",
                stream=self.stream,
                position=self.position,
            ) from exc

    def decode(self, cls: builtins.type[E] | None = None) -> E | Event:
        """The typed event, with ``cls`` or the registered class of ``type``.

        Raises UnknownEventTypeError, CorruptEventError, or pydantic's ValidationError.
        """
        target: builtins.type[Event] = cls if cls is not None else event_class(self.type)
        try:
            return target.model_validate_json(self.data)
        except ValidationError:
            self.payload  # noqa: B018 - raises CorruptEventError first when it is not JSON
            raise

    def __repr__(self) -> str:
        return (
            f"StoredEvent(stream={self.stream!r}, position={self.position}, "
            f"type={self.type!r}, data={self.data[:80]!r})"
        )

    # A record, not a sequence: a plain tuple of the same values is another thing.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, StoredEvent) and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return tuple.__hash__(self)


class Envelope(NamedTuple, Generic[E]):
    """What a fold handler gets: the decoded payload with its stored coordinates and meta.

    Immutable, equal and hashed by its fields; never equal to a plain tuple.
    """

    payload: E
    meta: EventMeta
    stream: str
    position: int
    """Position in the stream: the item offset ``@N`` the context model renders."""
    global_position: int
    type: str
    """The event's type name."""

    @classmethod
    def of(cls, stored: StoredEvent, payload: E) -> Envelope[E]:
        """``payload`` with the coordinates and meta of ``stored``."""
        return cls(
            payload,
            stored.meta,
            stored.stream,
            stored.position,
            stored.global_position,
            stored.type,
        )

    @property
    def cursor(self) -> str:
        return str(self.global_position)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Envelope) and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return tuple.__hash__(self)
