"""The agent loop's OpenTelemetry spans and GenAI metrics, made from its typed loop events.

One ``invoke_agent {agent}`` span per turn (a ``run_until_idle`` that did any work), and
under it one ``chat {model}`` span per model request (from ``RequestSent`` to its recorded
answer, failure or interrupt), one ``execute_tool {tool}`` span per tool call and one
``chat {model}`` span per compaction's summary request (``contextfold.operation =
compaction``; a compaction no model call writes, a trim note, is an internal
``compaction`` span). Names and attributes are those of :mod:`contextfold.telemetry` (GenAI
semantic conventions); with content capture on (``telemetry.capture_content``) a request's
span holds the messages its body carried, its answer and its tool definitions, and a tool's
span its arguments and result. Without an OpenTelemetry SDK the spans are not made and
nothing here computes anything of cost; the two GenAI client metrics (token usage,
operation duration) are recorded either way, as a meter provider may be set alone.

A span's failure never reaches the loop: telemetry only watches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from .. import telemetry as tm
from ..errors import ContextfoldError
from ..prices import Pricing, default_prices
from ..wire import ModelOutput, RenderedRequest, Transport, Usage
from .events import (
    CompactionFinished,
    CompactionStarted,
    DeltaReceived,
    LoopCancelled,
    LoopEvent,
    LoopHalted,
    RequestFailed,
    RequestInterrupted,
    RequestRetried,
    RequestSent,
    ResponseRecorded,
    ToolFinished,
    ToolStarted,
)
from .span_content import output_content, request_content

__all__ = ["LoopSpans", "client_server", "usage_attributes"]

log = logging.getLogger("contextfold.runtime")

_TOOL_FAILED = "_OTHER"
"""The ``error.type`` of a tool call that failed (its outcome names no exception class)."""


def usage_attributes(
    usage: Usage | None, model: str | None, pricing: Pricing | None
) -> dict[str, AttributeValue]:
    """A finished call's usage attributes and, when ``pricing`` prices its model, its cost
    (a price table that cannot be read leaves the cost out, said in the log)."""
    if usage is None:
        return {}
    found: dict[str, AttributeValue] = dict(tm.usage_attributes(usage))
    try:
        cost = (pricing or default_prices()).cost(model, usage)
    except ContextfoldError as exc:
        log.warning("telemetry: no cost on the span: %s", exc)
        cost = None
    if cost is not None:
        found[tm.USAGE_COST] = cost
    return found


def _response(output: ModelOutput) -> dict[str, AttributeValue]:
    found: dict[str, AttributeValue] = {}
    if output.response_id:
        found[tm.RESPONSE_ID] = output.response_id
    if output.response_model:
        found[tm.RESPONSE_MODEL] = output.response_model
    return found


def client_server(model: object) -> dict[str, AttributeValue]:
    """``server.address`` and ``server.port`` of a model client's SDK client, when it has a
    base URL (a function model has none)."""
    return tm.server_of(getattr(getattr(model, "client", None), "base_url", None))


class LoopSpans:
    """The spans of one agent instance on one stream (see the module docstring).

    ``agent_name`` names the turn span (``gen_ai.agent.name``); ``server`` is the model
    server's address attributes (:func:`client_server`); ``pricing`` prices a request's
    usage (None: ``contextfold.prices.default_prices()``, made at the first recorded
    answer). The previous request's body is kept in memory (one body) so a request span
    can say how much of its body is the previous one's exact prefix; a new instance's first
    request has no previous body to compare with and omits it.
    """

    def __init__(
        self,
        namespace: str,
        stream: str,
        model: str,
        transport: Transport,
        *,
        agent_name: str | None = None,
        server: Mapping[str, AttributeValue] | None = None,
        pricing: Pricing | None = None,
    ) -> None:
        self.namespace = namespace
        self.stream = stream
        self.model = model
        self.transport: Transport = transport
        self.agent_name = agent_name
        self.server = dict(server or {})
        self._pricing = pricing
        self._turn_started: int | None = None
        self._turn: Span | None = None
        self._requests: dict[int, Span] = {}
        self._tools: dict[str, Span] = {}
        self._compactions: dict[int, Span] = {}
        self._sent: dict[int, float] = {}  # a model call's start (monotonic), by offset
        self._call_offsets: dict[str, int] = {}
        self._descriptions: dict[str, str] = {}  # the tools' descriptions, by name
        self._previous: tuple[int, bytes] | None = None
        self._retrying: set[int] = set()
        self._deltas: dict[int, int] = {}
        self._counts = {"requests": 0, "tool_calls": 0, "compactions": 0}
        self._used: list[int] | None = None  # the turn's input and output tokens, if reported
        self._metric: dict[str, AttributeValue] = {
            tm.OPERATION_NAME: tm.MODEL_REQUEST,
            tm.PROVIDER_NAME: tm.provider_name(transport),
            tm.REQUEST_MODEL: model,
            **self.server,
        }
        """The attributes of this agent's model calls that their metrics carry."""
        self._tracing = True  # whether this turn makes spans (see start_turn)
        self._capture = False  # whether this turn's spans record content

    # -- the turn -----------------------------------------------------------------------------

    def start_turn(self) -> None:
        """A run of the loop begins; its span starts at the first work it does."""
        self._end_open("the previous turn ended without closing it")
        # Without a tracer provider (no SDK) every span would be a no-op: the turn makes
        # none (only the metrics, which have a provider of their own). One set meanwhile
        # takes effect from the next turn, so no span of a turn is missing its start.
        self._tracing = tm.tracing()
        self._capture = self._tracing and tm.content_captured()
        self._turn_started = time.time_ns()
        self._turn = None
        self._counts = dict.fromkeys(self._counts, 0)
        self._used = None

    def end_turn(self, status: str, reason: str) -> None:
        """The run ended with ``status`` (``idle``, ``queued``, ``stopped``) and ``reason``."""
        try:
            self._end_open("the turn ended before it finished")
            if self._turn is not None:
                self._turn.set_attributes(
                    {
                        "contextfold.turn.status": status,
                        "contextfold.turn.reason": reason,
                        **{f"contextfold.turn.{k}": v for k, v in self._counts.items()},
                    }
                )
                if self._used is not None:  # the turn's model calls, compactions included
                    self._turn.set_attribute(tm.USAGE_INPUT_TOKENS, self._used[0])
                    self._turn.set_attribute(tm.USAGE_OUTPUT_TOKENS, self._used[1])
                self._turn.end()
        except Exception as exc:  # pragma: no cover - an SDK bug must not stop the loop
            log.warning("telemetry: ending the turn span failed: %s", exc)
        finally:
            self._turn, self._turn_started = None, None

    def _parent(self) -> Span:
        if self._turn is None:
            attributes: dict[str, AttributeValue] = {
                tm.OPERATION_NAME: tm.AGENT_TURN,
                tm.PROVIDER_NAME: tm.provider_name(self.transport),
                tm.CONVERSATION_ID: self.stream,
                tm.REQUEST_MODEL: self.model,
                **self.server,
                tm.STREAM: self.stream,
                tm.NAMESPACE: self.namespace,
            }
            if self.agent_name:
                attributes[tm.AGENT_NAME] = self.agent_name
            name = f"{tm.AGENT_TURN} {self.agent_name}" if self.agent_name else tm.AGENT_TURN
            self._turn = tm.TRACER.start_span(
                name, kind=SpanKind.INTERNAL, start_time=self._turn_started, attributes=attributes
            )
        return self._turn

    def _child(self, name: str, kind: SpanKind, attributes: dict[str, AttributeValue]) -> Span:
        context = trace.set_span_in_context(self._parent())
        base: dict[str, AttributeValue] = {tm.STREAM: self.stream, tm.NAMESPACE: self.namespace}
        return tm.TRACER.start_span(name, context, kind=kind, attributes={**base, **attributes})

    def _end_open(self, why: str) -> None:
        for spans in (self._requests, self._tools, self._compactions):
            for span in spans.values():
                span.set_status(Status(StatusCode.ERROR, why))
                span.end()
            spans.clear()
        self._sent.clear()

    # -- loop events --------------------------------------------------------------------------

    def on_event(self, event: LoopEvent) -> None:
        """Open, annotate or end the span ``event`` concerns. Never raises."""
        try:
            if self._tracing:
                self._on_event(event)
            else:
                self._metrics_only(event)
        except Exception as exc:  # pragma: no cover - an SDK bug must not stop the loop
            log.warning("telemetry: a span for %s failed: %s", event.kind, exc)

    def _metrics_only(self, event: LoopEvent) -> None:
        match event:
            case RequestSent(offset=offset):
                self._sent[offset] = time.monotonic()
            case CompactionStarted(offset=offset, rendered=rendered) if rendered is not None:
                self._sent[offset] = time.monotonic()
            case ResponseRecorded(offset=offset, output=output):
                self._measured(offset, output.usage, model=output.response_model)
            case CompactionFinished(offset=offset, usage=usage):
                self._measured(offset, usage)
            case RequestFailed(offset=offset, error=error):
                self._measured(offset, None, tm.error_type(error))

    def _measured(
        self,
        offset: int,
        usage: Usage | None,
        error: str | None = None,
        *,
        model: str | None = None,
    ) -> None:
        """Record a finished model call's duration and token usage (``model``: the one the
        provider says answered)."""
        metric = self._metric if model is None else {**self._metric, tm.RESPONSE_MODEL: model}
        started = self._sent.pop(offset, None)
        if started is not None:
            tm.record_operation_duration(time.monotonic() - started, metric, error)
        if usage is not None:
            tm.record_token_usage(usage, metric)

    def _on_event(self, event: LoopEvent) -> None:
        match event:
            case RequestSent():
                self._request_sent(event)
            case RequestRetried(offset=offset):
                self._retrying.add(offset)
            case DeltaReceived(offset=offset):
                span = self._requests.get(offset)
                if span is not None and offset not in self._deltas:
                    span.add_event("gen_ai.first_delta")
                self._deltas[offset] = self._deltas.get(offset, 0) + 1
            case ResponseRecorded(offset=offset, output=output):
                for call in output.tool_calls:
                    self._call_offsets[call.id] = offset
                span = self._requests.pop(offset, None)
                self._measured(offset, output.usage, model=output.response_model)
                if span is None:
                    return
                span.set_attributes(
                    {
                        **self._answer(output.usage),
                        tm.RESPONSE_FINISH_REASONS: (output.finish_reason,),
                        **_response(output),
                        "contextfold.response.tool_calls": len(output.tool_calls),
                        "contextfold.response.deltas": self._deltas.pop(offset, 0),
                        **(output_content(output) if self._capture else {}),
                    }
                )
                span.end()
            case RequestFailed(offset=offset, error=error):
                kind = tm.error_type(error)
                self._measured(offset, None, kind)
                span = self._requests.pop(offset, None)
                if span is not None:
                    span.record_exception(error)
                    span.set_attribute(tm.ERROR_TYPE, kind)
                    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
                    span.end()
                if self._turn is not None:
                    self._turn.set_attribute(tm.ERROR_TYPE, kind)
                    self._turn.set_status(Status(StatusCode.ERROR, f"request @{offset} failed"))
            case RequestInterrupted(offset=offset, by=by):
                self._sent.pop(offset, None)
                span = self._requests.pop(offset, None)
                if span is not None:
                    span.set_attribute("contextfold.request.interrupted", True)
                    if by is not None:
                        span.set_attribute("contextfold.request.interrupted_by", by)
                    span.end()
            case ToolStarted(call=call):
                span = self._tool_span(call.id, call.name)
                if self._capture:
                    span.set_attribute(tm.TOOL_CALL_ARGUMENTS, call.arguments or "{}")
                self._tools[call.id] = span
            case ToolFinished(call=call, outcome=outcome):
                span = self._tools.pop(call.id, None)
                if span is None:  # answered without running (it may already have run)
                    span = self._tool_span(call.id, call.name)
                    span.set_attribute("contextfold.tool.not_rerun", True)
                span.set_attribute("contextfold.tool.output_chars", len(outcome.output))
                if self._capture:
                    span.set_attribute(tm.TOOL_CALL_RESULT, outcome.output)
                if outcome.is_error:
                    span.set_attribute(tm.ERROR_TYPE, _TOOL_FAILED)
                    span.set_status(Status(StatusCode.ERROR, outcome.output[:200]))
                span.end()
                self._counts["tool_calls"] += 1
            case CompactionStarted(offset=offset, rendered=rendered):
                attributes: dict[str, AttributeValue] = {
                    tm.CONTEXTFOLD_OPERATION: tm.COMPACTION,
                    tm.REQUEST_OFFSET: offset,
                }
                if rendered is None:  # no model call: an internal step, no GenAI operation
                    span = self._child(tm.COMPACTION, SpanKind.INTERNAL, attributes)
                else:
                    self._sent[offset] = time.monotonic()
                    attributes.update(self._metric)
                    attributes[tm.CONVERSATION_ID] = self.stream
                    attributes[tm.OUTPUT_TYPE] = "text"
                    attributes.update(self._body(rendered))
                    name = f"{tm.MODEL_REQUEST} {self.model}"
                    span = self._child(name, SpanKind.CLIENT, attributes)
                self._compactions[offset] = span
            case CompactionFinished(offset=offset, summary=summary, usage=usage):
                self._measured(offset, usage)
                span = self._compactions.pop(offset, None)
                if span is not None:
                    span.set_attributes(self._answer(usage))
                    span.set_attribute("contextfold.compaction.summary_chars", len(summary))
                    if self._capture:
                        span.set_attributes(output_content(ModelOutput(text=summary)))
                    span.end()
                self._counts["compactions"] += 1
            case LoopHalted(reason=reason):
                self._parent().add_event("contextfold.halted", {"contextfold.reason": reason})
            case LoopCancelled():
                self._end_open("the agent was cancelled")
                if self._turn is not None:
                    self._turn.set_attribute(tm.ERROR_TYPE, "cancelled")
                    self._turn.set_status(Status(StatusCode.ERROR, "cancelled"))

    def _answer(self, usage: Usage | None) -> dict[str, AttributeValue]:
        """A finished call's usage attributes and cost; its tokens count toward the turn's."""
        if usage is None:
            return {}
        used = self._used = self._used or [0, 0]
        used[0] += usage.input_tokens
        used[1] += usage.output_tokens
        if self._pricing is None:
            try:
                self._pricing = default_prices()
            except ContextfoldError as exc:
                log.warning("telemetry: no cost on the spans: %s", exc)
        return usage_attributes(usage, self.model, self._pricing)

    def _body(self, rendered: RenderedRequest) -> dict[str, AttributeValue]:
        """The body's hash and size, and its content when captured."""
        found: dict[str, AttributeValue] = {
            tm.REQUEST_SHA256: rendered.sha256,
            tm.REQUEST_SIZE: len(rendered.body),
            tm.REQUEST_TRANSPORT: rendered.transport,
        }
        if self._capture:
            found.update(request_content(rendered))
        return found

    def _request_sent(self, event: RequestSent) -> None:
        rendered, neutral, offset = event.rendered, event.neutral, event.offset
        self._sent[offset] = time.monotonic()
        self._descriptions.update((tool.name, tool.description) for tool in neutral.tools)
        attributes: dict[str, AttributeValue] = {
            **self._metric,
            tm.PROVIDER_NAME: tm.provider_name(rendered.transport),
            tm.REQUEST_MODEL: neutral.model,
            tm.REQUEST_STREAM: neutral.stream,
            tm.OUTPUT_TYPE: "json" if neutral.output_schema is not None else "text",
            tm.CONVERSATION_ID: self.stream,
            tm.REQUEST_OFFSET: offset,
            **self._body(rendered),
            tm.REQUEST_RETRY: offset in self._retrying,
        }
        if neutral.max_tokens is not None:
            attributes[tm.REQUEST_MAX_TOKENS] = neutral.max_tokens
        if neutral.temperature is not None:
            attributes[tm.REQUEST_TEMPERATURE] = neutral.temperature
        self._retrying.discard(offset)
        span = self._child(f"{tm.MODEL_REQUEST} {neutral.model}", SpanKind.CLIENT, attributes)
        previous, self._previous = self._previous, (offset, rendered.body)
        if span.is_recording() and previous is not None and previous[0] < offset:
            # The bytes a provider's prompt cache can reuse: computed only for a recording span.
            shared = tm.shared_prefix(previous[1], rendered.body)
            span.set_attribute(tm.REQUEST_PREFIX_BYTES, shared)
            span.set_attribute(tm.REQUEST_PREFIX_SHARE, shared / max(len(rendered.body), 1))
            span.set_attribute("contextfold.request.previous_offset", previous[0])
        old = self._requests.pop(offset, None)
        if old is not None:  # sent again before its first send ended (should not happen)
            old.end()
        self._requests[offset] = span
        self._counts["requests"] += 1

    def _tool_span(self, call_id: str, name: str) -> Span:
        attributes: dict[str, AttributeValue] = {
            tm.OPERATION_NAME: tm.EXECUTE_TOOL,
            tm.TOOL_NAME: name,
            tm.TOOL_CALL_ID: call_id,
            tm.TOOL_TYPE: "function",
        }
        description = self._descriptions.get(name)
        if description:
            attributes[tm.TOOL_DESCRIPTION] = description
        offset = self._call_offsets.pop(call_id, None)
        if offset is not None:
            attributes[tm.REQUEST_OFFSET] = offset
        return self._child(f"{tm.EXECUTE_TOOL} {name}", SpanKind.INTERNAL, attributes)
