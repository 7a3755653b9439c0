"""The events of the agent context model: what the journal records about a model's context.

Everything the model can see enters through :class:`ContextAdded`. The other events
record the request lifecycle: :class:`LlmRequestRequested` publishes the projection
and logs the request header snapshot (so a request can be rebuilt byte for byte),
:class:`LlmResponse` and :class:`ToolCallResult` are the raw evidence of a model answer
and a tool execution, :class:`ToolCallStarted` records that a tool was about to run (so a
tool call runs at most once by record), :class:`LlmRequestInterrupted` records a cancelled
request.
The evidence events are not projected: the runtime appends the model-visible part as a
``ContextAdded`` in the same append (see :func:`assistant_item` and :func:`tool_result_item`).

All models are frozen; sequences are tuples. Field names are the journal schema. Tool
calls, tool definitions and usage are the wire model's own types (`contextfold.wire`),
stored as they are.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from ..events import Event
from ..wire import ItemRole, OutputSchema, ToolCall, ToolDefinition, Transport, Usage

__all__ = [
    "BUILTIN_ACTOR_TYPES",
    "HEADER_START",
    "Actor",
    "CompactionMeta",
    "ContextAdded",
    "FileAttachment",
    "LlmRequestInterrupted",
    "LlmRequestPolicy",
    "LlmRequestRequested",
    "LlmResponse",
    "PrefixMessage",
    "Ref",
    "RequestHeader",
    "ToolCallResult",
    "ToolCallStarted",
    "assistant_item",
    "tool_result_item",
]

_ACTOR_TYPE = re.compile(r"^[a-z][a-z0-9_.-]{0,63}$")

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
    "http": False,
}
"""The known actor types and whether each is trusted with instruction precedence (fixed;
``trust.register_actor_type`` adds others)."""
HEADER_START = re.compile(r"^@[0-9]")
"""How an item header line starts; request-only text (prefix, system prompt) must not."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class Actor(_Frozen):
    """Who supplied an item, independent of its role.

    ``type`` is one of :data:`BUILTIN_ACTOR_TYPES` or any other token (added with
    ``trust.register_actor_type``). Another type is trusted only by a request whose
    header lists it in ``trusted_actor_types``; elsewhere it is untrusted.
    """

    type: str
    """Actor type: a lowercase token (``[a-z][a-z0-9_.-]*``), rendered as ``actor=<type>``."""
    id: str | None = None
    """Identity within the type (a Slack user id, an agent id, an email address)."""
    origin: str | None = None
    """The surface it came through (``"web"``, a channel, a repository); not rendered."""

    @field_validator("type")
    @classmethod
    def _check_type(cls, value: str) -> str:
        if not _ACTOR_TYPE.match(value):
            raise ValueError(
                f"actor type {value!r} must be a lowercase token of letters, digits and . _ - "
                "(1-64 characters, starting with a letter)"
            )
        return value


class Ref(_Frozen):
    """A pointer to a richer source (an event or an object), rendered ``path@offset``."""

    path: str = Field(min_length=1)
    """Stream path or object path (``/integrations/github/main``)."""
    offset: int | None = Field(default=None, ge=1)
    """Event offset in that stream, when the ref names one event."""
    type: str = "event"
    """What is referenced: ``"event"`` or an object kind."""
    event_type: str | None = None
    """The referenced event's type name, for readers; not rendered."""

    def render(self) -> str:
        return self.path if self.offset is None else f"{self.path}@{self.offset}"


class FileAttachment(_Frozen):
    """A file attached to an item: named in its text (``[File attached: cat.png
    (image/png)]``), listed by reference in its header (``files=[uri, ...]``) unless inline,
    and sent as an image part when it is an image with data or a URL (``context.attachments``).
    """

    uri: str = Field(min_length=1)
    """Where the file is: any URI, a ``data:`` URI (inline base64 data) or an http(s) URL."""
    media_type: str | None = None
    name: str | None = None


class LlmRequestPolicy(_Frozen):
    """Whether an item wakes the model: the scheduler reads it, the projection does not.

    ``none``: context only, no request. ``after-current-request``: request once the
    running request (if any) is done. ``interrupt``: cancel the running request and
    request again.
    """

    behaviour: Literal["none", "after-current-request", "interrupt"] = "after-current-request"


