"""The turn envelope compiler: layers and the current event in, envelope text and manifest out.

`compile_turn` is a pure function. It does no I/O and reads no clock, environment
variable, random source or generated id, so the same inputs always give the same
bytes and the same manifest hash.

Standing layers (those frozen at session start) render as paired top-level tags;
the per-turn layers (channel-metadata, thread-checkpoint, history, ambient-context),
the current events, accepted steers and the delivery tag render inside one ``<turn>``
block. All content and attribute
values are escaped, so no content can open or close a boundary tag.
"""

from __future__ import annotations

import enum
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import orjson

__all__ = [
    "LAYER_ORDER",
    "CompiledTurn",
    "Layer",
    "Manifest",
    "ManifestEntry",
    "Steer",
    "SteerStatus",
    "TurnEvent",
    "TurnLedger",
    "accept_steer",
    "coalesce",
    "compile_turn",
]

Attributes = tuple[tuple[str, str], ...]

LAYER_ORDER: tuple[tuple[str, int], ...] = (
    ("workspace", 0),
    ("base", 0),
    ("system", 1),
    ("team-instructions", 2),
    ("core-memory", 3),
    ("huddle-instructions", 3),
    ("channel-metadata", 4),
    ("channel-canvas", 4),
    ("thread-checkpoint", 5),
    ("history", 6),
    ("ambient-context", 7),
)
"""Known layer names and their order number; tuple position breaks ties within an order."""

_EVENT_ORDER = 8
_STEER_ORDER = 9
_DELIVERY_ORDER = 10

_RANK = {name: rank for rank, (name, _) in enumerate(LAYER_ORDER)}
_ORDER = dict(LAYER_ORDER)
# Channel metadata is resolver-cached per turn, unlike the canvas frozen at session start.
_TURN_LAYERS = frozenset({"channel-metadata", "thread-checkpoint", "history", "ambient-context"})
_ATTRIBUTE_NAME = re.compile(r"[a-z][a-z0-9_-]*\Z")

_TEXT_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
_TEXT_ESCAPES = str.maketrans(_TEXT_ENTITIES)
# Attribute values also lose quotes and line breaks so an attribute stays one token on one line.
_ATTRIBUTE_ESCAPES = str.maketrans(
    {**_TEXT_ENTITIES, '"': "&quot;", "'": "&#39;", "\n": "&#10;", "\t": "&#9;"}
)


