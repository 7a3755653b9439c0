"""contextfold's context engine as a pydantic-ai model wrapper: :class:`ContextModel`.

``Agent(ContextModel(model, journal, "chat/1", budget=30_000, compact_at=60_000))`` puts
the engine (``_call_engine``) inside every model call of the agent, streamed or not:

- the history is trimmed pair-safe to ``budget`` (a ``ModelResponse``'s tool calls and the
  request answering them go together), the agent's system prompt always first;
- with ``compact_at``, when the history behind the newest summary is over that many
  tokens, its oldest part is summarized (by the wrapped model, or ``summarizer``) and the
  summary recorded as a ``CallCompacted`` with every message it replaces; every later
  request sends the summary, as a user prompt in the request after the system prompt,
  instead of them, and the newest answer survives behind it;
- each request is recorded before it is sent (``CallRequested``: its messages as
  pydantic-ai's JSON, model settings and request parameters, the view that chose the
  messages) and the model's answer after it (``CallAnswered``, usage as ``cf.Usage``), so
  ``verify_calls(await read_calls(journal, stream))`` recomputes every request;
- a ``SystemPromptPart`` marked untrusted (``untrusted(part, actor=...)``) goes out as a
  user prompt naming its actor.

The agent's own history is not changed: what one call left out is there for the next call
and for the run's result. ``RecordingModel`` and its ``pydantic-ai/*`` records stay as they
are for journals that hold them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from pydantic_ai import RunContext
from pydantic_ai.direct import model_request
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
)
from pydantic_ai.models import (
    KnownModelName,
    Model,
    ModelRequestParameters,
    StreamedResponse,
    infer_model,
)
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings

from .. import telemetry as tm
from ..context.call_records import CallRecorder, Message
from ..context.calls import CallView
from ..errors import InvalidInputError
from ..journal import Journal, SyncJournal
from ..journal.encode import check_stream
from ..wire import Usage
from ._call_engine import CallEngine, Prepared, check_engine_options
from ._call_spans import CallSpan, call_span
from ._call_spans import Model as SpanModel
from ._journal_bridge import JournalBridge
from ._pydantic_ai_calls import (
    Count,
    History,
    answer_of,
    approx_count,
    approx_tokens,
    history_of,
    outgoing,
    summary_of,
    usage_of,
)
from ._pydantic_ai_recording import parameters_json, settings_json
from ._pydantic_ai_window import Counter, checked_counter_of

__all__ = ["ContextModel"]

FRAMEWORK = "pydantic-ai"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Call:
    """One call on its way: what is sent, and where its request was recorded."""

    messages: list[ModelMessage]
    request: int | None
    view: CallView


class ContextModel(WrapperModel):
    """Wraps ``wrapped`` with contextfold's context engine (see the module).

    ``journal`` and ``stream`` (together) record every call and make compaction possible;
    without them the model only trims. ``budget`` and ``compact_at`` are in tokens as
    ``count_tokens`` counts one message (default ⌈JSON length / 4⌉); the request's tools,
    settings and instructions count as ⌈their JSON / 4⌉. ``keep_newest`` units are kept
    whatever they cost; ``keep_tokens`` of the newest history stay behind a new summary. A
    trimmed view keeps its start while it fits the budget, so the prompt-cache prefix holds
    between trims, and is trimmed to ``trim_to`` of the budget when it no longer does
    (None: to the budget, moving its start at nearly every call).
    Raises InvalidInputError for bad options; a call whose record cannot be written raises
    the journal's error unsent.
    """

    def __init__(
        self,
        wrapped: Model | KnownModelName | str,
        journal: Journal | SyncJournal | None = None,
        stream: str | None = None,
        *,
        budget: float | None = None,
        keep_newest: int = 1,
        count_tokens: Counter | None = None,
        compact_at: float | None = None,
        keep_tokens: float = 0.0,
        summarizer: Model | KnownModelName | str | None = None,
        trim_to: float | None = 0.75,
    ) -> None:
        super().__init__(wrapped)
        if (journal is None) != (stream is None):
            raise InvalidInputError("ContextModel takes journal= and stream= together")
        check_engine_options(budget, keep_newest, compact_at, keep_tokens, trim_to)
        if compact_at is not None and journal is None:
            raise InvalidInputError(
                "ContextModel: compaction (compact_at=) needs journal= and stream= to record it on"
            )
        self._bridge = JournalBridge(journal, what="ContextModel") if journal is not None else None
        self._stream = check_stream(stream) if stream is not None else ""
        if count_tokens is None:
            self._count: Count = approx_count
        else:
            counter = checked_counter_of(count_tokens)
            self._count = lambda message, _: counter(message)
        self._previous: History | None = None
        self._last: Prepared | None = None
        self._summarizer = infer_model(summarizer) if summarizer is not None else None
        self.budget = budget
        self.keep_newest = keep_newest
        self.compact_at = compact_at
        self.keep_tokens = keep_tokens
        self.trim_to = trim_to
        self.last_view: CallView | None = None
        """The view the latest call sent."""

    @property
    def stream(self) -> str | None:
        """The stream calls are recorded on (None: not recorded)."""
        return self._stream or None

    # -- the calls -----------------------------------------------------------------------

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        with self._span() as span:
            call = await self._prepare(messages, model_settings, model_request_parameters, span)
            with span.current():
                response = await self.wrapped.request(
                    call.messages, model_settings, model_request_parameters
                )
            await self._answered(call, response, span)
            return response

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncGenerator[StreamedResponse, None]:
        with self._span() as span:
            call = await self._prepare(messages, model_settings, model_request_parameters, span)
            async with self.wrapped.request_stream(
                call.messages, model_settings, model_request_parameters, run_context
            ) as streamed:
                yield streamed
            await self._answered(call, streamed.get(), span)

    # -- the engine ----------------------------------------------------------------------

    def _span(self) -> AbstractContextManager[CallSpan]:
        summarizer = self._summarizer if self._summarizer is not None else self.wrapped
        return call_span(
            _model(self.wrapped),
            stream=self.stream,
            namespace=self._bridge.journal.namespace if self._bridge is not None else None,
            server=tm.server_of(self.wrapped.base_url),
            summarizer=_model(summarizer) if self.compact_at is not None else None,
        )

    def _engine(self, loop: asyncio.AbstractEventLoop, span: CallSpan) -> CallEngine:
        recorder = None
        if self._bridge is not None:
            recorder = CallRecorder(self._bridge.journal, self._stream, FRAMEWORK)

        async def summarize(prompt: str) -> tuple[str, Usage | None]:
            # The summarizer is a model of the agent's loop, whichever loop the journal is on.
            return await _on(loop, lambda: self._summarize(prompt))

        return CallEngine(
            recorder,
            count=approx_tokens,
            summary_message=lambda text: summary_of(text)[1],
            budget=self.budget,
            keep=self.keep_newest,
            compact_at=self.compact_at,
            keep_tokens=self.keep_tokens,
            summarize=summarize if self.compact_at is not None else None,
            starts="user",  # a trimmed view opens on a user prompt, as providers require
            trim_to=self.trim_to,
            span=span,
        )

    async def _summarize(self, prompt: str) -> tuple[str, Usage | None]:
        model = self._summarizer if self._summarizer is not None else self.wrapped
        response = await model_request(model, [ModelRequest.user_text_prompt(prompt)])
        return response.text or "", usage_of(response.usage)

    async def _prepare(
        self,
        messages: list[ModelMessage],
        settings: ModelSettings | None,
        parameters: ModelRequestParameters,
        span: CallSpan,
    ) -> _Call:
        history = history_of(messages, count=self._count, previous=self._previous)
        self._previous = history
        options = {"settings": settings_json(settings), "parameters": parameters_json(parameters)}
        base = float(-(-len(orjson.dumps(options)) // 4))
        engine = self._engine(asyncio.get_running_loop(), span)

        async def work() -> tuple[Prepared, int | None]:
            prepared = await engine.prepare(
                history.messages, base=base, tokens=history.tokens, previous=self._last
            )
            position = await engine.record(prepared, model=self.model_id, options=options)
            return prepared, position

        prepared, position = await (self._bridge.arun(work) if self._bridge else work())
        self._last = prepared
        self.last_view = prepared.view
        if span.recording:
            instructions = getattr(messages[-1], "instructions", None) if messages else None
            tools = [*parameters.function_tools, *parameters.output_tools]
            described = [
                {
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters_json_schema,
                }
                for t in tools
            ]
            span.sent(prepared.messages, position, system=instructions, tools=described)
        return _Call(_sent(prepared, history), position, prepared.view)

    async def _answered(self, call: _Call, response: ModelResponse, span: CallSpan) -> None:
        usage = usage_of(response.usage)
        answer: Message | None = answer_of(response) if span.recording else None
        span.answered(
            answer,
            model=response.model_name,
            response_id=response.provider_response_id,
            usage=usage,
            finish_reason=response.finish_reason,
        )
        if self._bridge is None or call.request is None:
            return
        recorded = answer if answer is not None else answer_of(response)
        recorder = CallRecorder(self._bridge.journal, self._stream, FRAMEWORK)
        request = call.request

        async def work() -> int:
            return await recorder.answer(
                request,
                recorded,
                model=response.model_name,
                usage=usage,
                finish_reason=response.finish_reason,
            )

        await self._bridge.arun(work)


_PROVIDERS = {
    "google-gla": "gcp.gemini",
    "google-vertex": "gcp.vertex_ai",
    "mistral": "mistral_ai",
    "bedrock": "aws.bedrock",
}


def _model(model: Model) -> SpanModel:
    """A pydantic-ai model as spans name it (its ``system`` is its provider)."""
    return SpanModel(model.model_name, _PROVIDERS.get(model.system, model.system))


def _sent(prepared: Prepared, history: History) -> list[ModelMessage]:
    summary = None
    if prepared.summary is not None:
        (decoded,) = ModelMessagesTypeAdapter.validate_python([prepared.summary.json])
        summary = decoded if isinstance(decoded, ModelRequest) else None
    return outgoing(prepared.order, history, summary)


async def _on(loop: asyncio.AbstractEventLoop, work: Callable[[], Awaitable[T]]) -> T:
    """``work()`` awaited on ``loop`` (from this loop, or another one's thread)."""
    if asyncio.get_running_loop() is loop:
        return await work()

    async def run() -> T:
        return await work()

    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), loop))