class CompactionMeta(_Frozen):
    """Marks a developer item as a compaction summary. Never rendered to the model."""

    replaces_history_through: int = Field(ge=1)
    """Offset of the summarized request: history at or below it is replaced."""
    usage: Usage | None = None
    """The summarizer call's usage, when the provider reported it."""
    attempt: int = Field(default=1, ge=1)
    """Compactions in a row whose next request stayed over the threshold, this one included."""


class ContextAdded(Event, type="contextfold.agent/context-added"):
    """One item of model-visible context; the only way content reaches the model.

    ``key`` names an updatable slot (not append idempotency). An assistant item may
    carry ``tool_calls``; they are executable only when ``llm_request_offset`` is the
    offset of a real request in the stream. An item with ``tool_call_id`` is a tool
    result (role developer or user). ``compaction`` marks a summary (role developer).
    Invalid combinations raise a ValidationError naming the field.
    """

    role: ItemRole
    content: str = ""
    actor: Actor | None = None
    refs: tuple[Ref, ...] = ()
    key: str | None = Field(default=None, min_length=1)
    files: tuple[FileAttachment, ...] = ()
    llm_request_policy: LlmRequestPolicy | None = None
    compaction: CompactionMeta | None = None
    llm_request_offset: int | None = Field(default=None, ge=1)
    """For assistant items: the request whose answer this is."""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def _check_shape(self) -> ContextAdded:
        if self.role != "assistant" and (self.tool_calls or self.llm_request_offset is not None):
            raise ValueError(
                f"tool_calls and llm_request_offset belong on assistant items, not {self.role}"
            )
        if self.tool_call_id is not None and self.role not in ("developer", "user"):
            raise ValueError(
                f"a tool result (tool_call_id) has role developer or user, not {self.role}"
            )
        if self.compaction is not None and (
            self.role != "developer" or self.key is not None or self.tool_call_id is not None
        ):
            raise ValueError(
                "a compaction summary is an unkeyed developer item without tool_call_id"
            )
        return self


class PrefixMessage(_Frozen):
    """A request-only session prefix message, logged in the request header.

    Its text must not start with an item header (``@<digit>``): only items have headers.
    Roles are those ``render.prefix`` composes (no system: the prefix follows it).
    """

    role: Literal["developer", "user", "assistant"]
    content: str

    @field_validator("content")
    @classmethod
    def _no_header(cls, value: str) -> str:
        if HEADER_START.match(value):
            raise ValueError("session prefix text must not start like an item header (@<digit>)")
        return value


