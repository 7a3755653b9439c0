"""The provider-neutral wire model: one type per concept, from a provider's bytes to the journal.

A :class:`NeutralRequest` is what the agent context model hands to rendering: the one
stable protocol system text, then the messages in projection order (session prefix first,
then history), the tools and the sampling settings. :func:`render_request` turns it into
the exact body bytes for one transport, through the renderer registered for it
(``contextfold.render`` registers the built-in ones on import). Rendering is pure (no clock,
environment, random source or id) and bodies are compact JSON in a fixed key order per
transport, so equal requests always give equal bytes.

A model's answer is a :class:`ModelOutput`. :class:`ToolCall`, :class:`ToolDefinition`,
:class:`OutputSchema` and :class:`Usage` are the one type each for a tool call, a tool
definition, a structured-output schema and token usage:
frozen pydantic models that journal events store as they are (their field names are the
journal schema), that providers' answers are parsed into, and that the transcript reads.

Token usage has one meaning for every provider: ``input_tokens`` is the whole prompt,
uncached, read from the cache and written to it; ``cached_input_tokens`` and
``cache_write_tokens`` are the parts of it read from and written to the provider's prompt
cache; ``output_tokens`` is every generated token, reasoning included, and
``reasoning_tokens`` the reasoning part of it. A breakdown is None when the provider does
not report it.

Raises `contextfold.errors.RenderError` (a ValueError) for a message or request that cannot
be rendered, naming the field at fault; the stored types raise pydantic's ValidationError
(a ValueError too) naming theirs, as events do.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from .canonical import canonical_json, check_json_value, loads, sha256_hex
from .errors import RenderError, UsageError

__all__ = [
    "IMAGE_MEDIA_TYPES",
    "TRANSPORTS",
    "ImagePart",
    "ItemRole",
    "JsonArray",
    "ModelOutput",
    "NeutralMessage",
    "NeutralRequest",
    "OutputSchema",
    "RenderedRequest",
    "Renderer",
    "Role",
    "ToolCall",
    "ToolDefinition",
    "Transport",
    "Usage",
    "WrittenArray",
    "body_size",
    "register_renderer",
    "render_body",
    "render_request",
]

Role = Literal["system", "developer", "user", "assistant", "tool"]
"""The role of a neutral message; each transport maps it to its wire roles."""

ItemRole = Literal["system", "developer", "user", "assistant"]
"""The role of a context item: a message role but ``tool`` (a tool result is an item with a
``tool_call_id``, whose message role trust decides)."""

Transport = Literal["openai-chat", "openai-responses", "anthropic"]
"""The wire formats a `NeutralRequest` renders to."""

TRANSPORTS: tuple[Transport, ...] = get_args(Transport)
"""Every supported transport, in a fixed order."""

_ROLES: frozenset[str] = frozenset(get_args(Role))


class _Stored(BaseModel):
    # Unknown fields are ignored on decode, like events: a payload written by a later
    # version with a new field still reads.
    model_config = ConfigDict(frozen=True, extra="ignore")


class ToolCall(_Stored):
    """One function call a model asked for; the answering tool result carries its id."""

    id: str = Field(min_length=1)
    """Provider call id (``tool_call_id`` of the answer)."""
    name: str = Field(min_length=1)
    """Name of the called tool."""
    arguments: str = ""
    """The arguments exactly as the model produced them (JSON object text; "" means {})."""


_NOT_TEXT = object()
"""What :func:`_schema_value` returns for a value that is neither a mapping nor text."""
_NOT_JSON = object()
"""What :func:`_schema_value` returns for text that is not JSON."""


def _schema_value(value: Any, where: str) -> Any:
    """A JSON schema given as a mapping (checked to be plain JSON) or as JSON text, as a
    value; :data:`_NOT_TEXT` for anything else, and :data:`_NOT_JSON` for text that is not
    JSON (the validators calling it raise)."""
    if isinstance(value, Mapping):
        check_json_value(dict(value), where=where)
        return dict(value)
    if isinstance(value, str):
        try:
            return loads(value)
        except ValueError:
            return _NOT_JSON
    return _NOT_TEXT


class ToolDefinition(_Stored):
    """A tool offered to the model, as a request header logs it and a request sends it.

    ``parameters`` is kept as canonical JSON text, so equal schemas compare and hash equal;
    build one from a schema mapping with :meth:`from_schema`.
    """

    name: str = Field(min_length=1)
    """Tool name as the model calls it."""
    description: str = ""
    """What the tool does, shown to the model."""
    parameters: str = "{}"
    """Canonical JSON text of the arguments' JSON schema: an object schema (``"type":
    "object"`` or no type), since every provider requires one. JSON text is canonicalized."""
    strict: bool = False
    """OpenAI strict schema adherence; sent explicitly on OpenAI, not sent to Anthropic."""

    @field_validator("parameters", mode="before")
    @classmethod
    def _canonical_object_schema(cls, value: Any, info: ValidationInfo) -> Any:
        where = f"tool {info.data.get('name')!r} parameters"
        schema = _schema_value(value, where)
        if schema is _NOT_TEXT:
            return value  # pydantic refuses it as not a string
        if schema is _NOT_JSON:
            raise ValueError(f"{where} are not JSON text")
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            raise ValueError(
                f'{where} must be a JSON object schema ("type": "object" or no type); '
                "every provider requires an object schema"
            )
        return canonical_json(schema).decode()

    @classmethod
    def from_schema(
        cls,
        *,
        name: str,
        description: str = "",
        parameters: Mapping[str, Any],
        strict: bool = False,
    ) -> ToolDefinition:
        """A definition from a JSON-schema mapping. Raises ValidationError when it is not an
        object schema of plain JSON."""
        return cls.model_validate(
            {"name": name, "description": description, "parameters": parameters, "strict": strict}
        )

    def arguments_schema(self) -> dict[str, Any]:
        """A fresh dict of the schema as sent; a missing ``"type"`` is sent as ``"object"``.

        Tool arguments are always an object, so the default changes no meaning, and it
        makes an empty schema (a tool without arguments) acceptable to every provider.
        """
        schema: dict[str, Any] = loads(self.parameters)
        schema.setdefault("type", "object")
        return schema


class OutputSchema(_Stored):
    """Structured output: the model's answer is JSON text matching ``json_schema``.

    Each transport sends it in its own form (OpenAI Responses ``text.format``, Chat
    Completions ``response_format``, both ``json_schema`` with the name and ``strict``;
    Anthropic ``output_config.format``, the schema alone). ``json_schema`` is kept as
    canonical JSON text, so equal schemas compare and hash equal.
    """

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    """The schema's name, as OpenAI requires one (letters, digits, ``_`` and ``-``)."""
    json_schema: str = "{}"
    """Canonical JSON text of the answer's JSON schema (a JSON object)."""
    strict: bool = False
    """OpenAI strict schema adherence; Anthropic always holds to the schema it is given."""

    @field_validator("json_schema", mode="before")
    @classmethod
    def _canonical_schema(cls, value: Any, info: ValidationInfo) -> Any:
        where = f"output schema {info.data.get('name')!r}"
        schema = _schema_value(value, where)
        if schema is _NOT_TEXT:
            return value  # pydantic refuses it as not a string
        if schema is _NOT_JSON:
            raise ValueError(f"{where} is not JSON text")
        if not isinstance(schema, dict):
            raise ValueError(f"{where} must be a JSON schema object, not {type(schema).__name__}")
        return canonical_json(schema).decode()

    @classmethod
    def from_schema(
        cls, *, name: str, schema: Mapping[str, Any], strict: bool = False
    ) -> OutputSchema:
        """An output schema from a JSON-schema mapping. Raises ValidationError when the name
        is not a schema name or the schema is not plain JSON."""
        return cls.model_validate({"name": name, "json_schema": schema, "strict": strict})

    def answer_schema(self) -> dict[str, Any]:
        """A fresh dict of the schema as sent."""
        value: dict[str, Any] = loads(self.json_schema)
        return value


