"""The turn envelope compiler: one event-driven turn in, its envelope text and manifest out.

The format and the manifest are Buzz's (its agent context compiler), so the two are
interchangeable::

    <buzz-turn>

    <ambient-context>
    Scope: thread
    Channel: engineering
    <recent-thread-delta included="1" total="1" truncated="false">
    Morgan: The deploy is failing.
    </recent-thread-delta>
    </ambient-context>

    <event type="mention" author="Morgan" actor="pk" event_id="ev-2" thread_root="ev-1">
    Content: Fix the deployment failure.
    </event>

    <delivery scope="thread" reply_to="ev-1" />

    </buzz-turn>

Tags mark only the ambient context, history, event and delivery boundaries; text is
escaped (``&``, ``<``, ``>``) and attribute values too (also ``"``, ``'``, and newline,
carriage return and tab become a space), so no content opens or closes a tag. Standing
layers (platform, persona, memory, canvas) are delivered in the system lane; the
manifest still records them with their freshness. Every model-visible fragment is a
manifest layer; the ids, timestamps and actor keys of recent messages feed their
layer's version without being rendered.

:func:`compile_turn` is pure: no I/O, no clock, environment, random source or generated
id. The same inputs give the same bytes and the same manifest hash.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from ..context.manifest import (
    Manifest,
    ManifestLayer,
    content_version,
    estimate_tokens,
    manifest_of,
)
from ..errors import BackpressureError, InvalidInputError

__all__ = [
    "CANONICAL_LAYERS",
    "MAX_BATCH_EVENTS",
    "ChannelInfo",
    "CompiledSteer",
    "CompiledTurn",
    "Interrupted",
    "Layer",
    "LayerSpec",
    "RecentMessage",
    "RecentThread",
    "TurnBatch",
    "TurnContext",
    "TurnEvent",
    "coalesce",
    "compile_steer",
    "compile_turn",
    "escape_attribute",
    "escape_text",
    "section",
]

MAX_BATCH_EVENTS = 50
"""The most events one turn holds, its accepted steers included."""

_MAX_DESCRIPTION = 500
_TAG = re.compile(r"[a-z][a-z0-9-]*\Z")
_ATTRIBUTE = re.compile(r"[a-z][a-z0-9_-]*\Z")


def escape_text(value: str) -> str:
    """Escape content where it could form a tag: ``&``, ``<`` and ``>``."""
    return value.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def escape_attribute(value: str) -> str:
    """Escape an attribute value: as text, plus ``"`` and ``'``; newline, carriage return
    and tab become a space, so an attribute stays on its line."""
    escaped = escape_text(value).replace('"', "&quot;").replace("'", "&apos;")
    return escaped.replace("\n", " ").replace("\r", " ").replace("\t", " ")


def section(tag: str, content: str) -> str:
    """A standing section, ``<tag>\\n…\\n</tag>``: content escaped, its leading and
    trailing line breaks trimmed. Raises InvalidInputError for a malformed tag."""
    if not _TAG.match(tag):
        raise InvalidInputError(f"section tag {tag!r}: use lowercase letters, digits and '-'")
    return f"<{tag}>\n{escape_text(content.strip(chr(10) + chr(13)))}\n</{tag}>"


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """What a layer is, besides its content: order, scope, source, authority, freshness."""

    order: int
    scope: str
    source: str
    authority: str
    freshness: str


CANONICAL_LAYERS: Mapping[str, LayerSpec] = {
    "platform_contract": LayerSpec(1, "runtime", "base_prompt", "instructions", "configured"),
    "persona_and_team_guidance": LayerSpec(
        2, "agent_community", "agent_configuration", "instructions", "configured"
    ),
    "core_memory": LayerSpec(3, "agent_owner", "core_engram", "advisory_context", "session_start"),
    # Channel metadata is resolved (and cached) per turn; the canvas is frozen at session start.
    "channel_snapshot": LayerSpec(4, "channel", "channel_metadata", "shared_evidence", "cached"),
    "channel_canvas": LayerSpec(4, "channel", "channel_canvas", "shared_evidence", "session_start"),
    "context_status": LayerSpec(6, "turn", "delivery_state", "evidence", "current"),
    "recent_thread_delta": LayerSpec(6, "thread", "relay_events", "evidence", "current"),
    "interrupted_turn": LayerSpec(6, "thread", "cancelled_events", "evidence", "current"),
    "current_instruction": LayerSpec(7, "turn", "nostr_event", "authoritative", "current"),
    "delivery_contract": LayerSpec(8, "turn", "buzz_routing", "routing_constraint", "current"),
}
"""Seed 004's canonical layers with Buzz's orders and names (layer 5, a thread checkpoint,
is left out as Buzz leaves it out). Pass your own ``specs`` to rename sources or scopes."""


@dataclass(frozen=True, slots=True)
class Layer:
    """One layer of a turn, named by you or taken from :data:`CANONICAL_LAYERS`.

    ``version`` is the signed source event id when there is one; without it the version
    is the content's SHA-256. Empty or whitespace-only layers are left out.
    """

    layer: str
    content: str
    order: int
    scope: str
    source: str
    authority: str
    freshness: str
    version: str | None = None
    truncated: bool = False

    @classmethod
    def canonical(
        cls,
        name: str,
        content: str,
        *,
        version: str | None = None,
        truncated: bool = False,
        specs: Mapping[str, LayerSpec] = CANONICAL_LAYERS,
    ) -> Layer:
        """The layer ``name`` with the spec ``specs`` gives it. Raises InvalidInputError
        for a name ``specs`` does not have."""
        try:
            spec = specs[name]
        except KeyError:
            raise InvalidInputError(
                f"no layer spec named {name!r}; known: {', '.join(specs)}"
            ) from None
        return cls(
            name,
            content,
            spec.order,
            spec.scope,
            spec.source,
            spec.authority,
            spec.freshness,
            version,
            truncated,
        )

    def entry(self) -> ManifestLayer | None:
        """The manifest layer, or None for an empty layer."""
        if not self.content.strip():
            return None
        return ManifestLayer(
            order=self.order,
            layer=self.layer,
            scope=self.scope,
            source=self.source,
            version=self.version if self.version is not None else content_version(self.content),
            authority=self.authority,
            freshness=self.freshness,
            estimated_tokens=estimate_tokens(self.content),
            truncated=self.truncated,
        )


class TurnEvent(BaseModel):
    """A signed external event that starts, joins or steers a turn.

    ``kind`` is the event's type attribute (``mention``, a rule's tag); ``actor`` the
    signing key; ``mentions`` the labels of those it mentions. Raises a ValidationError
    naming the field for an empty id or actor.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(min_length=1)
    actor: str = Field(min_length=1)
    event_id: str = Field(min_length=1)
    content: str
    author: str | None = None
    """A readable name for the actor, when known."""
    thread_root: str | None = Field(default=None, min_length=1)
    parent: str | None = Field(default=None, min_length=1)
    """The event replied to, when it is not the thread root."""
    mentions: tuple[str, ...] = ()

    @property
    def destination(self) -> str:
        """The thread root id, or the event's own id for a top-level event."""
        return self.thread_root if self.thread_root is not None else self.event_id

    @property
    def authority(self) -> tuple[str, str]:
        """``(actor, destination)``: events coalesce only when both match."""
        return self.actor, self.destination


