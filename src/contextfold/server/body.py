"""Request bodies and query values: read within a size limit, parsed strictly.

Parsing happens before anything is written, so a malformed request never stores a
thing: the body must be one JSON object with only the documented fields (no repeated
key, no integer beyond 64 bits, meta strings of at most :data:`MAX_META_CHARS`), and an
event of a type this process knows (``contextfold.agent/context-added``, …) must
validate against its Event class. What the writer may append is :mod:`.writers`' rule;
an event is stored as sent, except the http actor stamped on an external writer's
actorless items.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, get_args, get_origin

import orjson
from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from ..context.events import ContextAdded
from ..errors import InvalidInputError, PayloadError, StrictJsonError, UnknownEventTypeError
from ..events import TYPE_NAME, Event, RawEvent, event_class
from ..journal.encode import MAX_META_CHARS, check_meta, check_namespace
from . import strict_json
from .errors import BodyTooLargeError, ForbiddenError, RequestBodyError, UnsupportedMediaTypeError
from .writers import ANONYMOUS, Writer, check_item, check_meta_actor, check_type

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "MAX_META_CHARS",
    "NAMESPACE_HEADER",
    "NAMESPACE_HEADER_PATTERN",
    "AppendRequest",
    "check_query",
    "parse_append",
    "query_int",
    "read_json",
    "request_namespace",
    "resolve_namespace",
]

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024

_APPEND_FIELDS = frozenset({"events", "expected_version", "idempotency_key", "run_id", "actor"})
_EVENT_FIELDS = frozenset({"type", "payload"})
_MAX_TYPE_NAME = 200


@dataclass(frozen=True, slots=True)
class AppendRequest:
    """A parsed ``POST …/events`` body."""

    events: tuple[RawEvent, ...]
    expected_version: int | None = None
    idempotency_key: str | None = None
    run_id: str | None = None
    actor: str | None = None


async def read_json(request: Request, *, max_bytes: int) -> Any:
    """The request body parsed as JSON. Raises UnsupportedMediaTypeError unless the content
    type is JSON, BodyTooLargeError past ``max_bytes`` (without reading further), and
    RequestBodyError for a body that is not JSON."""
    media_type = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    # Requiring JSON also makes browsers preflight cross-site posts, which this server
    # never approves: a web page cannot append to a local journal behind the user's back.
    if media_type != "application/json":
        raise UnsupportedMediaTypeError(
            f"the body must be sent as Content-Type: application/json, not {media_type or 'none'!r}"
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLargeError(_too_large(int(declared), max_bytes))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise BodyTooLargeError(_too_large(size, max_bytes))
        chunks.append(chunk)
    try:
        return strict_json.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise RequestBodyError(f"the body is not valid JSON: {exc}") from None
    except StrictJsonError as exc:
        raise RequestBodyError(f"the body is refused at {exc}; nothing was written") from None


def _too_large(size: int, limit: int) -> str:
    return (
        f"the body is {size} bytes or more, over the server's limit of {limit}: "
        "split the events over several appends"
    )


def parse_append(body: Any, writer: Writer = ANONYMOUS) -> AppendRequest:
    """The append request in ``body`` from ``writer``. Raises RequestBodyError naming the
    field at fault, PayloadError for a payload its registered Event class rejects.

    What an external (not trusted) writer may not append, and the actor stamped on its
    actorless items, are :mod:`.writers`' rules. A body ``actor`` needs every
    ``context-added`` payload to name its actor too: the payload's actor, not the body's,
    decides the wire role."""
    fields = _object(body, "the body", _APPEND_FIELDS)
    raw_events = fields.get("events")
    if not isinstance(raw_events, list) or not raw_events:
        raise RequestBodyError('"events" must be a non-empty list of {"type", "payload"} objects')
    strings = {}
    for name in ("idempotency_key", "run_id", "actor"):
        try:  # the journal's own check, before any event is parsed
            strings[name] = check_meta(f'"{name}"', fields.get(name), empty=False)
        except InvalidInputError as exc:
            raise RequestBodyError(str(exc)) from None
    body_actor = fields.get("actor")
    check_meta_actor(body_actor, writer)
    events = tuple(
        _event(index, item, writer=writer, body_actor=body_actor)
        for index, item in enumerate(raw_events)
    )
    return AppendRequest(events, _expected_version(fields.get("expected_version")), **strings)


def _expected_version(value: object) -> int | None:
    """The body's ``expected_version``: an int from 0 to 2**63 - 1, or a number equal to
    one (JSON Schema, and so a client's validator, counts 0.0 as the integer 0)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value is None or (
        isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**63
    ):
        return value
    raise RequestBodyError(f'"expected_version" must be an int from 0 to 2**63 - 1, got {value!r}')