class Usage(_Stored):
    """Token usage one model call reported, in the same terms for every provider.

    The breakdowns are parts of their totals: cache reads and writes of ``input_tokens``,
    reasoning of ``output_tokens``; None when the provider does not report them.
    """

    input_tokens: int = Field(default=0, ge=0)
    """The whole prompt: uncached tokens, cache reads and cache writes."""
    output_tokens: int = Field(default=0, ge=0)
    """Every generated token, reasoning included."""
    cached_input_tokens: int | None = Field(default=None, ge=0)
    """Of ``input_tokens``, those read from the provider's prompt cache."""
    cache_write_tokens: int | None = Field(default=None, ge=0)
    """Of ``input_tokens``, those written to the provider's prompt cache."""
    reasoning_tokens: int | None = Field(default=None, ge=0)
    """Of ``output_tokens``, those spent on reasoning."""

    @property
    def uncached_input_tokens(self) -> int:
        """Prompt tokens neither read from nor written to the cache (never below 0)."""
        cached = (self.cached_input_tokens or 0) + (self.cache_write_tokens or 0)
        return max(self.input_tokens - cached, 0)


IMAGE_MEDIA_TYPES: frozenset[str] = frozenset(
    {"image/png", "image/jpeg", "image/gif", "image/webp"}
)
"""The image types every transport sends as an image part (what Anthropic accepts)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ImagePart:
    """An image sent with a user message, after its text: inline base64 ``data`` or a ``url``
    (exactly one). Raises RenderError for another media type or both/neither source."""

    media_type: str
    """One of :data:`IMAGE_MEDIA_TYPES`."""
    data: str | None = None
    """The image's bytes, base64 encoded."""
    url: str | None = None
    """An http(s) URL the provider fetches the image from."""

    def __post_init__(self) -> None:
        if self.media_type not in IMAGE_MEDIA_TYPES:
            raise RenderError(
                f"ImagePart.media_type {self.media_type!r} is not one of "
                f"{sorted(IMAGE_MEDIA_TYPES)}"
            )
        if (self.data is None) == (self.url is None):
            raise RenderError("an ImagePart has exactly one of data and url")

    @property
    def data_url(self) -> str:
        """The image as one URL: ``url``, or a ``data:`` URL of the inline bytes."""
        return self.url if self.url is not None else f"data:{self.media_type};base64,{self.data}"


