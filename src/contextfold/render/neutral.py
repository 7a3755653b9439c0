"""The provider-neutral request and its deterministic wire bodies.

A `NeutralRequest` is what the agent context model hands to rendering: the one stable
protocol system text, then the messages in projection order (session prefix first,
then history), the tools and the sampling settings. `render_request` turns it into the
exact body bytes for one transport; the same request always gives the same bytes,
because rendering is a pure function (no clock, environment, random source or id) and
bodies are compact JSON with keys in a fixed order per transport: what never changes
first (model, tools, system), the growing history last.

Trust is decided before rendering (the context model maps external actors to ``user``);
each transport still enforces that user and tool content never reaches the wire with
system or developer precedence. Tool pairing is checked here for every transport: each
tool call must be answered by exactly one later ``tool`` message and every result must
answer an earlier call; results are moved up to directly follow their call (messages
that arrived in between keep their order after the results), which is what every
provider requires.

Raises `contextfold.errors.RenderError` (a ValueError) for anything that cannot be
rendered, naming the message index, tool call id or field at fault.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from contextfold.canonical import canonical_json, check_json_value, dumps, loads, sha256_hex
from contextfold.errors import RenderError

__all__ = [
    "TRANSPORTS",
    "NeutralMessage",
    "NeutralRequest",
    "RenderedRequest",
    "Role",
    "ToolCall",
    "ToolSpec",
    "Transport",
    "order_tool_results",
    "render_body",
    "render_request",
]

Role = Literal["system", "developer", "user", "assistant", "tool"]
"""Product roles of a neutral message; each transport maps them to its wire roles."""

Transport = Literal["openai-chat", "openai-responses", "anthropic"]
"""The wire formats a `NeutralRequest` renders to."""

TRANSPORTS: tuple[Transport, ...] = get_args(Transport)
"""Every supported transport, in a fixed order."""

_ROLES: frozenset[str] = frozenset(get_args(Role))


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolCall:
    """One function call requested by an assistant message."""

    id: str
    """Provider call id; the answering ``tool`` message carries it as ``tool_call_id``."""
    name: str
    """Name of the called tool."""
    arguments: str
    """The call's arguments as the JSON text the model produced (an object; "" means {})."""

    def __post_init__(self) -> None:
        if not self.id:
            raise RenderError("ToolCall.id is empty: give every tool call its provider call id")
        if not self.name:
            raise RenderError(f"ToolCall {self.id!r}: name is empty")


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolSpec:
    """A tool offered to the model; immutable and hashable.

    Build it with `ToolSpec.from_schema` from a JSON-schema mapping; the schema is kept
    as canonical JSON bytes so equal schemas compare and hash equal.
    """

    name: str
    """Tool name as the model calls it."""
    description: str
    """What the tool does, shown to the model."""
    parameters_json: bytes
    """Canonical JSON bytes of the JSON schema of the tool's arguments (an object schema)."""
    strict: bool = False
    """OpenAI strict schema adherence; sent explicitly on OpenAI, not sent to Anthropic."""

    def __post_init__(self) -> None:
        if not self.name:
            raise RenderError("ToolSpec.name is empty")
        try:
            schema = loads(self.parameters_json)
        except ValueError as exc:
            raise RenderError(f"ToolSpec {self.name!r}: parameters_json is not JSON") from exc
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            raise RenderError(
                f"ToolSpec {self.name!r}: parameters must be a JSON object schema "
                '("type": "object" or no type); every provider requires an object schema'
            )
        if canonical_json(schema) != self.parameters_json:
            raise RenderError(
                f"ToolSpec {self.name!r}: parameters_json is not canonical JSON; "
                "build the spec with ToolSpec.from_schema"
            )

    @classmethod
    def from_schema(
        cls,
        *,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        strict: bool = False,
    ) -> ToolSpec:
        """A spec from a JSON-schema mapping. Raises RenderError if it is not plain JSON."""
        try:
            check_json_value(dict(parameters), where=f"tool {name!r} parameters")
            data = canonical_json(dict(parameters))
        except ValueError as exc:
            raise RenderError(str(exc)) from exc
        return cls(name=name, description=description, parameters_json=data, strict=strict)

    def parameters(self) -> dict[str, Any]:
        """A fresh dict of the schema as sent; a missing ``"type"`` is sent as ``"object"``.

        Tool arguments are always an object, so the default changes no meaning, and it
        makes an empty schema (a tool without arguments) acceptable to every provider.
        """
        schema: dict[str, Any] = loads(self.parameters_json)
        schema.setdefault("type", "object")
        return schema


