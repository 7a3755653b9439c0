"""What contextfold reports to OpenTelemetry: the names of its spans' attributes, its
metric instruments, the switch for capturing message content, and the prompt-cache
measure (the bytes a request shares with the request before it).

contextfold calls only the OpenTelemetry API. Until an SDK is configured (the ``otel``
extra installs it; set a ``TracerProvider`` and a ``MeterProvider`` as usual) the API's
tracer and meter are no-ops: nothing is exported, spans are not even made, and what costs
something to compute for a span (the shared prefix of two bodies, a price, captured
content) is skipped. The instruments are the API's proxies, so a provider set after
contextfold is imported still receives everything from then on.

Spans (made by ``contextfold.runtime.spans`` from the agent loop's events, and by the
framework integrations around each model call) follow the OpenTelemetry GenAI semantic
conventions: ``invoke_agent {agent}`` per agent turn, ``chat {model}`` per model request
(a compaction's summary request too, marked ``contextfold.operation = compaction``),
``execute_tool {tool}`` per tool call; a failure sets ``error.type``. Each carries the
stream and the journal offset (``contextfold.request.offset``), a request also the SHA-256
of its body and, where its model has a price, its cost in US dollars
(``contextfold.usage.cost``). Metrics: the GenAI client's ``gen_ai.client.token.usage`` and
``gen_ai.client.operation.duration``; appends and appended events, append and fold read
durations, fold reads.

Content (the messages a request carried, its system instructions and tool definitions, the
answer, a tool call's arguments and result) is recorded on spans only when asked for: by
:func:`capture_content`, else by the conventions' environment variable
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` (``SPAN_ONLY`` or ``SPAN_AND_EVENT``,
or ``true`` as older instrumentations read it).

This module imports only contextfold's errors: every layer may report through it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Protocol
from urllib.parse import urlsplit

import orjson
from opentelemetry import metrics, trace
from opentelemetry.util.types import AttributeValue

from .errors import UsageError

__all__ = [
    "AGENT_NAME",
    "AGENT_TURN",
    "CAPTURE_CONTENT_ENV",
    "COMPACTION",
    "CONTEXTFOLD_OPERATION",
    "CONVERSATION_ID",
    "ERROR_TYPE",
    "EXECUTE_TOOL",
    "INPUT_MESSAGES",
    "MODEL_REQUEST",
    "NAMESPACE",
    "OPERATION_DURATION",
    "OPERATION_NAME",
    "OUTPUT_MESSAGES",
    "OUTPUT_TYPE",
    "PROVIDER_NAME",
    "REQUEST_MAX_TOKENS",
    "REQUEST_MODEL",
    "REQUEST_OFFSET",
    "REQUEST_PREFIX_BYTES",
    "REQUEST_PREFIX_SHARE",
    "REQUEST_RETRY",
    "REQUEST_SHA256",
    "REQUEST_SIZE",
    "REQUEST_STREAM",
    "REQUEST_TEMPERATURE",
    "REQUEST_TRANSPORT",
    "RESPONSE_FINISH_REASONS",
    "RESPONSE_ID",
    "RESPONSE_MODEL",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "STREAM",
    "SYSTEM_INSTRUCTIONS",
    "TOKEN_TYPE",
    "TOKEN_USAGE",
    "TOOL_CALL_ARGUMENTS",
    "TOOL_CALL_ID",
    "TOOL_CALL_RESULT",
    "TOOL_DEFINITIONS",
    "TOOL_DESCRIPTION",
    "TOOL_NAME",
    "TOOL_TYPE",
    "TRACER",
    "USAGE_CACHE_READ_TOKENS",
    "USAGE_CACHE_WRITE_TOKENS",
    "USAGE_COST",
    "USAGE_INPUT_TOKENS",
    "USAGE_OUTPUT_TOKENS",
    "USAGE_REASONING_TOKENS",
    "UsageLike",
    "capture_content",
    "content_captured",
    "error_type",
    "json_text",
    "metric_attributes",
    "prefix_share",
    "provider_name",
    "record_append",
    "record_fold_read",
    "record_operation_duration",
    "record_token_usage",
    "server_of",
    "shared_prefix",
    "tracing",
    "usage_attributes",
]

TRACER = trace.get_tracer("contextfold")
"""The tracer of every contextfold span (the API's proxy: a no-op until an SDK is set)."""

# GenAI semantic conventions (gen_ai.*, error.*, server.*): tests/test_telemetry_conventions.py
# checks each against the conventions package's own constants.
OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
CONVERSATION_ID = "gen_ai.conversation.id"
AGENT_NAME = "gen_ai.agent.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_STREAM = "gen_ai.request.stream"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
OUTPUT_TYPE = "gen_ai.output.type"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
USAGE_REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
TOKEN_TYPE = "gen_ai.token.type"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_DESCRIPTION = "gen_ai.tool.description"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_DEFINITIONS = "gen_ai.tool.definitions"
ERROR_TYPE = "error.type"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
TOKEN_USAGE = "gen_ai.client.token.usage"
OPERATION_DURATION = "gen_ai.client.operation.duration"
"""The names of the GenAI client's two metrics."""

# contextfold's own attributes (contextfold.*).
STREAM = "contextfold.stream"
NAMESPACE = "contextfold.namespace"
CONTEXTFOLD_OPERATION = "contextfold.operation"
"""What a span does for contextfold beyond its GenAI operation: ``compaction`` on the chat
span of a summary request."""
REQUEST_OFFSET = "contextfold.request.offset"
REQUEST_SHA256 = "contextfold.request.sha256"
REQUEST_SIZE = "contextfold.request.size"
REQUEST_TRANSPORT = "contextfold.request.transport"
REQUEST_RETRY = "contextfold.request.retry"
REQUEST_PREFIX_BYTES = "contextfold.request.prefix_bytes"
"""Bytes at the start of the body equal to the start of the previous request's body."""
REQUEST_PREFIX_SHARE = "contextfold.request.prefix_share"
"""Those bytes as a share of the body (0 to 1): what a provider's prompt cache can reuse."""
USAGE_COST = "contextfold.usage.cost"
"""What the request's usage cost in US dollars, as ``contextfold.prices`` prices it (absent
for a model without a price: unknown, never zero)."""

AGENT_TURN = "invoke_agent"
MODEL_REQUEST = "chat"
EXECUTE_TOOL = "execute_tool"
"""The operation names (``gen_ai.operation.name``) of contextfold's spans."""
COMPACTION = "compaction"
"""The ``contextfold.operation`` of a summary request's chat span."""

CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI conventions' switch for recording message content (off unless set)."""
_CAPTURE_ON = frozenset({"span_only", "span_and_event", "true"})

_PROVIDERS = {"openai-chat": "openai", "openai-responses": "openai", "anthropic": "anthropic"}
# The GenAI conventions' advised bucket boundaries for the client's two histograms.
_DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48]
_DURATION_BUCKETS += [40.96, 81.92]
_TOKEN_BUCKETS = [float(4**n) for n in range(14)]  # 1, 4, 16, ... 67,108,864
_METRIC_KEYS = (
    OPERATION_NAME,
    PROVIDER_NAME,
    REQUEST_MODEL,
    RESPONSE_MODEL,
    SERVER_ADDRESS,
    SERVER_PORT,
)