@dataclass(frozen=True, kw_only=True, slots=True)
class NeutralMessage:
    """One message of a neutral request, in projection order."""

    role: Role
    """Message role; trust was decided by the context model before rendering."""
    content: str
    """The rendered item text (header line and content); may be empty for tool-call turns."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Function calls requested by this message; only on ``assistant`` messages."""
    tool_call_id: str | None = None
    """The call this message answers; required on ``tool`` messages, absent otherwise."""
    cache_breakpoint: bool = False
    """True on the last message of a stable prefix segment (e.g. the session prefix)."""
    images: tuple[ImagePart, ...] = ()
    """Images sent after the text, as the transport's image parts; only on ``user`` messages."""

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise RenderError(f"NeutralMessage.role {self.role!r} is not one of {sorted(_ROLES)}")
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        if not isinstance(self.images, tuple):
            object.__setattr__(self, "images", tuple(self.images))
        if self.images and self.role != "user":
            raise RenderError(f"a {self.role} message cannot carry images; only user")
        if self.tool_calls and self.role != "assistant":
            raise RenderError(f"a {self.role} message cannot carry tool_calls; only assistant")
        if self.role == "tool" and not self.tool_call_id:
            raise RenderError("a tool message needs the tool_call_id of the call it answers")
        if self.role != "tool" and self.tool_call_id is not None:
            raise RenderError(f"a {self.role} message cannot carry tool_call_id; only tool")


@dataclass(frozen=True, kw_only=True, slots=True)
class NeutralRequest:
    """A provider-neutral model request: what the context model hands to rendering."""

    model: str
    """Provider model name, sent as is."""
    system: str
    """The one stable protocol system text, always rendered first ("" renders none)."""
    messages: tuple[NeutralMessage, ...]
    """Session prefix then history, in projection order (authoritative)."""
    tools: tuple[ToolDefinition, ...] = ()
    """Tools offered to the model, in this order; names must be unique."""
    max_tokens: int | None = None
    """Output token limit; required by Anthropic, omitted on OpenAI when None."""
    temperature: float | None = None
    """Sampling temperature; omitted when None, never sent to Anthropic (it refuses it)."""
    stream: bool = False
    """Ask the provider for a server-sent event stream."""
    output_schema: OutputSchema | None = None
    """Structured output: the answer is JSON text matching this schema (None: free text)."""

    def __post_init__(self) -> None:
        if not self.model:
            raise RenderError("NeutralRequest.model is empty")
        if not isinstance(self.messages, tuple):
            object.__setattr__(self, "messages", tuple(self.messages))
        if not isinstance(self.tools, tuple):
            object.__setattr__(self, "tools", tuple(self.tools))
        names = [tool.name for tool in self.tools]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise RenderError(f"NeutralRequest.tools: duplicate tool names {dupes}")
        if self.max_tokens is not None and (
            isinstance(self.max_tokens, bool) or self.max_tokens < 1
        ):
            raise RenderError(
                f"NeutralRequest.max_tokens must be a positive int or None, not {self.max_tokens!r}"
            )
        if self.temperature is not None and not math.isfinite(self.temperature):
            raise RenderError(
                f"NeutralRequest.temperature must be finite, not {self.temperature!r}"
            )