@dataclass(frozen=True, kw_only=True, slots=True)
class NeutralMessage:
    """One message of a neutral request, in projection order."""

    role: Role
    """Product role; trust was decided by the context model before rendering."""
    content: str
    """The rendered item text (header line and content); may be empty for tool-call turns."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Function calls requested by this message; only on ``assistant`` messages."""
    tool_call_id: str | None = None
    """The call this message answers; required on ``tool`` messages, absent otherwise."""
    cache_breakpoint: bool = False
    """True on the last message of a stable prefix segment (e.g. the session prefix)."""

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise RenderError(f"NeutralMessage.role {self.role!r} is not one of {sorted(_ROLES)}")
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
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
    tools: tuple[ToolSpec, ...] = ()
    """Tools offered to the model, in this order; names must be unique."""
    max_tokens: int | None = None
    """Output token limit; required by Anthropic, omitted on OpenAI when None."""
    temperature: float | None = None
    """Sampling temperature; omitted when None, never sent to Anthropic (it refuses it)."""
    stream: bool = False
    """Ask the provider for a server-sent event stream."""

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

    def __post_init__(self) -> None:
        digest = sha256_hex(self.body)
        if self.sha256 and self.sha256 != digest:
            raise RenderError(f"RenderedRequest.sha256 {self.sha256!r} does not match the body")
        object.__setattr__(self, "sha256", digest)

    def json(self) -> dict[str, Any]:
        """A fresh parsed dict of the body (e.g. ``client.messages.create(**r.json())``)."""
        parsed: dict[str, Any] = loads(self.body)
        return parsed


def order_tool_results(messages: tuple[NeutralMessage, ...]) -> tuple[NeutralMessage, ...]:
    """Messages with each call's result moved to directly follow its assistant message.

    Results keep their relative order; messages between a call and its result keep
    their order after the results. Raises RenderError naming the tool_call_id when a
    call is unanswered, a result answers no earlier call, or an id is used twice.
    """
    call_at: dict[str, int] = {}
    for index, message in enumerate(messages):
        for call in message.tool_calls:
            if call.id in call_at:
                raise RenderError(
                    f"tool_call_id {call.id!r} is used by two calls "
                    f"(messages {call_at[call.id]} and {index}); call ids must be unique"
                )
            call_at[call.id] = index
    results: dict[int, list[int]] = {}
    answered: dict[str, int] = {}
    for index, message in enumerate(messages):
        if message.role != "tool":
            continue
        call_id = message.tool_call_id
        assert call_id is not None  # NeutralMessage guarantees it for role tool
        if call_id not in call_at or call_at[call_id] > index:
            raise RenderError(
                f"message {index}: tool result for tool_call_id {call_id!r} answers no "
                "earlier tool call; append the assistant call before its result"
            )
        if call_id in answered:
            raise RenderError(
                f"tool_call_id {call_id!r} is answered twice (messages "
                f"{answered[call_id]} and {index}); keep exactly one result per call"
            )
        answered[call_id] = index
        results.setdefault(call_at[call_id], []).append(index)
    unanswered = [call_id for call_id in call_at if call_id not in answered]
    if unanswered:
        raise RenderError(
            f"tool_call_id {unanswered[0]!r} (message {call_at[unanswered[0]]}) has no tool "
            "result; answer every tool call before requesting the model"
        )
    ordered: list[NeutralMessage] = []
    for index, message in enumerate(messages):
        if message.role == "tool":
            continue
        ordered.append(message)
        ordered.extend(messages[i] for i in results.get(index, ()))
    return tuple(ordered)


def render_request(request: NeutralRequest, transport: Transport) -> RenderedRequest:
    """Render `request` for `transport`. Pure: equal requests give equal bytes."""
    # Imported here: the transport modules import this module's data model.
    from contextfold.render import anthropic, openai_chat, openai_responses

    if transport == "openai-chat":
        body = openai_chat.render_openai_chat(request)
    elif transport == "openai-responses":
        body = openai_responses.render_openai_responses(request)
    elif transport == "anthropic":
        body = anthropic.render_anthropic(request)
    else:
        raise RenderError(f"unknown transport {transport!r}; expected one of {list(TRANSPORTS)}")
    try:
        # Insertion order, not sorted keys: each transport builds its body in the
        # provider's read order with the history last, so consecutive requests share a
        # byte prefix as long as their content does. Building is pure, so this is as
        # deterministic as sorting.
        check_json_value(body, where=f"{transport} body")
        data = dumps(body)
    except ValueError as exc:
        raise RenderError(f"{transport} body is not plain JSON: {exc}") from exc
    return RenderedRequest(transport=transport, body=data)


def render_body(request: NeutralRequest, transport: Transport) -> bytes:
    """The exact body bytes of `request` for `transport`."""
    return render_request(request, transport).body