def _normalise(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _escape_text(text: str) -> str:
    return _normalise(text).translate(_TEXT_ESCAPES)


def _escape_attribute(value: str) -> str:
    return _normalise(value).translate(_ATTRIBUTE_ESCAPES)


def _check_attributes(attributes: Attributes, where: str) -> None:
    for key, _ in attributes:
        if not _ATTRIBUTE_NAME.match(key):
            raise ValueError(
                f"{where}: attribute name {key!r} is not allowed; "
                "use lowercase letters, digits, '-' or '_', starting with a letter"
            )


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class Layer:
    """One named context layer.

    Raises ValueError for a name not in `LAYER_ORDER` or a malformed attribute name.
    """

    name: str
    content: str
    source_event_id: str | None = None
    """The signed event this content came from; when set it is the layer's version."""
    attributes: Attributes = ()

    def __post_init__(self) -> None:
        if self.name not in _RANK:
            known = ", ".join(name for name, _ in LAYER_ORDER)
            raise ValueError(f"unknown layer name {self.name!r}; use one of: {known}")
        _check_attributes(self.attributes, f"layer {self.name!r}")

    @property
    def version(self) -> str:
        """``event:<id>`` when signed, else ``sha256:<hex>`` of attributes and normalised text."""
        if self.source_event_id is not None:
            return f"event:{self.source_event_id}"
        payload = [[list(pair) for pair in self.attributes], _normalise(self.content)]
        return _sha256(orjson.dumps(payload))


@dataclass(frozen=True, slots=True)
class TurnEvent:
    """A signed event that starts (or joins) a turn.

    Raises ValueError when `event_id` or `actor` is empty.
    """

    kind: str
    author: str
    actor: str
    event_id: str
    content: str
    thread_root: str | None = None

    def __post_init__(self) -> None:
        if not self.event_id or not self.actor:
            raise ValueError(f"event {self.event_id!r}: event_id and actor must be non-empty")

    @property
    def destination(self) -> str:
        """The thread root id, or the event's own id for a top-level event."""
        return self.thread_root if self.thread_root is not None else self.event_id


@dataclass(frozen=True, slots=True)
class Steer:
    """An update the adapter accepted as injected into the running turn."""

    event_id: str
    content: str


class SteerStatus(enum.Enum):
    """How the adapter answered a steer; only `INJECTED` joins the ledger."""

    INJECTED = "injected"
    FAILED = "failed"
    INDETERMINATE = "indeterminate"
    STARTED_NEW_TURN = "started-new-turn"
    """The adapter began a new turn; the settled turn's manifest must not change."""


@dataclass(frozen=True, slots=True)
class TurnLedger:
    """The events of one dispatched turn plus the steers accepted while it ran.

    Raises ValueError when `events` is empty or its events differ in actor or destination.
    """

    events: tuple[TurnEvent, ...]
    steers: tuple[Steer, ...] = ()

    def __post_init__(self) -> None:
        if not self.events:
            raise ValueError("a turn ledger needs at least one event")
        first = self.events[0]
        for event in self.events[1:]:
            if (event.actor, event.destination) != (first.actor, first.destination):
                raise ValueError(
                    f"event {event.event_id!r} cannot share a turn with {first.event_id!r}: "
                    "actor and destination must match; split them with coalesce()"
                )


def accept_steer(
    ledger: TurnLedger,
    content: str,
    *,
    event_id: str,
    status: SteerStatus = SteerStatus.INJECTED,
) -> TurnLedger:
    """Return the ledger with the steer appended when `status` is INJECTED, else `ledger` itself.

    Call this before acknowledging delivery, so the turn's manifest covers every accepted update.
    """
    if status is not SteerStatus.INJECTED:
        return ledger
    return TurnLedger(ledger.events, (*ledger.steers, Steer(event_id, content)))


def coalesce(events: Iterable[TurnEvent]) -> tuple[tuple[TurnEvent, ...], ...]:
    """Group contiguous events that share both actor and destination; order is kept."""
    groups: list[list[TurnEvent]] = []
    for event in events:
        if groups:
            last = groups[-1][-1]
            if (last.actor, last.destination) == (event.actor, event.destination):
                groups[-1].append(event)
                continue
        groups.append([event])
    return tuple(tuple(group) for group in groups)


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One model-visible input: its name, order number, version and signed source id."""

    name: str
    order: int
    version: str
    source: str | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """The canonical record of what a compiled turn contains."""

    entries: tuple[ManifestEntry, ...]

    @property
    def canonical_json(self) -> bytes:
        """The entry array as compact, key-sorted UTF-8 JSON; the input to `hash`."""
        array = [
            {"name": e.name, "order": e.order, "version": e.version, "source": e.source}
            for e in self.entries
        ]
        return orjson.dumps(array, option=orjson.OPT_SORT_KEYS)

    @property
    def hash(self) -> str:
        """Hex SHA-256 of `canonical_json`."""
        return hashlib.sha256(self.canonical_json).hexdigest()


@dataclass(frozen=True, slots=True)
class CompiledTurn:
    """The standing sections, the ``<turn>`` envelope and their manifest."""

    standing: str
    envelope: str
    manifest: Manifest

    @property
    def text(self) -> str:
        """Standing sections then the envelope, separated by one blank line."""
        return f"{self.standing}\n\n{self.envelope}" if self.standing else self.envelope


def _attrs(attributes: Attributes) -> str:
    return "".join(f' {key}="{_escape_attribute(value)}"' for key, value in attributes)


def _block(tag: str, attributes: Attributes, content: str) -> str:
    body = _escape_text(content)
    inner = f"{body}\n" if body else ""
    return f"<{tag}{_attrs(attributes)}>\n{inner}</{tag}>"


def _event_attributes(event: TurnEvent) -> Attributes:
    attributes: Attributes = (
        ("type", event.kind),
        ("author", event.author),
        ("actor", event.actor),
        ("event_id", event.event_id),
    )
    if event.thread_root is not None:
        attributes += (("thread_root", event.thread_root),)
    return attributes


def _present_layers(layers: Iterable[Layer]) -> list[Layer]:
    seen: dict[str, Layer] = {}
    for layer in layers:
        if layer.name in seen:
            raise ValueError(f"layer {layer.name!r} given twice; pass each layer once")
        seen[layer.name] = layer
    present = [layer for layer in seen.values() if layer.content.strip()]
    return sorted(present, key=lambda layer: _RANK[layer.name])


def compile_turn(
    layers: Iterable[Layer],
    turn: TurnEvent | TurnLedger,
    *,
    delivery: Attributes | Mapping[str, str] = (),
) -> CompiledTurn:
    """Compile layers and the current turn into envelope text and a manifest.

    Layers may come in any order: canonical order decides, and empty or whitespace-only
    layers are omitted. `delivery` becomes a ``<delivery .../>`` tag when non-empty.
    Raises ValueError for a duplicated layer or a malformed delivery attribute name.
    """
    ledger = turn if isinstance(turn, TurnLedger) else TurnLedger((turn,))
    delivery_attrs: Attributes = (
        tuple(sorted(delivery.items())) if isinstance(delivery, Mapping) else tuple(delivery)
    )
    _check_attributes(delivery_attrs, "delivery")

    standing: list[str] = []
    inside: list[str] = []
    entries: list[ManifestEntry] = []
    for layer in _present_layers(layers):
        target = inside if layer.name in _TURN_LAYERS else standing
        target.append(_block(layer.name, layer.attributes, layer.content))
        entries.append(
            ManifestEntry(layer.name, _ORDER[layer.name], layer.version, layer.source_event_id)
        )
    for event in ledger.events:
        inside.append(_block("event", _event_attributes(event), event.content))
        entries.append(
            ManifestEntry("event", _EVENT_ORDER, f"event:{event.event_id}", event.event_id)
        )
    for steer in ledger.steers:
        inside.append(_block("steer", (("event_id", steer.event_id),), steer.content))
        entries.append(
            ManifestEntry("steer", _STEER_ORDER, f"event:{steer.event_id}", steer.event_id)
        )
    if delivery_attrs:
        inside.append(f"<delivery{_attrs(delivery_attrs)}/>")
        version = _sha256(orjson.dumps([list(pair) for pair in delivery_attrs]))
        entries.append(ManifestEntry("delivery", _DELIVERY_ORDER, version))

    envelope = "<turn>\n" + "\n".join(inside) + "\n</turn>"
    return CompiledTurn("\n\n".join(standing), envelope, Manifest(tuple(entries)))