_meter = metrics.get_meter("contextfold")
_appends = _meter.create_counter(
    "contextfold.journal.appends", unit="{append}", description="Appends to the journal"
)
_appended = _meter.create_counter(
    "contextfold.journal.appended_events",
    unit="{event}",
    description="Events written by appends (an idempotent retry writes none)",
)
_append_seconds = _meter.create_histogram(
    "contextfold.journal.append.duration", unit="s", description="Time an append took"
)
_fold_reads = _meter.create_counter(
    "contextfold.fold.reads", unit="{read}", description="Fold reads through the journal"
)
_fold_read_seconds = _meter.create_histogram(
    "contextfold.fold.read.duration", unit="s", description="Time a fold read took"
)
_token_usage = _meter.create_histogram(
    TOKEN_USAGE,
    unit="{token}",
    description="Number of input and output tokens used.",
    explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
)
_operation_seconds = _meter.create_histogram(
    OPERATION_DURATION,
    unit="s",
    description="GenAI operation duration.",
    explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
)
_captured: list[bool | None] = [None]  # capture_content's setting (None: the environment's)


class UsageLike(Protocol):
    """Token usage as ``contextfold.wire.Usage`` holds it."""

    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def cached_input_tokens(self) -> int | None: ...
    @property
    def cache_write_tokens(self) -> int | None: ...
    @property
    def reasoning_tokens(self) -> int | None: ...


def tracing() -> bool:
    """Whether a tracer provider is set (an SDK's): without one no span is worth making."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def capture_content(enabled: bool | None) -> None:
    """Record message content on spans (True), never (False), or as
    :data:`CAPTURE_CONTENT_ENV` says (None, the default). Content holds what users and
    tools wrote: send it only where such data may go. Takes effect from the next turn or
    model call."""
    if enabled is not None and not isinstance(enabled, bool):
        raise UsageError(f"capture_content takes True, False or None, got {enabled!r}")
    _captured[0] = enabled


def content_captured(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether spans record message content now (see :func:`capture_content`)."""
    chosen = _captured[0]
    if chosen is not None:
        return chosen
    return environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() in _CAPTURE_ON


