"""The OpenTelemetry span and GenAI metrics of one framework model call: :class:`CallSpan`.

The integrations that run the context engine (``_call_engine``) inside a framework's model
call (LangChain's ContextMiddleware, pydantic-ai's ContextModel, ADK's ContextPlugin) open
one ``chat {model}`` span per call, from before the engine prepares the messages to the
framework's answer, with the GenAI attributes their data holds (provider, request and
response model, response id, finish reason, usage and its cost, the stream as the
conversation id, the request's journal position) and ``error.type`` on failure; a
compaction the engine makes is a span of its own beside it (``chat {summarizer}`` when the
summarizer is a known model, else an internal ``compaction`` span), both marked
``contextfold.operation = compaction``. With content capture on
(``contextfold.telemetry.capture_content``) the call's span holds the messages the engine
chose (their readable form), the system instructions, the tool definitions and the answer.

Without a tracer provider no span is made; the token-usage and duration metrics are
recorded either way. A span's failure never reaches the call.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.util.types import AttributeValue

from .. import telemetry as tm
from ..context.call_records import Message
from ..context.calls import Readable
from ..prices import Pricing
from ..runtime.span_content import arguments_value
from ..runtime.span_content import finish_reason as conventional_finish
from ..runtime.spans import usage_attributes
from ..wire import Usage

__all__ = ["CallSpan", "Compacting", "Model", "call_span", "readable_messages"]

log = logging.getLogger("contextfold.integrations")


class Model(NamedTuple):
    """A model as its spans name it: its name and ``gen_ai.provider.name`` (None unknown)."""

    name: str
    provider: str | None = None


def readable_messages(messages: Sequence[Readable]) -> list[dict[str, Any]]:
    """Readable messages in the GenAI conventions' message form."""
    return [_message(m) for m in messages]


def _message(message: Readable) -> dict[str, Any]:
    if message.role == "tool":
        ids = message.answered() or ("",)
        parts: list[dict[str, Any]] = [
            {"type": "tool_call_response", "id": ids[0], "response": message.text}
        ]
        # One message answering several calls holds their results as one text.
        parts += [{"type": "tool_call_response", "id": other} for other in ids[1:]]
        return {"role": "tool", "parts": parts}
    parts = [{"type": "text", "content": message.text}] if message.text else []
    parts += [
        {"type": "tool_call", "id": c.id, "name": c.name, "arguments": arguments_value(c.arguments)}
        for c in message.tool_calls
    ]
    role = "system" if message.role == "developer" else message.role
    return {"role": role, "parts": parts}


class CallSpan:
    """One framework model call's span (see the module); :func:`call_span` opens it."""

    def __init__(
        self,
        model: Model,
        *,
        stream: str | None,
        namespace: str | None = None,
        server: Mapping[str, AttributeValue] | None = None,
        summarizer: Model | None = None,
        pricing: Pricing | None = None,
    ) -> None:
        self.model = model
        self.summarizer = summarizer
        self.pricing = pricing
        self.attributes: dict[str, AttributeValue] = {}
        """The stream's attributes, on every span of the call."""
        if stream:
            self.attributes = {tm.STREAM: stream, tm.CONVERSATION_ID: stream}
        if namespace:
            self.attributes[tm.NAMESPACE] = namespace
        self.parent = otel_context.get_current()
        """The context the call began in: a compaction's span is a sibling of the call's."""
        self._metric = _metric(model, server)
        self._started = time.monotonic()
        self._span: Span | None = None
        self._finished = False  # answered or failed: the metrics are recorded once
        self._capture = False
        if tm.tracing():
            self._capture = tm.content_captured()
            name = f"{tm.MODEL_REQUEST} {model.name}" if model.name else tm.MODEL_REQUEST
            attributes = {**self._metric, **self.attributes}
            self._span = tm.TRACER.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)

    @property
    def recording(self) -> bool:
        """Whether a span records this call (a tracer provider is set)."""
        return self._span is not None

    def sent(
        self,
        messages: Sequence[Message],
        position: int | None,
        *,
        system: str | None = None,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """The engine chose ``messages`` and recorded them at ``position`` (None: not
        recorded); ``system`` and ``tools`` are what the framework sends beside them."""
        if self._span is None:
            return
        attributes: dict[str, AttributeValue] = {"contextfold.request.messages": len(messages)}
        if position is not None:
            attributes[tm.REQUEST_OFFSET] = position
        if self._capture:
            readable = [m.readable for m in messages]
            attributes[tm.INPUT_MESSAGES] = tm.json_text(readable_messages(readable))
            if system:
                attributes[tm.SYSTEM_INSTRUCTIONS] = tm.json_text(
                    [{"type": "text", "content": system}]
                )
            if tools:
                attributes[tm.TOOL_DEFINITIONS] = tm.json_text(
                    [{"type": "function", **tool} for tool in tools]
                )
        self._quietly(lambda span: span.set_attributes(attributes))

    def answered(
        self,
        answer: Message | None,
        *,
        model: str | None = None,
        response_id: str | None = None,
        usage: Usage | None = None,
        finish_reason: str | None = None,
    ) -> None:
        """The framework's answer arrived: its attributes, the metrics, and the span ends
        (a second answer to the same call changes nothing)."""
        if self._finished:
            return
        self._finished = True
        metric = {**self._metric, **({tm.RESPONSE_MODEL: model} if model else {})}
        tm.record_operation_duration(time.monotonic() - self._started, metric)
        if usage is not None:
            tm.record_token_usage(usage, metric)
        if self._span is None:
            return
        attributes = usage_attributes(usage, model or self.model.name, self.pricing)
        if model:
            attributes[tm.RESPONSE_MODEL] = model
        if response_id:
            attributes[tm.RESPONSE_ID] = response_id
        if finish_reason:
            attributes[tm.RESPONSE_FINISH_REASONS] = (finish_reason,)
        if self._capture and answer is not None:
            message = _message(answer.readable)
            message["role"] = "assistant"
            message["finish_reason"] = conventional_finish(finish_reason or "stop")
            attributes[tm.OUTPUT_MESSAGES] = tm.json_text([message])
        self._quietly(lambda span: span.set_attributes(attributes))
        self.end()

    def failed(self, error: BaseException) -> None:
        """The call raised ``error``: ``error.type``, the duration metric, and the span ends."""
        if self._finished:
            return
        self._finished = True
        kind = tm.error_type(error)
        tm.record_operation_duration(time.monotonic() - self._started, self._metric, kind)
        if self._span is None:
            return

        def mark(span: Span) -> None:
            span.record_exception(error)
            span.set_attribute(tm.ERROR_TYPE, kind)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))

        self._quietly(mark)
        self.end()

    def end(self) -> None:
        """End the span (again: nothing)."""
        span, self._span = self._span, None
        if span is not None:
            self._quietly(lambda s: s.end(), span)

    @contextmanager
    def compaction(self) -> Iterator[Compacting]:
        """A compaction's span around the summarizer's call and its record, beside this
        call's span; what it yields takes the record's position and the summary's usage."""
        compacting = Compacting(self)
        try:
            yield compacting
        except BaseException as exc:
            compacting.failed(exc)
            raise
        finally:
            compacting.end()

    @contextmanager
    def current(self) -> Iterator[None]:
        """The call's span as the current one inside the block (what the framework's own
        instrumentation then reports nests under it)."""
        if self._span is None:
            yield
            return
        with trace.use_span(self._span, end_on_exit=False):
            yield

    def _quietly(self, work: Callable[[Span], object], span: Span | None = None) -> None:
        target = span if span is not None else self._span
        if target is None:
            return
        try:
            work(target)
        except Exception as exc:  # pragma: no cover - an SDK bug must not stop the call
            log.warning("telemetry: a model call's span failed: %s", exc)


