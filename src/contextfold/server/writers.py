"""Who appends over HTTP, and what each writer may append.

Append access is authority only where the operator grants it. A writer is *trusted* when
the app was created with ``trusted_writer=True`` or the request authenticated with one of
its ``trusted_tokens``: its events are stored as sent. Every other writer is *external*:

- events only the agent runtime or an integration writes are refused: every type under
  :data:`~contextfold.events.RUNTIME_TYPE_PREFIXES` but ``context-added`` (decided by the
  name, so records of an integration this process never imported are refused too), and
  every registered type declared ``runtime_only``;
- a ``context-added`` item may not pose as the agent or a tool: role ``assistant``,
  ``llm_request_offset``, ``compaction``, ``tool_call_id``, a trusted actor type
  (``agent``, or one declared to the server: ``create_app(trusted_actor_types=...)``),
  actor type ``tool``, or a key of the agent's own slots (``agent/…``, the system prompt
  among them); the body's meta ``actor`` may not name such an actor type either;
- a system or developer item needs a built-in actor type: another type may be trusted by
  an agent in another process (``register_actor_type``), which would send the item with
  instruction precedence. Trust is the server's configuration, never its process registry;
- an item without an actor is stamped ``{"type": "http", "id": <writer name>}``: an
  actorless item counts as platform-written, and an external writer is not the platform.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from starlette.types import Scope

from ..context.events import BUILTIN_ACTOR_TYPES, ContextAdded
from ..context.state import SYSTEM_PROMPT_KEY, AgentContextState
from ..context.trust import is_actor_type
from ..errors import ConfigurationError
from ..events import RUNTIME_TYPE_PREFIXES, TYPE_NAME, RawEvent, is_runtime_type
from .errors import RequestBodyError

__all__ = [
    "AGENT_KEY_PREFIX",
    "ANONYMOUS",
    "HTTP_ACTOR_TYPE",
    "RUNTIME_NAMESPACE",
    "RUNTIME_TYPE_PREFIXES",
    "WRITER_SCOPE_KEY",
    "Writer",
    "check_item",
    "check_keyed_slots",
    "check_meta_actor",
    "check_runtime_type_prefixes",
    "check_trusted_actor_types",
    "check_type",
    "is_runtime_type",
    "keyed_items",
    "writer_of",
]


@dataclass(frozen=True, slots=True)
class Writer:
    """The client an append comes from: ``name`` is stamped into its actorless items,
    ``trusted`` grants it the runtime's own events and instruction precedence."""

    name: str
    trusted: bool = False
    trusted_actor_types: frozenset[str] = frozenset()
    """The actor types the server trusts beyond the built-in ones (declared to it): an
    external writer may not use them."""
    runtime_type_prefixes: tuple[str, ...] = ()
    """Type prefixes declared to the server as runtime-only beyond the built-in ones (the
    application's own ``runtime_only`` events): an external writer may not append them."""


ANONYMOUS = Writer("anonymous")
"""The writer of a request on a server without tokens."""

WRITER_SCOPE_KEY = "contextfold.writer"
"""The ASGI scope key the authentication puts the request's :class:`Writer` under."""

HTTP_ACTOR_TYPE = "http"
"""The (built-in, untrusted) actor type stamped on an external writer's actorless items."""

RUNTIME_NAMESPACE = "contextfold.agent/"
"""The runtime's type namespace: of it, external writers may append ``context-added`` only."""

AGENT_KEY_PREFIX = SYSTEM_PROMPT_KEY.split("/", 1)[0] + "/"
"""Slot keys of the agent's own (``agent/system-prompt``): trusted writers only."""

_GRANT = (
    "a trusted token (create_app(..., trusted_tokens=[...]), contextfold serve "
    "--trusted-token) or a server created with create_app(..., trusted_writer=True)"
)
_TRUSTED_HINT = (
    f"only the agent runtime writes it; a trusted backend appending on the agent's behalf needs "
    f"{_GRANT}"
)
_UNTRUSTED_TYPES = ", ".join(
    sorted(name for name, trusted in BUILTIN_ACTOR_TYPES.items() if not trusted and name != "tool")
)


def writer_of(scope: Scope, default: Writer = ANONYMOUS) -> Writer:
    """The writer the authentication found for this request, else ``default``."""
    found = scope.get(WRITER_SCOPE_KEY)
    return found if isinstance(found, Writer) else default


def check_runtime_type_prefixes(prefixes: Iterable[str]) -> tuple[str, ...]:
    """The type prefixes a server is told are runtime-only beyond the built-in ones, lower
    case (they match whatever the case). Raises ConfigurationError for one str instead of a
    collection, or a prefix that is not a type namespace ending in ``/`` (``myapp/``)."""
    if isinstance(prefixes, str):
        raise ConfigurationError(
            "runtime_type_prefixes must be a collection of prefixes, not one str"
        )
    declared = []
    for prefix in prefixes:
        if (
            not isinstance(prefix, str)
            or not prefix.endswith("/")
            or TYPE_NAME.fullmatch(prefix + "x") is None
        ):
            raise ConfigurationError(
                f"runtime type prefix {prefix!r} must be the start of event type names, "
                "ending in / (for example 'myapp/')"
            )
        declared.append(prefix.lower())
    return tuple(sorted(set(declared)))