@dataclass(frozen=True, kw_only=True, slots=True)
class RenderedRequest:
    """The exact wire body of one request for one transport."""

    transport: Transport
    """The transport the body was rendered for."""
    body: bytes
    """Compact JSON bytes in the transport's fixed key order: send these bytes unchanged."""
    sha256: str = field(default="")
    """Hex SHA-256 of `body`; computed when not given."""
    _written: WrittenArray | None = field(default=None, init=False, compare=False, repr=False)
    # What render_request(previous=this) reuses: set by render_request only (a copy made
    # with dataclasses.replace has none, so it never describes another body).

    def __post_init__(self) -> None:
        digest = sha256_hex(self.body)
        if self.sha256 and self.sha256 != digest:
            raise RenderError(f"RenderedRequest.sha256 {self.sha256!r} does not match the body")
        object.__setattr__(self, "sha256", digest)

    def json(self) -> dict[str, Any]:
        """A fresh parsed dict of the body (e.g. ``client.messages.create(**r.json())``)."""
        parsed: dict[str, Any] = loads(self.body)
        return parsed


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelOutput:
    """What a model returned: text, tool calls, usage and why it stopped."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None
    """What the provider reported; None when it reported nothing (a stream without a usage
    chunk), recorded as not reported, never as zero tokens."""
    finish_reason: str = "stop"
    """The provider's own stop reason (``"stop"``, ``"tool_calls"``, ``"end_turn"``…)."""
    reasoning: str = ""
    response_id: str | None = field(default=None, compare=False)
    """The provider's id of this answer, when it gave one (for telemetry; not recorded)."""
    response_model: str | None = field(default=None, compare=False)
    """The model the provider says answered, when it said (for telemetry; not recorded)."""

    def __post_init__(self) -> None:
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))


@dataclass(frozen=True, slots=True)
class JsonArray:
    """A JSON array whose elements a renderer serialized itself, each compact JSON of strings
    only (so nothing in it is unchecked: no float to be non-finite): written into a body as
    the elements are, and measured without being written. ``size``: its bytes."""

    elements: tuple[orjson.Fragment, ...]
    size: int
    kept: object = field(default=None, compare=False, repr=False)
    """What the renderer keeps to serialize a later array from this one, once it is written
    (its own value: handed back to it in a :class:`WrittenArray`, never read here)."""


@dataclass(frozen=True, slots=True)
class WrittenArray:
    """A renderer's :class:`JsonArray` as written at the end of a body: its bytes are
    ``body[at:at + size]``, and ``kept`` is what the renderer kept with it."""

    body: bytes
    at: int
    kept: object


class Renderer(Protocol):
    """A transport's body builder: a pure function from a request to a fresh dict whose key
    insertion order is the wire order, its values JSON or a :class:`JsonArray` the renderer
    serialized itself. ``previous`` is the array of an earlier body for the same transport
    (see :func:`render_request`): the renderer may copy what the two requests share from it,
    and gives the bytes it gives without it. Raises RenderError for what the transport
    cannot send."""

    def __call__(
        self, request: NeutralRequest, previous: WrittenArray | None = None, /
    ) -> dict[str, Any]: ...


_RENDERERS: dict[str, Renderer] = {}


def register_renderer(transport: Transport, renderer: Renderer) -> None:
    """Make ``renderer`` the body builder of ``transport``.

    Raises RenderError for an unknown transport, or when another renderer already has it:
    a recorded request must rebuild through the renderer it was sent with.
    """
    if transport not in TRANSPORTS:
        raise RenderError(f"unknown transport {transport!r}; expected one of {list(TRANSPORTS)}")
    known = _RENDERERS.get(transport)
    if known is not None and known is not renderer:
        raise RenderError(f"transport {transport!r} already has a renderer")
    _RENDERERS[transport] = renderer


