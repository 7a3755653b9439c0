"""Trust and wire roles: which provider role an item may have, decided in one pure place.

Product roles are not wire roles. External data must never acquire instruction
precedence just because an application filed it as developer (or system) context:

- user items are always ``user``;
- system and developer items from an untrusted actor (every built-in type except
  ``agent``, and every other type unless the request trusts it) become ``user``;
- actorless and trusted developer items are ``developer`` on a transport with a native
  developer role and ``system`` elsewhere; trusted system items are ``system``;
- a compaction summary is ``user``: a faithful summary can quote untrusted text;
- a tool result is ``tool`` only when the projection verified it as the runtime's own
  record (``ContextItem.verified_result``; ``build_request`` sends one it cannot pair as
  ``user``); any other item with a ``tool_call_id`` is untrusted content: ``user``;
- assistant items are ``assistant``; only :func:`may_call_tools` items keep tool calls.

A human is untrusted here too: a ``user`` actor on a developer item gets the user role.

Trust is decided from the journal alone, never from process state: the built-in types,
plus the registered trusted types a request's header snapshot recorded
(``RequestHeader.trusted_actor_types``, filled from :func:`trusted_extensions` when the
request is made). A request rebuilt in another process, or after a later registration,
therefore renders the same roles as when it was sent.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from ..errors import InvalidInputError
from ..wire import Role
from .events import BUILTIN_ACTOR_TYPES, Actor

if TYPE_CHECKING:
    from .state import ContextItem

__all__ = [
    "BUILTIN_ACTOR_TYPES",
    "actor_types",
    "is_actor_type",
    "is_external",
    "is_trusted",
    "may_call_tools",
    "register_actor_type",
    "trusted_extensions",
    "wire_role",
]

_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,63}")
"""An actor type token, matched whole (``$`` would let a final newline through)."""
# Process-wide like the Event registry: register at import time of the defining module.
# Only trusted_extensions() reads it for decisions, when a request header is made.
_registry: dict[str, bool] = dict(BUILTIN_ACTOR_TYPES)


def is_actor_type(name: str) -> bool:
    """Whether ``name`` is an actor type token as a new item or registration must give it."""
    return _NAME.fullmatch(name) is not None


def register_actor_type(name: str, *, trusted: bool) -> None:
    """Add an actor type. Registering the same name with the same trust again is a no-op.

    A trusted type gains precedence only in requests made after it is registered (see
    :func:`trusted_extensions`). Raises InvalidInputError for a malformed name, for a
    built-in type and for a different trust than the earlier registration.
    """
    if not isinstance(name, str) or not _NAME.fullmatch(name):
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


def trusted_extensions() -> tuple[str, ...]:
    """The registered trusted types that are not built in, sorted: what a request header
    records as ``trusted_actor_types`` when the request is made."""
    extensions = (n for n, t in _registry.items() if t and n not in BUILTIN_ACTOR_TYPES)
    return tuple(sorted(extensions))


def is_trusted(actor: Actor | None, extra: Collection[str] = ()) -> bool:
    """True for an actorless (platform-authored) item, a trusted built-in actor type and a
    type in ``extra`` (a request header's ``trusted_actor_types``). Pure: the live
    registry is not consulted."""
    if actor is None:
        return True
    if actor.type in BUILTIN_ACTOR_TYPES:  # fixed: no header can trust slack or a user
        return BUILTIN_ACTOR_TYPES[actor.type]
    return actor.type in extra


def is_external(actor: Actor | None, extra: Collection[str] = ()) -> bool:
    """True when the actor is present and not trusted (external data); see :func:`is_trusted`."""
    return not is_trusted(actor, extra)


def may_call_tools(item: ContextItem) -> bool:
    """Whether the item's tool calls may be sent as real calls: an assistant item whose
    request offset the projection verified (see ``projection``)."""
    return (
        item.role == "assistant" and bool(item.tool_calls) and item.llm_request_offset is not None
    )


def wire_role(
    item: ContextItem, transport_has_developer: bool, trusted_types: Collection[str] = ()
) -> Role:
    """The provider role of ``item`` (see the module docstring for the rules).

    ``trusted_types`` are the non-built-in actor types the request trusts (its header's
    ``trusted_actor_types``); every other non-built-in type is untrusted.
    """
    if item.tool_call_id is not None:
        return "tool" if item.verified_result else "user"
    if item.compaction is not None or item.role == "user":
        return "user"
    if item.role == "assistant":
        return "assistant"
    if is_external(item.actor, trusted_types):
        return "user"
    if item.role == "system":
        return "system"
    return "developer" if transport_has_developer else "system"
