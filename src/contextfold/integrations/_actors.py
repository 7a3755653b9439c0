"""Untrusted actors in framework objects, checked in one place for every integration.

Content an application marks as supplied by an untrusted actor (a Slack message, an email, a
webhook body) never reaches the model with system precedence; ``context.trust`` decides what
is trusted. Here: the key a marking is stored under in a framework object's metadata, the
actor a new marking names, the actor a stored marking holds, and the header line naming the
actor that marked content goes out behind.
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from ..context.events import Actor
from ..context.trust import is_trusted, trusted_extensions
from ..errors import InvalidInputError

__all__ = ["ACTOR_KEY", "actor_header", "marked_actor", "untrusted_actor"]

ACTOR_KEY = "contextfold_actor"
"""The metadata key holding the actor that supplied a framework object (a LangGraph
message's ``additional_kwargs``, a pydantic-ai ``SystemPromptPart.metadata``)."""


# Characters str.splitlines breaks on that JSON string encoding leaves as they are: a header
# stays one line whatever the actor id holds.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def actor_header(actor: Actor) -> str:
    """The one header line naming ``actor``, as contextfold's item headers write it:
    ``actor=slack actor_id="U42"``."""
    header = f"actor={actor.type}"
    if actor.id is not None:
        header += " actor_id=" + json.dumps(actor.id, ensure_ascii=False).translate(_LINE_BREAKS)
    return header


def untrusted_actor(actor: object, id: object = None, *, origin: object = None, what: str) -> Actor:
    """The actor of type ``actor`` (with ``id`` and ``origin``) for content it supplied.

    Raises InvalidInputError, its message led by ``what``, for an id that is no str of valid
    Unicode, a malformed actor, or a trusted type (external content is marked with its
    source type).
    """
    if id is not None and (not isinstance(id, str) or not _encodable(id)):
        raise InvalidInputError(f"{what}: id must be a str of valid Unicode, got {id!r}")
    try:
        marked = Actor(type=actor, id=id, origin=origin)
    except ValidationError as exc:
        raise InvalidInputError(f"{what}: {exc.errors()[0]['msg']}") from exc
    if is_trusted(marked, trusted_extensions()):
        raise InvalidInputError(
            f"{what}: actor type {actor!r} is trusted; mark external content with its source "
            "type (slack, email, webhook, github, tool, …)"
        )
    return marked


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate: no journal can store it
        return False
    return True


def marked_actor(marking: object, *, where: str, how: str) -> Actor:
    """The actor a stored ``marking`` holds. Raises InvalidInputError naming ``where`` it was
    found and ``how`` to mark instead when it is not an actor."""
    try:
        return Actor.model_validate(marking)
    except ValidationError as exc:
        raise InvalidInputError(
            f"{where} is not an actor ({exc.errors()[0]['msg']}): {how}"
        ) from exc