@dataclass(frozen=True, slots=True)
class TurnBatch:
    """The events of one turn: 1 to :data:`MAX_BATCH_EVENTS`, one actor and destination.

    Raises InvalidInputError for no events or events of different authority, and
    BackpressureError for more than the limit (split them with :func:`coalesce`).
    """

    events: tuple[TurnEvent, ...]

    def __post_init__(self) -> None:
        if not self.events:
            raise InvalidInputError("a turn needs at least one event")
        if len(self.events) > MAX_BATCH_EVENTS:
            raise BackpressureError(
                f"a turn holds at most {MAX_BATCH_EVENTS} events, got {len(self.events)}; "
                "split them with coalesce()",
                destination=self.events[0].destination,
                limit=MAX_BATCH_EVENTS,
            )
        first = self.events[0]
        for event in self.events[1:]:
            if event.authority != first.authority:
                raise InvalidInputError(
                    f"event {event.event_id!r} cannot share a turn with {first.event_id!r}: "
                    "actor and destination must match; split them with coalesce()"
                )


def coalesce(
    events: Iterable[TurnEvent], *, max_batch: int = MAX_BATCH_EVENTS
) -> tuple[TurnBatch, ...]:
    """Contiguous events of one actor and destination as batches of at most ``max_batch``
    (the rest of a longer run starts the next batch); order is kept, nothing dropped."""
    groups: list[list[TurnEvent]] = []
    for event in events:
        last = groups[-1] if groups else None
        if last and last[-1].authority == event.authority and len(last) < max_batch:
            last.append(event)
        else:
            groups.append([event])
    return tuple(TurnBatch(tuple(group)) for group in groups)