def check_trusted_actor_types(names: Iterable[str]) -> frozenset[str]:
    """The actor types a server is told to trust beyond the built-in ones. Raises
    ConfigurationError for one str instead of a collection, a malformed name, or a built-in
    type whose trust is fixed otherwise (``agent`` is trusted already)."""
    if isinstance(names, str):
        raise ConfigurationError("trusted_actor_types must be a collection of names, not one str")
    declared = set()
    for name in names:
        if not isinstance(name, str) or not is_actor_type(name):
            raise ConfigurationError(
                f"trusted actor type {name!r} is not an actor type: a lowercase token of "
                "letters, digits and . _ - (1-64 characters, starting with a letter)"
            )
        if BUILTIN_ACTOR_TYPES.get(name) is False:
            raise ConfigurationError(
                f"trusted actor type {name!r} is built in as untrusted; choose another name"
            )
        declared.add(name)
    return frozenset(declared - set(BUILTIN_ACTOR_TYPES))


def check_type(where: str, type_name: str, writer: Writer) -> None:
    """RequestBodyError when an external ``writer`` sends a runtime event type."""
    if not writer.trusted and (
        is_runtime_type(type_name) or type_name.lower().startswith(writer.runtime_type_prefixes)
    ):
        raise RequestBodyError(f'{where}."type" {type_name!r} is refused: {_TRUSTED_HINT}')


def check_meta_actor(actor: object, writer: Writer) -> None:
    """RequestBodyError when an external ``writer``'s body ``actor`` names an actor type it
    may not use in ``payload.actor`` (the runtime records its own appends under them)."""
    if not writer.trusted and isinstance(actor, str) and _reserved_actor_type(actor, writer):
        raise RequestBodyError(
            f'"actor" {actor!r} is refused: it names the agent runtime or a trusted actor; '
            f"{_TRUSTED_HINT}"
        )


def check_item(
    where: str, item: ContextAdded, payload: dict[str, Any], writer: Writer, *, body_actor: object
) -> dict[str, Any]:
    """The payload to store for ``item`` (``payload`` as sent, or stamped with the http
    actor). Raises RequestBodyError naming the field that would let an external writer
    pose as the agent, a tool or the platform."""
    if body_actor is not None and item.actor is None:
        raise RequestBodyError(
            f'{where}.payload has no "actor" while the body says actor={body_actor!r}: '
            'give the actor in payload.actor (e.g. {"type": "webhook"}), it decides the '
            "wire role; the body's actor is only stored as metadata"
        )
    if item.actor is not None and not is_actor_type(item.actor.type):
        # Stored rows decode with a looser rule; an append is held to the whole token, so
        # no header line an item renders can break over two lines.
        raise RequestBodyError(
            f"{where}.payload.actor.type {item.actor.type!r} is not an actor type: a lowercase "
            "token of letters, digits and . _ - (1-64 characters, starting with a letter)"
        )
    if writer.trusted:
        return payload
    field = _posing_field(item, writer)
    if field is not None:
        raise RequestBodyError(
            f"{where}.{field} is refused: the item would pose as the agent's own or a "
            f"tool's; {_TRUSTED_HINT}"
        )
    if (
        item.actor is not None
        and item.role != "user"
        and item.actor.type not in BUILTIN_ACTOR_TYPES
    ):
        raise RequestBodyError(
            f"{where}.payload.actor.type {item.actor.type!r} with role {item.role!r} is "
            "refused: it is no built-in actor type, and an agent that registered it trusted "
            'would send the item with instruction precedence; send it with role "user" or '
            f"under a built-in untrusted actor type ({_UNTRUSTED_TYPES}); a trusted writer "
            f"needs {_GRANT}"
        )
    if item.actor is None:
        return {**payload, "actor": {"type": HTTP_ACTOR_TYPE, "id": writer.name}}
    return payload


def _posing_field(item: ContextAdded, writer: Writer) -> str | None:
    if item.role == "assistant":
        return 'payload.role "assistant"'
    if item.actor is not None and _reserved_actor_type(item.actor.type, writer):
        return f"payload.actor.type {item.actor.type!r}"
    if item.llm_request_offset is not None:
        return "payload.llm_request_offset"
    if item.compaction is not None:
        return "payload.compaction"
    if item.tool_call_id is not None:
        return "payload.tool_call_id"
    if item.key is not None and item.key.startswith(AGENT_KEY_PREFIX):
        return f"payload.key {item.key!r}"
    return None


def _reserved_actor_type(name: str, writer: Writer) -> bool:
    # The built-in types and the server's declaration, never this process's registry: the
    # agents trusting a registered type run in other processes.
    return (
        name == "tool" or BUILTIN_ACTOR_TYPES.get(name, False) or name in writer.trusted_actor_types
    )


def keyed_items(events: Iterable[RawEvent]) -> tuple[tuple[int, str, str], ...]:
    """``(index, role, key)`` of each keyed ``context-added`` item among ``events``."""
    found = []
    for index, event in enumerate(events):
        if event.type == ContextAdded.event_type and isinstance(event.payload, dict):
            key, role = event.payload.get("key"), event.payload.get("role")
            if isinstance(key, str) and isinstance(role, str):
                found.append((index, role, key))
    return tuple(found)


def check_keyed_slots(
    state: AgentContextState, keyed: Iterable[tuple[int, str, str]], writer: Writer
) -> None:
    """Raise RequestBodyError when an external writer's keyed item would replace a slot a
    trusted writer holds: a later item with a slot's key takes the slot, so a webhook could
    otherwise erase an operator's instruction (or supersede it once sent) by reusing its
    key. A slot that is empty, or held by an external writer's item, may be replaced."""
    if writer.trusted:
        return
    for index, role, key in keyed:
        lane = state.system if role == "system" else state.history
        holder = next((item for item in reversed(lane) if item.key == key), None)
        if holder is None:
            continue
        if holder.actor is None or _reserved_actor_type(holder.actor.type, writer):
            raise RequestBodyError(
                f"events[{index}].payload.key {key!r} is refused: the slot holds @{holder.offset}, "
                "an item a trusted writer added, and an external writer may not replace it; "
                f"use a key of its own (a trusted writer needs {_GRANT})"
            )