def render_request(
    request: NeutralRequest, transport: Transport, *, previous: RenderedRequest | None = None
) -> RenderedRequest:
    """Render ``request`` for ``transport``, its body hashed. Pure: equal requests give equal
    bytes, with or without ``previous``.

    ``previous``: an earlier request rendered by this function (for an agent, the one it
    sent last). The messages the two requests begin with are copied from its body instead
    of serialized again (``render.assembly``), so a request extending it costs its new
    messages. One rendered for another transport is not used.

    Raises RenderError when the transport is unknown or the request cannot be sent on it.
    """
    written = None
    if previous is not None and previous.transport == transport:
        written = previous._written
    body = _renderer(transport)(request, written)
    data = _encode(body, transport)
    rendered = RenderedRequest(transport=transport, body=data)
    # Dict order is write order: a JsonArray last in the body ends just before its "}".
    last = next(reversed(body.values()), None)
    if isinstance(last, JsonArray) and last.kept is not None:
        kept = WrittenArray(data, len(data) - 1 - last.size, last.kept)
        object.__setattr__(rendered, "_written", kept)
    return rendered


def render_body(request: NeutralRequest, transport: Transport) -> bytes:
    """The exact body bytes of ``request`` for ``transport`` (not hashed). Raises as
    :func:`render_request`."""
    # Insertion order, not sorted keys: each transport builds its body in the provider's
    # read order with the history last, so consecutive requests share a byte prefix as
    # long as their content does. Building is pure, so this is as deterministic as sorting.
    return _encode(_renderer(transport)(request), transport)


def body_size(request: NeutralRequest, transport: Transport) -> int:
    """``len(render_body(request, transport))``, without writing what the renderer
    serialized itself (a :class:`JsonArray` is measured). Raises as :func:`render_request`."""
    body = _renderer(transport)(request)
    arrays = [value for value in body.values() if isinstance(value, JsonArray)]
    if not arrays:
        return len(_encode(body, transport))
    empty: dict[str, Any] = {k: [] if isinstance(v, JsonArray) else v for k, v in body.items()}
    written = len(_encode(empty, transport)) - len(b"[]") * len(arrays)
    return written + sum(array.size for array in arrays)


def _renderer(transport: Transport) -> Renderer:
    renderer = _RENDERERS.get(transport)
    if renderer is None:
        raise RenderError(
            f"unknown transport {transport!r}; expected one of {list(TRANSPORTS)} "
            "(import contextfold.render to register the built-in renderers)"
        )
    return renderer


def _encode(body: dict[str, Any], transport: Transport) -> bytes:
    """The compact JSON of ``body``, checked in the one encode: orjson refuses every
    non-JSON value but non-finite floats, which it writes as ``null``; only a body whose
    bytes hold a ``null`` is checked for them, in C, and walked only to name the fault."""
    where = f"{transport} body"
    # What a renderer serialized itself (a JsonArray) is neither scanned nor checked again.
    written = {k: v for k, v in body.items() if not isinstance(v, JsonArray)}
    try:
        data = orjson.dumps(body, default=_elements, option=orjson.OPT_PASSTHROUGH_DATACLASS)
        if b"null" in (data if len(written) == len(body) else orjson.dumps(written)):
            json.dumps(written, allow_nan=False, check_circular=False)
    except (TypeError, ValueError) as exc:
        try:
            check_json_value(written, where=where)  # names the field at fault
        except ValueError as named:
            raise RenderError(f"{transport} body is not plain JSON: {named}") from named
        raise RenderError(f"{transport} body is not plain JSON: {where}: {exc}") from exc
    return data


def _elements(value: Any) -> tuple[orjson.Fragment, ...]:
    """A JsonArray's elements, for orjson to copy into the body as they are (the tuple
    itself: orjson writes a tuple as an array, so no copy of the elements is made)."""
    if isinstance(value, JsonArray):
        return value.elements
    # orjson's default protocol: a TypeError it turns into its own (caught in _encode).
    raise UsageError(f"Type is not JSON serializable: {type(value).__name__}")