@dataclass(frozen=True, slots=True)
class RecentMessage:
    """A recent message of the thread: rendered ``author: content``; its id, actor key and
    timestamp only version the layer."""

    event_id: str
    actor: str
    timestamp: str
    content: str
    author: str | None = None


@dataclass(frozen=True, slots=True)
class RecentThread:
    """The recent messages read for the turn: ``total`` in the thread, ``truncated`` when
    the read was cut; ``scope`` ``"thread"`` or ``"dm"``."""

    messages: tuple[RecentMessage, ...]
    total: int
    truncated: bool = False
    scope: Literal["thread", "dm"] = "thread"


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    """Resolver metadata of the channel; a ``dm`` channel shows no description."""

    name: str
    description: str | None = None
    kind: str = "stream"


@dataclass(frozen=True, slots=True)
class Interrupted:
    """Events of a cancelled turn this one takes over."""

    events: tuple[TurnEvent, ...]
    disposition: Literal["continue_prior_work", "superseded"] = "continue_prior_work"


@dataclass(frozen=True, slots=True)
class TurnContext:
    """Everything a turn is compiled with besides its events (resolved before: the
    compiler does no I/O).

    ``standing`` layers are recorded, not rendered (the system lane carries them);
    ``ambient`` layers are your own model-visible fragments, escaped, after the built-in
    ones; ``history`` is a status line (``"truncated; retrieve: …"``); ``delivery`` the
    attributes of the ``<delivery />`` tag, in order.
    """

    standing: tuple[Layer, ...] = ()
    channel: ChannelInfo | None = None
    canvas: str | None = None
    recent: RecentThread | None = None
    interrupted: Interrupted | None = None
    history: str | None = None
    ambient: tuple[Layer, ...] = ()
    delivery: tuple[tuple[str, str], ...] = field(default=())


@dataclass(frozen=True, slots=True)
class CompiledTurn:
    """The envelope's sections (joined into :attr:`text`) and the turn's manifest."""

    sections: tuple[str, ...]
    manifest: Manifest

    @property
    def text(self) -> str:
        """The sections separated by blank lines: the turn's model-visible item."""
        return "\n\n".join(self.sections)


@dataclass(frozen=True, slots=True)
class CompiledSteer:
    """An accepted steer's item text and the layers it adds to its turn's manifest."""

    text: str
    layers: tuple[ManifestLayer, ...]


def _attributes(pairs: Iterable[tuple[str, str | None]], where: str) -> str:
    rendered = []
    for name, value in pairs:
        if not _ATTRIBUTE.match(name):
            raise InvalidInputError(
                f"{where}: attribute name {name!r} is not allowed; use lowercase letters, "
                "digits, '-' or '_', starting with a letter"
            )
        if value is not None:
            rendered.append(f'{name}="{escape_attribute(value)}"')
    return " ".join(rendered)


def _event_block(event: TurnEvent) -> str:
    parent = event.parent if event.parent != event.thread_root else None
    attributes = _attributes(
        [
            ("type", event.kind.lstrip("@")),
            ("author", event.author),
            ("actor", event.actor),
            ("event_id", event.event_id),
            ("parent", parent),
            ("thread_root", event.thread_root),
            ("mentions", ", ".join(event.mentions) if event.mentions else None),
        ],
        f"event {event.event_id!r}",
    )
    return f"<event {attributes}>\nContent: {escape_text(event.content)}\n</event>"


def _description(channel: ChannelInfo | None) -> tuple[str, bool] | None:
    if channel is None or channel.kind == "dm" or not channel.description:
        return None
    # Lines collapse to one, so a description can never spoof another field.
    lines = [line.strip() for line in re.split(r"[\n\r]", channel.description)]
    collapsed = " ".join(line for line in lines if line)
    if not collapsed:
        return None
    if len(collapsed) > _MAX_DESCRIPTION:
        return collapsed[:_MAX_DESCRIPTION] + "…", True
    return collapsed, False


def _channel_snapshot(channel: ChannelInfo | None) -> tuple[str, bool]:
    lines = [f"Channel: {escape_text(channel.name)}"] if channel is not None else []
    description = _description(channel)
    if description is not None:
        lines.append(f"Description: {escape_text(description[0])}")
    return "\n".join(lines), description is not None and description[1]