def json_text(value: object) -> str:
    """``value`` as the compact JSON text a structured attribute (messages, definitions)
    is recorded as."""
    return orjson.dumps(value).decode()


def provider_name(transport: str) -> str:
    """The ``gen_ai.provider.name`` of a transport (``openai``, ``anthropic``)."""
    return _PROVIDERS.get(transport, transport)


def server_of(base_url: object) -> dict[str, AttributeValue]:
    """``server.address`` and ``server.port`` of a client's base URL (none for None or a URL
    without a host); the port only when the URL names one or its scheme implies one."""
    if base_url is None:
        return {}
    try:
        parts = urlsplit(str(base_url))
        port = parts.port
    except ValueError:
        return {}
    if not parts.hostname:
        return {}
    found: dict[str, AttributeValue] = {SERVER_ADDRESS: parts.hostname}
    port = port or {"https": 443, "http": 80}.get(parts.scheme)
    if port is not None:
        found[SERVER_PORT] = port
    return found


def error_type(error: BaseException) -> str:
    """The ``error.type`` of a failure: the qualified class name of what the provider or
    client raised (the cause contextfold's own error wraps, when there is one)."""
    cause = error.__cause__ if error.__cause__ is not None else error
    kind = type(cause)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def usage_attributes(usage: UsageLike) -> dict[str, int]:
    """The span attributes of a usage report; a breakdown the provider did not report is
    left out (absent, not zero)."""
    found = {USAGE_INPUT_TOKENS: usage.input_tokens, USAGE_OUTPUT_TOKENS: usage.output_tokens}
    for name, value in (
        (USAGE_CACHE_READ_TOKENS, usage.cached_input_tokens),
        (USAGE_CACHE_WRITE_TOKENS, usage.cache_write_tokens),
        (USAGE_REASONING_TOKENS, usage.reasoning_tokens),
    ):
        if value is not None:
            found[name] = value
    return found


_BLOCK = 4096


def shared_prefix(previous: bytes, body: bytes) -> int:
    """How many bytes at the start of ``body`` equal the start of ``previous``."""
    limit = min(len(previous), len(body))
    start = 0
    # Whole blocks compare in C; only the block holding the first difference goes byte-wise.
    while start + _BLOCK <= limit:
        end = start + _BLOCK
        if previous[start:end] != body[start:end]:
            break
        start = end
    end = min(start + _BLOCK, limit)
    while start < end and previous[start] == body[start]:
        start += 1
    return start


def prefix_share(previous: bytes | None, body: bytes) -> float | None:
    """The share of ``body`` (0 to 1) that is an exact byte prefix of ``previous``: the
    part a provider's prompt cache can serve. None without a previous body (or an empty
    body: nothing to share)."""
    if previous is None or not body:
        return None
    return shared_prefix(previous, body) / len(body)


def record_append(namespace: str, events: int, *, deduplicated: bool, seconds: float) -> None:
    """Count an append of ``events`` events (none written when ``deduplicated``)."""
    attributes: dict[str, AttributeValue] = {
        NAMESPACE: namespace,
        "contextfold.append.deduplicated": deduplicated,
    }
    _appends.add(1, attributes)
    if not deduplicated:
        _appended.add(events, {NAMESPACE: namespace})
    _append_seconds.record(seconds, attributes)


def record_fold_read(fold: str, namespace: str, seconds: float) -> None:
    """Count one fold read of ``fold`` and how long it took."""
    attributes = {"contextfold.fold": fold, NAMESPACE: namespace}
    _fold_reads.add(1, attributes)
    _fold_read_seconds.record(seconds, attributes)


def metric_attributes(attributes: Mapping[str, AttributeValue]) -> dict[str, AttributeValue]:
    """The attributes of a model call's span that its GenAI metrics carry (operation,
    provider, request and response model, server), leaving out the rest."""
    return {key: attributes[key] for key in _METRIC_KEYS if key in attributes}


def record_token_usage(usage: UsageLike, attributes: Mapping[str, AttributeValue]) -> None:
    """Record a model call's input and output tokens (``gen_ai.client.token.usage``), with
    its :func:`metric_attributes`."""
    _token_usage.record(usage.input_tokens, {**attributes, TOKEN_TYPE: "input"})
    _token_usage.record(usage.output_tokens, {**attributes, TOKEN_TYPE: "output"})


def record_operation_duration(
    seconds: float, attributes: Mapping[str, AttributeValue], error: str | None = None
) -> None:
    """Record how long a model call took (``gen_ai.client.operation.duration``), with its
    :func:`metric_attributes` and, for a failed call, its ``error.type``."""
    _operation_seconds.record(
        seconds, attributes if error is None else {**attributes, ERROR_TYPE: error}
    )
