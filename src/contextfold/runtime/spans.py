"""The agent loop's OpenTelemetry spans, made from its typed loop events.

One ``invoke_agent`` span per turn (a ``run_until_idle`` that did any work), and under
it one ``chat {model}`` span per model request (from ``RequestSent`` to its recorded
answer, failure or interrupt), one ``execute_tool {tool}`` span per tool call and one
``compaction`` span per summary. Names and attributes are those of
:mod:`contextfold.telemetry` (GenAI semantic conventions). Without an OpenTelemetry SDK
the spans do not record and nothing here computes anything of cost.

A span's failure never reaches the loop: telemetry only watches.
"""

from __future__ import annotations

import logging
import time

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from .. import telemetry as tm
from ..wire import Transport
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

__all__ = ["LoopSpans"]

log = logging.getLogger("contextfold.runtime")


class LoopSpans:
    """The spans of one agent instance on one stream (see the module docstring).

    The previous request's body is kept in memory (one body) so a request span can say
    how much of its body is the previous one's exact prefix; a new instance's first
    request has no previous body to compare with and omits it.
    """

    def __init__(self, namespace: str, stream: str, model: str, transport: Transport) -> None:
        self.namespace = namespace
        self.stream = stream
        self.model = model
        self.transport: Transport = transport
        self._turn_started: int | None = None
        self._turn: Span | None = None
        self._requests: dict[int, Span] = {}
        self._tools: dict[str, Span] = {}
        self._compactions: dict[int, Span] = {}
        self._call_offsets: dict[str, int] = {}
        self._previous: tuple[int, bytes] | None = None
        self._retrying: set[int] = set()
        self._deltas: dict[int, int] = {}
        self._counts = {"requests": 0, "tool_calls": 0, "compactions": 0}
        self._tracing = True  # whether this turn makes spans (see start_turn)

    # -- the turn -----------------------------------------------------------------------------

    def start_turn(self) -> None:
        """A run of the loop begins; its span starts at the first work it does."""
        self._end_open("the previous turn ended without closing it")
        # Without a tracer provider (no SDK) every span would be a no-op: the turn makes
        # none (only the token metric, which has a provider of its own). One set meanwhile
        # takes effect from the next turn, so no span of a turn is missing its start.
        self._tracing = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        self._turn_started = time.time_ns()
        self._turn = None
        self._counts = dict.fromkeys(self._counts, 0)

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
                self._turn.end()
        except Exception as exc:  # pragma: no cover - an SDK bug must not stop the loop
            log.warning("telemetry: ending the turn span failed: %s", exc)
        finally:
            self._turn, self._turn_started = None, None

    def _parent(self) -> Span:
        if self._turn is None:
            self._turn = tm.TRACER.start_span(
                f"{tm.AGENT_TURN} {self.stream}",
                kind=SpanKind.INTERNAL,
                start_time=self._turn_started,
                attributes={
                    tm.OPERATION_NAME: tm.AGENT_TURN,
                    tm.CONVERSATION_ID: self.stream,
                    tm.STREAM: self.stream,
                    tm.NAMESPACE: self.namespace,
                    tm.REQUEST_MODEL: self.model,
                },
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

    # -- loop events --------------------------------------------------------------------------

    def on_event(self, event: LoopEvent) -> None:
        """Open, annotate or end the span ``event`` concerns. Never raises."""
        try:
            if self._tracing:
                self._on_event(event)
            elif isinstance(event, ResponseRecorded):
                usage = event.output.usage
                if usage is not None:
                    tm.record_token_usage(usage, model=self.model, transport=self.transport)
        except Exception as exc:  # pragma: no cover - an SDK bug must not stop the loop
            log.warning("telemetry: a span for %s failed: %s", event.kind, exc)

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
                if span is None:
                    return
                usage = output.usage
                attributes: dict[str, AttributeValue] = {
                    **(tm.usage_attributes(usage) if usage is not None else {}),
                    tm.RESPONSE_FINISH_REASONS: (output.finish_reason,),
                    "contextfold.response.tool_calls": len(output.tool_calls),
                    "contextfold.response.deltas": self._deltas.pop(offset, 0),
                }
                span.set_attributes(attributes)
                span.end()
                if usage is not None:
                    tm.record_token_usage(usage, model=self.model, transport=self.transport)
            case RequestFailed(offset=offset, error=error):
                span = self._requests.pop(offset, None)
                if span is not None:
                    span.record_exception(error)
                    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
                    span.end()
                if self._turn is not None:
                    self._turn.set_status(Status(StatusCode.ERROR, f"request @{offset} failed"))
            case RequestInterrupted(offset=offset, by=by):
                span = self._requests.pop(offset, None)
                if span is not None:
                    span.set_attribute("contextfold.request.interrupted", True)
                    if by is not None:
                        span.set_attribute("contextfold.request.interrupted_by", by)
                    span.end()
            case ToolStarted(call=call):
                self._tools[call.id] = self._tool_span(call.id, call.name)
            case ToolFinished(call=call, outcome=outcome):
                span = self._tools.pop(call.id, None)
                if span is None:  # answered without running (it may already have run)
                    span = self._tool_span(call.id, call.name)
                    span.set_attribute("contextfold.tool.not_rerun", True)
                span.set_attribute("contextfold.tool.output_chars", len(outcome.output))
                if outcome.is_error:
                    span.set_status(Status(StatusCode.ERROR, outcome.output[:200]))
                span.end()
                self._counts["tool_calls"] += 1
            case CompactionStarted(offset=offset):
                self._compactions[offset] = self._child(
                    f"{tm.COMPACTION} {self.stream}",
                    SpanKind.INTERNAL,
                    {tm.OPERATION_NAME: tm.COMPACTION, tm.REQUEST_OFFSET: offset},
                )
            case CompactionFinished(offset=offset, summary=summary):
                span = self._compactions.pop(offset, None)
                if span is not None:
                    span.set_attribute("contextfold.compaction.summary_chars", len(summary))
                    span.end()
                self._counts["compactions"] += 1
            case LoopHalted(reason=reason):
                self._parent().add_event("contextfold.halted", {"contextfold.reason": reason})
            case LoopCancelled():
                self._end_open("the agent was cancelled")
                if self._turn is not None:
                    self._turn.set_status(Status(StatusCode.ERROR, "cancelled"))

    def _request_sent(self, event: RequestSent) -> None:
        rendered, neutral, offset = event.rendered, event.neutral, event.offset
        attributes: dict[str, AttributeValue] = {
            tm.OPERATION_NAME: tm.MODEL_REQUEST,
            tm.PROVIDER_NAME: tm.provider_name(rendered.transport),
            tm.REQUEST_MODEL: neutral.model,
            tm.REQUEST_STREAM: neutral.stream,
            tm.CONVERSATION_ID: self.stream,
            tm.REQUEST_OFFSET: offset,
            tm.REQUEST_SHA256: rendered.sha256,
            tm.REQUEST_SIZE: len(rendered.body),
            tm.REQUEST_TRANSPORT: rendered.transport,
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
        offset = self._call_offsets.pop(call_id, None)
        if offset is not None:
            attributes[tm.REQUEST_OFFSET] = offset
        return self._child(f"{tm.EXECUTE_TOOL} {name}", SpanKind.INTERNAL, attributes)