class RequestHeader(_Frozen):
    """The non-history half of a request: everything besides the projection it renders."""

    transport: Transport
    model: str = Field(min_length=1)
    system_prompt: str | None = None
    """Rendered as the first system message, after the protocol text."""
    session_prefix: tuple[PrefixMessage, ...] = ()
    """Frozen per loop instance; rendered between the system lane and history."""
    tools: tuple[ToolDefinition, ...] = ()
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = None
    stream: bool = False
    """Whether the request asks the provider for a server-sent event stream."""
    output_schema: OutputSchema | None = None
    """Structured output: the answer is JSON matching this schema (None: free text)."""
    developer_role: bool | None = None
    """Whether the endpoint has a native developer role; None: the transport's default
    (OpenAI transports yes, Anthropic no)."""
    trusted_actor_types: tuple[str, ...] = ()
    """The registered, not built-in actor types this request trusts with instruction
    precedence (``trust.trusted_extensions()`` when it was made); sorted, no duplicates.
    Logged so a rebuild in any process renders the same roles."""
    content_limit: int | None = Field(default=None, ge=1)
    """The most characters of one item's content the request shows: a longer item is cut
    (head and tail) with a marker naming its own offset, the whole record. None: no cut."""
    layout: Literal[1, 2] = 1
    """How items are laid out (``context.request``). 1, the first: the long protocol text and
    a header line on every item. 2: a short protocol text, and the agent's own answers
    without a header, so a model does not learn to begin its answers with one. Logged so
    that requests recorded before layout 2 existed rebuild byte for byte."""
    clock: Literal["tail", "date"] = "tail"
    """Where the request's time goes. ``tail``: the whole time in a message after every item,
    which keeps a provider's cached prompt (OpenAI, Anthropic) but sits between the question
    and the answer. ``date``: the request's UTC date at the end of the system text, for a
    server whose cache also keeps the tokens it generated (llama.cpp, vLLM, Ollama): a
    tail there costs the re-evaluation of every previous answer; the date costs the cache
    once a day."""

    @field_validator("system_prompt")
    @classmethod
    def _no_header(cls, value: str | None) -> str | None:
        if value is not None and HEADER_START.match(value):
            raise ValueError("the system prompt must not start like an item header (@<digit>)")
        return value

    @field_validator("trusted_actor_types")
    @classmethod
    def _canonical_types(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if not _ACTOR_TYPE.match(name):
                raise ValueError(f"trusted actor type {name!r} is not an actor type token")
            if name in BUILTIN_ACTOR_TYPES:
                raise ValueError(
                    f"trusted actor type {name!r} is built in: its trust is fixed, "
                    "list only registered types"
                )
        return tuple(sorted(set(value)))

    @model_serializer(mode="wrap")
    def _canonical_absence(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # Empty optional tuples and no content limit are canonical absence: no header
        # field, no bytes, so a header without them is stored as before they existed.
        data: dict[str, Any] = handler(self)
        if data.get("content_limit", 0) is None:
            data.pop("content_limit")
        if data.get("output_schema", 0) is None:
            data.pop("output_schema")
        if data.get("layout") == 1:
            data.pop("layout")
        if data.get("clock") == "tail":
            data.pop("clock")
        for name in ("session_prefix", "trusted_actor_types"):
            if not data.get(name):
                data.pop(name, None)
        return data

    @property
    def has_developer_role(self) -> bool:
        if self.developer_role is not None:
            return self.developer_role
        return self.transport != "anthropic"


class LlmRequestRequested(Event, type="contextfold.agent/llm-request-requested", runtime_only=True):
    """A model request: publishes the projection through this event's offset.

    ``header`` None repeats the previous request's header snapshot, so an unchanged
    header is logged once. The event's journal time is rendered at the request's tail.
    """

    header: RequestHeader | None = None
    reason: str | None = None
    """Why the request was made (free text for traces; not rendered)."""


class LlmResponse(Event, type="contextfold.agent/llm-response", runtime_only=True):
    """The model's answer to request ``request_offset``: evidence, not projected."""

    request_offset: int = Field(ge=1)
    model: str
    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None
    stop_reason: str | None = None


class ToolCallResult(Event, type="contextfold.agent/tool-call-result", runtime_only=True):
    """The outcome of executing one tool call: evidence, not projected."""

    tool_call_id: str = Field(min_length=1)
    name: str
    content: str = ""
    is_error: bool = False


class ToolCallStarted(Event, type="contextfold.agent/tool-call-started", runtime_only=True):
    """The runtime is about to run tool call ``tool_call_id``: appended (durably) right
    before the tool's function is called, so a resumed agent that finds it without a
    :class:`ToolCallResult` knows the call may already have run. Evidence, not projected."""

    tool_call_id: str = Field(min_length=1)
    name: str


class LlmRequestInterrupted(
    Event, type="contextfold.agent/llm-request-interrupted", runtime_only=True
):
    """Request ``request_offset`` was cancelled; it stays published (sealed conservatively)."""

    request_offset: int = Field(ge=1)
    reason: str | None = None


def assistant_item(response: LlmResponse) -> ContextAdded:
    """The model-visible item for a model answer: assistant, agent actor, genuine offset."""
    return ContextAdded(
        role="assistant",
        actor=Actor(type="agent"),
        content=response.text,
        tool_calls=response.tool_calls,
        llm_request_offset=response.request_offset,
    )


def tool_result_item(result: ToolCallResult) -> ContextAdded:
    """The model-visible item for a tool result: developer history with a ``tool`` actor."""
    content = f"error: {result.content}" if result.is_error else result.content
    return ContextAdded(
        role="developer",
        actor=Actor(type="tool", id=result.name),
        content=content,
        tool_call_id=result.tool_call_id,
    )
