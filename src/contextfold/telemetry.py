"""What contextfold reports to OpenTelemetry: the names of its spans' attributes, its
metric instruments, and the prompt-cache measure (the bytes a request shares with the
request before it).

contextfold calls only the OpenTelemetry API. Until an SDK is configured (the ``otel``
extra installs it; set a ``TracerProvider`` and a ``MeterProvider`` as usual) the API's
tracer and meter are no-ops: nothing is exported, spans do not record, and what costs
something to compute for a span (the shared prefix of two bodies) is skipped. The
instruments are the API's proxies, so a provider set after contextfold is imported still
receives everything from then on.

Spans (made by ``contextfold.runtime.spans`` from the agent loop's events) follow the
OpenTelemetry GenAI semantic conventions: ``invoke_agent`` per agent turn, ``chat {model}``
per model request, ``execute_tool {tool}`` per tool call, and ``compaction`` per summary;
each carries the stream and the journal offset (``contextfold.request.offset``), a request
also the SHA-256 of its body. Metrics: appends and appended events, append and fold read
durations, fold reads, and the GenAI client's token usage.

This module imports nothing else from contextfold: every layer may report through it.
"""

from __future__ import annotations

from typing import Protocol

from opentelemetry import metrics, trace
from opentelemetry.util.types import AttributeValue

__all__ = [
    "AGENT_TURN",
    "COMPACTION",
    "CONVERSATION_ID",
    "EXECUTE_TOOL",
    "MODEL_REQUEST",
    "NAMESPACE",
    "OPERATION_NAME",
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
    "STREAM",
    "TOOL_CALL_ID",
    "TOOL_NAME",
    "TOOL_TYPE",
    "TRACER",
    "USAGE_CACHE_READ_TOKENS",
    "USAGE_CACHE_WRITE_TOKENS",
    "USAGE_INPUT_TOKENS",
    "USAGE_OUTPUT_TOKENS",
    "USAGE_REASONING_TOKENS",
    "UsageLike",
    "prefix_share",
    "provider_name",
    "record_append",
    "record_fold_read",
    "record_token_usage",
    "shared_prefix",
    "usage_attributes",
]

TRACER = trace.get_tracer("contextfold")
"""The tracer of every contextfold span (the API's proxy: a no-op until an SDK is set)."""

# GenAI semantic conventions (gen_ai.*), and contextfold's own attributes (contextfold.*).
OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
CONVERSATION_ID = "gen_ai.conversation.id"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_STREAM = "gen_ai.request.stream"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_WRITE_TOKENS = "gen_ai.usage.cache_creation.input_tokens"
USAGE_REASONING_TOKENS = "contextfold.usage.reasoning_tokens"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
STREAM = "contextfold.stream"
NAMESPACE = "contextfold.namespace"
REQUEST_OFFSET = "contextfold.request.offset"
REQUEST_SHA256 = "contextfold.request.sha256"
REQUEST_SIZE = "contextfold.request.size"
REQUEST_TRANSPORT = "contextfold.request.transport"
REQUEST_RETRY = "contextfold.request.retry"
REQUEST_PREFIX_BYTES = "contextfold.request.prefix_bytes"
"""Bytes at the start of the body equal to the start of the previous request's body."""
REQUEST_PREFIX_SHARE = "contextfold.request.prefix_share"
"""Those bytes as a share of the body (0 to 1): what a provider's prompt cache can reuse."""

AGENT_TURN = "invoke_agent"
MODEL_REQUEST = "chat"
EXECUTE_TOOL = "execute_tool"
COMPACTION = "compaction"
"""The operation names (``gen_ai.operation.name``) of contextfold's spans."""

_PROVIDERS = {"openai-chat": "openai", "openai-responses": "openai", "anthropic": "anthropic"}

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
    "gen_ai.client.token.usage", unit="{token}", description="Tokens a model request used"
)


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


def provider_name(transport: str) -> str:
    """The ``gen_ai.provider.name`` of a transport (``openai``, ``anthropic``)."""
    return _PROVIDERS.get(transport, transport)


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


def record_token_usage(usage: UsageLike, *, model: str, transport: str) -> None:
    """Record a model request's input and output tokens (``gen_ai.client.token.usage``)."""
    base = {
        OPERATION_NAME: MODEL_REQUEST,
        PROVIDER_NAME: provider_name(transport),
        REQUEST_MODEL: model,
    }
    _token_usage.record(usage.input_tokens, {**base, "gen_ai.token.type": "input"})
    _token_usage.record(usage.output_tokens, {**base, "gen_ai.token.type": "output"})