def _recent(recent: RecentThread) -> tuple[str, str]:
    """The rendered delta and its version: the messages' ids, keys and times included."""
    head = (
        f'<recent-thread-delta included="{len(recent.messages)}" total="{recent.total}" '
        f'truncated="{str(recent.truncated).lower()}">'
    )
    lines = [head]
    for message in recent.messages:
        label = message.author if message.author is not None else message.actor
        lines.append(f"{escape_text(label)}: {escape_text(message.content)}")
    lines.append("</recent-thread-delta>")
    source = {
        "scope": recent.scope,
        "total": recent.total,
        "truncated": recent.truncated,
        "messages": [[m.event_id, m.actor, m.timestamp, m.content] for m in recent.messages],
    }
    return "\n".join(lines), content_version(
        orjson.dumps(source, option=orjson.OPT_SORT_KEYS).decode()
    )


def _interrupted(interrupted: Interrupted) -> str:
    blocks = "\n".join(_event_block(event) for event in interrupted.events)
    return (
        f'<interrupted-turn disposition="{interrupted.disposition}">\n{blocks}\n</interrupted-turn>'
    )


def _scope(batch: TurnBatch, context: TurnContext) -> str:
    if context.channel is not None and context.channel.kind == "dm":
        return "dm"
    return "thread" if batch.events[-1].thread_root is not None else "channel"


def compile_turn(
    turn: TurnBatch | TurnEvent,
    context: TurnContext | None = None,
    *,
    specs: Mapping[str, LayerSpec] = CANONICAL_LAYERS,
) -> CompiledTurn:
    """Compile one turn into its envelope sections and manifest.

    Layers are ordered canonically (stably by order) and empty ones omitted; the current
    instruction's version is its event id when the turn has one event. Raises
    InvalidInputError for a malformed attribute name or a missing layer spec.
    """
    batch = turn if isinstance(turn, TurnBatch) else TurnBatch((turn,))
    context = context if context is not None else TurnContext()
    layers: list[Layer] = list(context.standing)
    ambient: list[str] = []

    def add(name: str, content: str, *, version: str | None = None, cut: bool = False) -> None:
        layers.append(Layer.canonical(name, content, version=version, truncated=cut, specs=specs))

    status = f"Scope: {_scope(batch, context)}"
    if context.history:
        status += f"\nHistory: {escape_text(context.history)}"
    snapshot, snapshot_cut = _channel_snapshot(context.channel)
    add("channel_snapshot", snapshot, cut=snapshot_cut)
    if context.canvas is not None:
        add("channel_canvas", context.canvas)
    add("context_status", status)
    ambient += [status, snapshot]
    if context.recent is not None:
        delta, version = _recent(context.recent)
        recent = Layer.canonical(
            "recent_thread_delta",
            delta,
            version=version,
            truncated=context.recent.truncated,
            specs=specs,
        )
        if recent.scope == "thread":  # the default scope follows the read: thread or dm
            recent = replace(recent, scope=context.recent.scope)
        layers.append(recent)
        ambient.append(delta)
    if context.interrupted is not None:
        fragment = _interrupted(context.interrupted)
        add("interrupted_turn", fragment)
        ambient.append(fragment)
    for own in context.ambient:
        fragment = escape_text(own.content)
        layers.append(replace(own, content=fragment))
        ambient.append(fragment)

    instruction = "\n".join(_event_block(event) for event in batch.events)
    single = batch.events[0].event_id if len(batch.events) == 1 else None
    add("current_instruction", instruction, version=single)
    sections = ["<buzz-turn>"]
    visible = [fragment for fragment in ambient if fragment.strip()]
    if visible:
        sections.append("<ambient-context>\n" + "\n".join(visible) + "\n</ambient-context>")
    sections.append(instruction)
    if context.delivery:
        delivery = f"<delivery {_attributes(context.delivery, 'delivery')} />"
        add("delivery_contract", delivery)
        sections.append(delivery)
    sections.append("</buzz-turn>")
    entries = [entry for layer in layers if (entry := layer.entry()) is not None]
    return CompiledTurn(tuple(sections), manifest_of(entries))


def compile_steer(
    event: TurnEvent, *, specs: Mapping[str, LayerSpec] = CANONICAL_LAYERS
) -> CompiledSteer:
    """An event accepted into a running turn: its own ``<buzz-turn>`` item and one
    current-instruction layer versioned by its id, which the turn's manifest gains."""
    block = _event_block(event)
    layer = Layer.canonical("current_instruction", block, version=event.event_id, specs=specs)
    entry = layer.entry()
    assert entry is not None  # an event block is never empty
    return CompiledSteer("\n\n".join(("<buzz-turn>", block, "</buzz-turn>")), (entry,))
