"""Who appends over HTTP, and what each writer may append.

Append access is authority only where the operator grants it. A writer is *trusted* when
the app was created with ``trusted_writer=True`` or the request authenticated with one of
its ``trusted_tokens``: its events are stored as sent. Every other writer is *external*:

- events only the agent runtime writes are refused: every type declared ``runtime_only``
  (see :class:`~contextfold.events.Event`), every other type of the runtime's namespace
  ``contextfold.agent/`` than ``context-added`` (so a runtime event this process never
  imported is refused too), and fold checkpoints;
- a ``context-added`` item may not pose as the agent or a tool: role ``assistant``,
  ``llm_request_offset``, ``compaction``, ``tool_call_id``, a trusted actor type
  (``agent``, or one registered trusted), actor type ``tool``, or a key of the agent's own
  slots (``agent/…``, the system prompt among them); the body's meta ``actor`` may not
  name such an actor type either;
- an item without an actor is stamped ``{"type": "http", "id": <writer name>}``: an
  actorless item counts as platform-written, and an external writer is not the platform.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.types import Scope

from ..context.events import ContextAdded
from ..context.state import SYSTEM_PROMPT_KEY
from ..context.trust import actor_types
from ..events import runtime_only_types
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
    "check_meta_actor",
    "check_type",
    "is_runtime_type",
    "writer_of",
]


@dataclass(frozen=True, slots=True)
class Writer:
    """The client an append comes from: ``name`` is stamped into its actorless items,
    ``trusted`` grants it the runtime's own events and instruction precedence."""

    name: str
    trusted: bool = False


ANONYMOUS = Writer("anonymous")
"""The writer of a request on a server without tokens."""

WRITER_SCOPE_KEY = "contextfold.writer"
"""The ASGI scope key the authentication puts the request's :class:`Writer` under."""

HTTP_ACTOR_TYPE = "http"
"""The (built-in, untrusted) actor type stamped on an external writer's actorless items."""

RUNTIME_NAMESPACE = "contextfold.agent/"
"""The runtime's type namespace: of it, external writers may append ``context-added`` only."""

RUNTIME_TYPE_PREFIXES = (RUNTIME_NAMESPACE, "contextfold.checkpoint/")
"""Type prefixes only the runtime writes (its events, fold checkpoints)."""

AGENT_KEY_PREFIX = SYSTEM_PROMPT_KEY.split("/", 1)[0] + "/"
"""Slot keys of the agent's own (``agent/system-prompt``): trusted writers only."""

_TRUSTED_HINT = (
    "only the agent runtime writes it; a trusted backend appending on the agent's behalf "
    "needs a trusted token (create_app(..., trusted_tokens=[...]), contextfold serve "
    "--trusted-token) or a server created with create_app(..., trusted_writer=True)"
)


def writer_of(scope: Scope, default: Writer = ANONYMOUS) -> Writer:
    """The writer the authentication found for this request, else ``default``."""
    found = scope.get(WRITER_SCOPE_KEY)
    return found if isinstance(found, Writer) else default


def is_runtime_type(type_name: str) -> bool:
    """Whether only the agent runtime may write events of ``type_name``."""
    if type_name in runtime_only_types():
        return True
    return type_name.startswith(RUNTIME_TYPE_PREFIXES) and type_name != ContextAdded.event_type


def check_type(where: str, type_name: str, writer: Writer) -> None:
    """RequestBodyError when an external ``writer`` sends a runtime event type."""
    if not writer.trusted and is_runtime_type(type_name):
        raise RequestBodyError(f'{where}."type" {type_name!r} is refused: {_TRUSTED_HINT}')


def check_meta_actor(actor: object, writer: Writer) -> None:
    """RequestBodyError when an external ``writer``'s body ``actor`` names an actor type it
    may not use in ``payload.actor`` (the runtime records its own appends under them)."""
    if not writer.trusted and isinstance(actor, str) and _reserved_actor_type(actor):
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
    if writer.trusted:
        return payload
    field = _posing_field(item)
    if field is not None:
        raise RequestBodyError(
            f"{where}.{field} is refused: the item would pose as the agent's own or a "
            f"tool's; {_TRUSTED_HINT}"
        )
    if item.actor is None:
        return {**payload, "actor": {"type": HTTP_ACTOR_TYPE, "id": writer.name}}
    return payload


def _posing_field(item: ContextAdded) -> str | None:
    if item.role == "assistant":
        return 'payload.role "assistant"'
    if item.actor is not None and _reserved_actor_type(item.actor.type):
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


def _reserved_actor_type(name: str) -> bool:
    # The live registry: a type registered trusted now is refused now, even though a
    # request only trusts the registered types its header records.
    return name == "tool" or actor_types().get(name, False)
