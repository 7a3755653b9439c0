"""Trust and wire roles: which provider role an item may have, decided in one pure place.

Product roles are not wire roles. External data must never acquire instruction
precedence just because an application filed it as developer (or system) context:

- user items are always ``user``;
- system and developer items from an untrusted actor (every known type except
  ``agent``, and every registered type with ``trusted=False`` or not registered at all)
  become ``user``;
- actorless and trusted developer items are ``developer`` on a transport with a native
  developer role and ``system`` elsewhere; trusted system items are ``system``;
- a compaction summary is ``user``: a faithful summary can quote untrusted text;
- a tool result is ``tool`` (``build_request`` sends one it cannot pair as ``user``);
- assistant items are ``assistant``; only :func:`may_call_tools` items keep tool calls.

A human is untrusted here too: a ``user`` actor on a developer item gets the user role.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..errors import InvalidInputError
from ..render.neutral import Role as WireRole
from .events import Actor

if TYPE_CHECKING:
    from .state import ContextItem

__all__ = [
    "BUILTIN_ACTOR_TYPES",
    "WireRole",
    "actor_types",
    "is_external",
    "is_trusted",
    "may_call_tools",
    "register_actor_type",
    "wire_role",
]

BUILTIN_ACTOR_TYPES: Mapping[str, bool] = {
    "user": False,
    "agent": True,
    "script": False,
    "tool": False,
    "slack": False,
    "telegram": False,
    "email": False,
    "github": False,
    "webhook": False,
}
"""The known actor types and whether each is trusted with instruction precedence."""

_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")
# Process-wide like the Event registry: register at import time of the defining module.
_registry: dict[str, bool] = dict(BUILTIN_ACTOR_TYPES)


def register_actor_type(name: str, *, trusted: bool) -> None:
    """Add an actor type. Registering the same name with the same trust again is a no-op.

    Raises InvalidInputError for a malformed name, for a built-in type and for a
    different trust than the earlier registration (that would change rendered requests).
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidInputError(
            f"actor type {name!r} must be a lowercase token of letters, digits and . _ - "
            "(1-64 characters, starting with a letter)"
        )
    if not isinstance(trusted, bool):
        raise InvalidInputError(f"actor type {name!r}: trusted must be True or False")
    if name in BUILTIN_ACTOR_TYPES:
        if BUILTIN_ACTOR_TYPES[name] == trusted:
            return
        raise InvalidInputError(f"actor type {name!r} is built in with trusted={not trusted}")
    existing = _registry.get(name)
    if existing is not None and existing != trusted:
        raise InvalidInputError(
            f"actor type {name!r} is already registered with trusted={existing}; "
            "choose another name instead of changing its trust"
        )
    _registry[name] = trusted


def actor_types() -> Mapping[str, bool]:
    """A snapshot of the registry: actor type -> trusted."""
    return dict(_registry)


def is_trusted(actor: Actor | None) -> bool:
    """True for an actorless (platform-authored) item and for a trusted actor type."""
    return actor is None or _registry.get(actor.type, False)


def is_external(actor: Actor | None) -> bool:
    """True when the actor is present and not trusted (external data)."""
    return not is_trusted(actor)


def may_call_tools(item: ContextItem) -> bool:
    """Whether the item's tool calls may be sent as real calls: an assistant item whose
    request offset the projection verified (see ``projection``)."""
    return (
        item.role == "assistant" and bool(item.tool_calls) and item.llm_request_offset is not None
    )


def wire_role(item: ContextItem, transport_has_developer: bool) -> WireRole:
    """The provider role of ``item`` (see the module docstring for the rules)."""
    if item.tool_call_id is not None:
        return "tool"
    if item.compaction is not None or item.role == "user":
        return "user"
    if item.role == "assistant":
        return "assistant"
    if is_external(item.actor):
        return "user"
    if item.role == "system":
        return "system"
    return "developer" if transport_has_developer else "system"