def _object(value: Any, where: str, allowed: frozenset[str]) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise RequestBodyError(f"{where} must be a JSON object, got {_json_kind(value)}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise RequestBodyError(
            f"{where} has unknown field(s) {', '.join(map(repr, unknown))}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )
    return value


def _event(index: int, item: Any, *, writer: Writer, body_actor: object) -> RawEvent:
    where = f"events[{index}]"
    fields = _object(item, where, _EVENT_FIELDS)
    type_name = fields.get("type")
    if not isinstance(type_name, str) or not type_name:
        raise RequestBodyError(f'{where}."type" must be a non-empty string, got {type_name!r}')
    # The journal takes any raw type name; over HTTP only names a Python Event could declare
    # (ASCII letters, digits and . _ : / @ + -), so no look-alike of a reserved prefix.
    if not TYPE_NAME.fullmatch(type_name):
        raise RequestBodyError(
            f'{where}."type" {type_name[:40]!r} must be 1-{_MAX_TYPE_NAME} characters of '
            "ASCII letters, digits and . _ : / @ + -, starting with a letter or digit"
        )
    if "payload" not in fields:
        raise RequestBodyError(f'{where} has no "payload" (send {{}} for an empty one)')
    payload = fields["payload"]
    check_type(where, type_name, writer)
    cls: type[Event] | None
    try:
        cls = event_class(type_name)
    except UnknownEventTypeError:
        cls = None  # a type of the user's own, unknown here: stored as sent
    if cls is not None:
        try:
            event = cls.model_validate(payload)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(part) for part in first["loc"]) or "payload"
            raise PayloadError(
                f"{where} ({type_name}): {loc}: {first['msg']}; nothing was written"
            ) from None
        # The classes ignore unknown fields on decode (old rows still fold), but a client
        # sending one now has made a mistake (``actr`` for ``actor``) that would silently
        # drop what it meant: refuse it.
        unknown = _unknown_keys(cls, payload, f"{where}.payload")
        if unknown:
            raise RequestBodyError(
                f"{where} ({type_name}) has unknown payload field(s) {', '.join(unknown)}; "
                "nothing was written"
            )
        if isinstance(event, ContextAdded):
            payload = check_item(where, event, payload, writer, body_actor=body_actor)
    return RawEvent(type_name, payload)


def _unknown_keys(model: type[BaseModel], value: Any, where: str) -> list[str]:
    """Paths of the keys in ``value`` (JSON of ``model``) that no field of it declares,
    nested models included."""
    if not isinstance(value, dict):
        return []
    known: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        known[name] = info.annotation
        if info.alias:
            known[info.alias] = info.annotation
    found = [f"{where}.{key}" for key in value if key not in known]
    for key, item in value.items():
        nested = _model_of(known.get(key))
        if nested is None or item is None:
            continue
        if isinstance(item, list):
            for i, element in enumerate(item):
                found += _unknown_keys(nested, element, f"{where}.{key}[{i}]")
        else:
            found += _unknown_keys(nested, item, f"{where}.{key}")
    return found


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The one pydantic model an annotation holds (``X``, ``X | None``, ``tuple[X, ...]``),
    else None (unions of several models are not walked)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = get_origin(annotation)
    if origin is None or (isinstance(origin, type) and issubclass(origin, Mapping)):
        return None  # a mapping's keys are data, not field names
    models = {m for arg in get_args(annotation) if (m := _model_of(arg)) is not None}
    return models.pop() if len(models) == 1 else None


def _json_kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", str: "a string", list: "a list", dict: "an object"}.get(
        type(value), "a number"
    )


def check_query(request: Request, allowed: Collection[str]) -> None:
    """Raise InvalidInputError naming a query parameter the route does not take (a typo
    would otherwise be ignored and the answer look right), or one given twice."""
    seen: set[str] = set()
    for name, _ in request.query_params.multi_items():
        if name not in allowed:
            raise InvalidInputError(
                f"unknown query parameter {name[:80]!r}: this route takes "
                f"{', '.join(sorted(allowed))}"
            )
        if name in seen:
            raise InvalidInputError(f"query parameter {name!r} is given twice: send it once")
        seen.add(name)


def query_int(request: Request, name: str, *, default: int, low: int, high: int) -> int:
    """The integer query parameter ``name`` within ``low..high``; InvalidInputError otherwise."""
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not raw.isascii() or not raw.isdigit() or not low <= int(raw) <= high:
        raise InvalidInputError(
            f"query parameter {name}={raw!r} must be an int from {low} to {high}"
        )
    return int(raw)


NAMESPACE_HEADER = "x-contextfold-namespace"
NAMESPACE_HEADER_PATTERN = "^[!-~](?:[ -~]*[!-~])?$"
"""What a namespace header may hold: printable ASCII without edge spaces (a header value
reaches the server as latin-1 bytes, so no other character would arrive as it was sent)."""


def request_namespace(request: Request, default: str) -> str:
    """The namespace of a request: the ``X-Contextfold-Namespace`` header, else the
    ``namespace`` query parameter (an ``EventSource`` cannot send headers), else ``default``.
    Raises InvalidInputError when both are given and differ."""
    header = request.headers.get(NAMESPACE_HEADER)
    query = request.query_params.get("namespace")
    if header is not None and re.fullmatch(NAMESPACE_HEADER_PATTERN, header) is None:
        raise InvalidInputError(
            f"the X-Contextfold-Namespace header {header[:80]!r} must be 1 or more printable "
            "ASCII characters: a header cannot carry other characters as they were sent "
            "(a live stream also takes the namespace query parameter)"
        )
    if header is not None and query is not None and header != query:
        raise InvalidInputError(
            f"the namespace header says {header!r} and the namespace query parameter "
            f"{query!r}: send one of them"
        )
    chosen = header if header is not None else query
    return default if chosen is None else chosen


def resolve_namespace(request: Request, default: str, allowed: frozenset[str] | None) -> str:
    """The checked namespace of a request (:func:`request_namespace`): InvalidInputError
    (400) for a malformed name, ForbiddenError (403) for one outside ``allowed`` (None:
    any namespace is served)."""
    namespace = check_namespace(request_namespace(request, default))
    if allowed is not None and namespace not in allowed:
        raise ForbiddenError(f"this server does not serve namespace {namespace!r}")
    return namespace