class Compacting:
    """The span of one compaction a call makes (see :meth:`CallSpan.compaction`)."""

    def __init__(self, call: CallSpan) -> None:
        self._call = call
        self._model = call.summarizer
        self._started = time.monotonic()
        self._metric = _metric(self._model, None) if self._model else {}
        self._span: Span | None = None
        if call.recording:
            attributes: dict[str, AttributeValue] = {
                tm.CONTEXTFOLD_OPERATION: tm.COMPACTION,
                **call.attributes,
            }
            if self._model is None:  # a summarizer of the user's own: no GenAI operation
                kind, name = SpanKind.INTERNAL, tm.COMPACTION
            else:
                kind, name = SpanKind.CLIENT, f"{tm.MODEL_REQUEST} {self._model.name}"
                attributes.update(self._metric)
            self._span = tm.TRACER.start_span(name, call.parent, kind=kind, attributes=attributes)

    def done(self, position: int, usage: Usage | None) -> None:
        """The summary was recorded at ``position``; the summarizer used ``usage``."""
        if self._model is not None:
            tm.record_operation_duration(time.monotonic() - self._started, self._metric)
            if usage is not None:
                tm.record_token_usage(usage, self._metric)
        if self._span is not None:
            name = self._model.name if self._model is not None else None
            attributes = usage_attributes(usage, name, self._call.pricing)
            self._span.set_attributes({tm.REQUEST_OFFSET: position, **attributes})

    def failed(self, error: BaseException) -> None:
        if self._model is not None:
            kind = tm.error_type(error)
            seconds = time.monotonic() - self._started
            tm.record_operation_duration(seconds, self._metric, kind)
        if self._span is not None:
            self._span.set_attribute(tm.ERROR_TYPE, tm.error_type(error))
            self._span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))

    def end(self) -> None:
        span, self._span = self._span, None
        if span is not None:
            span.end()


@contextmanager
def call_span(
    model: Model,
    *,
    stream: str | None,
    namespace: str | None = None,
    server: Mapping[str, AttributeValue] | None = None,
    summarizer: Model | None = None,
) -> Iterator[CallSpan]:
    """A :class:`CallSpan` for the call inside the block: a failure raised in it marks the
    span (``error.type``) and passes on; the span ends with the block at the latest."""
    span = CallSpan(model, stream=stream, namespace=namespace, server=server, summarizer=summarizer)
    try:
        yield span
    except BaseException as exc:
        span.failed(exc)
        raise
    finally:
        span.end()


def _metric(model: Model, server: Mapping[str, AttributeValue] | None) -> dict[str, AttributeValue]:
    found: dict[str, AttributeValue] = {tm.OPERATION_NAME: tm.MODEL_REQUEST}
    if model.provider:
        found[tm.PROVIDER_NAME] = model.provider
    if model.name:
        found[tm.REQUEST_MODEL] = model.name
    found.update(server or {})
    return found
