"""contextfold under LangChain v1's ``create_agent``: the context engine as model-call middleware.

``create_agent(model, tools, middleware=[ContextMiddleware(...)])``: around each model call
(sync or async) the middleware

- **budgets**: with ``budget=`` the model gets the newest messages that fit, dropped from
  the oldest end in whole units (a tool call goes with its results; a call missing a
  result, or a result missing its call, is never sent), the system prompt always;
- **compacts**: with ``trigger=`` (and a journal), once the messages behind the newest
  summary are over ``trigger`` tokens, a summarizer (the agent's own model, or
  ``summarizer=``) summarizes the oldest of them, keeping ``keep`` tokens of the newest and
  the newest answer; the summary is recorded as a ``CallCompacted`` with every message it
  replaces, and every later call sends it (as a human message, after the system prompt)
  in their place. Unlike LangChain's ``SummarizationMiddleware``, the graph state is not
  rewritten: the agent, its checkpointer and a later call with more room still have every
  message, and the journal has every original;
- **records** (with ``journal=``): each call as a ``CallRequested`` (its messages as
  LangChain's JSON, the system prompt, the tools as JSON schemas, the model settings, and
  the view that chose its messages) and its answer as a ``CallAnswered`` (the AIMessage,
  its ``usage_metadata`` as ``cf.Usage``), framework ``"langchain"``, so that
  ``contextfold verify`` recomputes every request's digest and choice of messages;
- **keeps trust**: a message marked with :func:`~contextfold.integrations.langgraph.
  untrusted` never reaches the model as a system message (a marked system message goes
  out as a human message).

Calls are recorded on ``stream=``, or else on the run's thread: ``stream_prefix`` (by
default ``"langgraph/"``, :class:`~contextfold.integrations.langgraph.JournalSaver`'s) plus
the ``thread_id`` of the run's config. With a JournalSaver on the same journal as
checkpointer, a thread's checkpoints and its model calls share one stream, and a
compaction holds for every later invocation of the thread.

Sync agents need a SyncJournal (``cf.open_journal_sync``); async ones take either. Needs
LangChain v1 (``pip install 'contextfold[langchain]'``); without it, importing this module
raises ImportError naming it.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

try:
    from langchain.agents.middleware import AgentMiddleware, ModelRequest, ModelResponse
except ImportError as exc:
    raise ImportError(
        "contextfold.integrations.langchain needs LangChain v1: "
        "pip install 'contextfold[langchain]'"
    ) from exc
from langchain.agents.middleware.types import ExtendedModelResponse
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, messages_from_dict
from langchain_core.runnables import RunnableConfig
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.config import get_config
from langgraph.constants import TAG_NOSTREAM

from ..canonical import canonical_json
from ..context.call_records import CallRecorder, Message
from ..context.calls import CallView, Starts
from ..errors import ContextfoldError, InvalidInputError, InvalidStreamNameError
from ..journal import Journal, SyncJournal
from ..journal.encode import check_stream
from ..wire import Usage
from ._call_engine import CallEngine, Prepared, Summarizer, check_engine_options
from ._call_spans import CallSpan, call_span
from ._call_spans import Model as SpanModel
from ._journal_bridge import JournalBridge
from ._langchain_calls import (
    FRAMEWORK,
    Conversions,
    Converted,
    approx,
    convert,
    drop_unpaired,
    model_name,
    request_options,
    summary_human,
    usage_of,
)
from ._langgraph_messages import Counter, _checked_counter

__all__ = ["ContextMiddleware", "ContextSize"]

T = TypeVar("T")

ContextSize = float | tuple[Literal["tokens", "fraction"], float]
"""A number of tokens, ``("tokens", n)``, or ``("fraction", f)`` of the model's
``profile["max_input_tokens"]`` (as LangChain's ``SummarizationMiddleware`` takes them)."""


def _checked_size(size: object, what: str) -> ContextSize | None:
    if size is None:
        return None
    if isinstance(size, tuple) and len(size) == 2:
        kind, value = size
        if kind == "messages":
            raise InvalidInputError(
                f"{what}=('messages', n): contextfold compacts by tokens; give "
                f"{what}=('tokens', n) or ('fraction', f)"
            )
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind == "tokens" and number and value > 0:
            return ("tokens", float(value))
        if kind == "fraction" and number and 0 < value <= 1:
            return ("fraction", float(value))
    elif isinstance(size, (int, float)) and not isinstance(size, bool) and size > 0:
        return float(size)
    raise InvalidInputError(
        f"{what} must be a number of tokens > 0, ('tokens', n) or ('fraction', f) with "
        f"0 < f <= 1, got {size!r}"
    )


def _tokens(size: ContextSize, model: BaseChatModel, what: str) -> float:
    if not isinstance(size, tuple):
        return size
    kind, value = size
    if kind == "tokens":
        return value
    profile = model.profile or {}
    limit = profile.get("max_input_tokens")
    if not isinstance(limit, int) or limit <= 0:
        raise InvalidInputError(
            f"{what}=('fraction', {value}) needs the model's profile['max_input_tokens'], "
            f"which {type(model).__name__} does not give: use ('tokens', n)"
        )
    return max(limit * value, 1.0)


_USER_FIRST = ("anthropic", "google", "gemini", "vertex", "bedrock")


def _starts_for(model: BaseChatModel) -> Starts:
    """Where a trimmed view may start for ``model``'s provider (see ContextMiddleware)."""
    named = f"{type(model).__name__} {getattr(model, '_llm_type', '')}".lower()
    return "user" if any(provider in named for provider in _USER_FIRST) else "any"


def _internal_call() -> dict[str, Any]:
    """LangChain's mark of a middleware's own model call (kept out of a run's messages),
    where the installed LangChain has it."""
    try:
        from langchain.agents.middleware.internal_call_transformer import internal_call_metadata
    except ImportError:  # LangChain before internal-call marks
        return {}
    return internal_call_metadata()


def _summarizer(model: BaseChatModel, loop: asyncio.AbstractEventLoop | None) -> Summarizer:
    """The summarizer calling ``model``: its sync call off the journal's loop for a sync agent
    (``loop`` None), else its async call on the agent's ``loop``, where its client lives.
    Tagged ``nostream``: the summary's tokens are not streamed to the agent's user."""
    config = RunnableConfig(tags=[TAG_NOSTREAM], metadata={"lc_source": "contextfold-compaction"})

    async def summarize(prompt: str) -> tuple[str, Usage | None]:
        if loop is None:
            answer = await asyncio.to_thread(model.invoke, prompt, config)
        elif asyncio.get_running_loop() is loop:
            answer = await model.ainvoke(prompt, config)
        else:  # on a SyncJournal's own loop
            running = asyncio.run_coroutine_threadsafe(model.ainvoke(prompt, config), loop)
            answer = await asyncio.wrap_future(running)
        usage = usage_of(answer) if isinstance(answer, AIMessage) else None
        return answer.text.strip(), usage

    return summarize


def _now(work: Coroutine[Any, Any, T]) -> T:
    # Without a journal the engine never awaits anything that suspends: run it to its end
    # here, in sync code too, rather than starting an event loop per model call.
    try:
        work.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    work.close()
    raise ContextfoldError("the context engine suspended without a journal")


def _thread_id() -> str | None:
    """The ``thread_id`` of the run's config, if any."""
    try:
        thread = (get_config().get("configurable") or {}).get("thread_id")
    except RuntimeError:  # outside a run
        return None
    return None if thread is None else str(thread)


class _Previous:
    """The last call prepared on each of the most recent streams (threads, without a
    journal): what a budgeted view keeps its start from (``trim_to``). The engine uses one
    only for a history that extends its history."""

    def __init__(self, size: int = 256) -> None:
        self._size = size
        self._calls: OrderedDict[str, Prepared] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> Prepared | None:
        with self._lock:
            return self._calls.get(key)

    def put(self, key: str, prepared: Prepared) -> None:
        with self._lock:
            self._calls[key] = prepared
            self._calls.move_to_end(key)
            if len(self._calls) > self._size:
                self._calls.popitem(last=False)


def _answer(result: Any) -> AIMessage | None:
    if isinstance(result, ExtendedModelResponse):
        result = result.model_response
    if isinstance(result, AIMessage):
        return result
    if isinstance(result, ModelResponse):
        found = [m for m in result.result if isinstance(m, AIMessage)]
        return found[-1] if found else None
    return None


@dataclass(frozen=True, slots=True)
class _Call:
    """One model call's inputs, converted."""

    history: list[Converted]
    options: dict[str, Any]
    base: float
    model: str


class ContextMiddleware(AgentMiddleware):
    """The context engine around each model call of a ``create_agent`` agent; see the module.

    ``budget`` (tokens as ``count_tokens`` counts one message; default contextfold's
    ``approx_tokens`` of its JSON) trims, ``keep_newest`` units are kept whatever they cost.
    ``trigger`` and ``keep`` (a number of tokens, ``("tokens", n)`` or ``("fraction", f)``;
    ``keep`` defaults to a quarter of ``trigger``) compact with ``summarizer`` (default: the
    agent's model); compaction needs ``journal``. ``starts`` "user" lets a trimmed view start
    only at a user message, "any" at any message no tool pair crosses; by default "user" for
    the chat models whose providers refuse a conversation opening on the model's turn
    (Anthropic, Gemini, Vertex, Bedrock), else "any". A trimmed view keeps its start while it
    fits the budget, so the prompt-cache prefix holds between trims, and when it no longer
    fits is trimmed to ``trim_to`` of the budget (None: to the budget, moving its start at
    nearly every call). :attr:`last_view` is the view the latest call sent. Raises
    InvalidInputError for bad options.
    """

    def __init__(
        self,
        *,
        budget: float | None = None,
        count_tokens: Counter | None = None,
        keep_newest: int = 1,
        trigger: ContextSize | None = None,
        keep: ContextSize | None = None,
        summarizer: BaseChatModel | None = None,
        journal: Journal | SyncJournal | None = None,
        stream: str | None = None,
        stream_prefix: str = "langgraph/",
        starts: Starts | None = None,
        trim_to: float | None = 0.75,
    ) -> None:
        super().__init__()
        self._trigger = _checked_size(trigger, "trigger")
        self._keep = _checked_size(keep, "keep")
        check_engine_options(budget, keep_newest, None, 0.0, trim_to)
        self._count = None if count_tokens is None else _checked_counter(count_tokens)
        self._conversions = Conversions(self._count)
        if self._trigger is None and (self._keep is not None or summarizer is not None):
            raise InvalidInputError("keep= and summarizer= are for compaction: give trigger= too")
        if self._trigger is not None and journal is None:
            raise InvalidInputError(
                "compaction (trigger=) is recorded on a journal: give journal= too"
            )
        if summarizer is not None and not isinstance(summarizer, BaseChatModel):
            raise InvalidInputError(
                f"summarizer must be a LangChain chat model, got {type(summarizer).__name__}"
            )
        if stream is not None and journal is None:
            raise InvalidInputError("ContextMiddleware takes stream= together with journal=")
        if not isinstance(stream_prefix, str):
            raise InvalidInputError(f"stream_prefix must be a str, got {stream_prefix!r}")
        if starts not in (None, "any", "user"):
            raise InvalidInputError(f"starts must be 'any', 'user' or None, got {starts!r}")
        self._starts = starts
        self._trim_to = trim_to
        self._previous = _Previous()
        self._bridge = (
            JournalBridge(journal, what="ContextMiddleware") if journal is not None else None
        )
        self._stream = check_stream(stream) if stream is not None else None
        self._prefix = stream_prefix
        self._budget = budget
        self._keep_newest = keep_newest
        self._summarizer = summarizer
        self.last_view: CallView | None = None

    # -- one call -------------------------------------------------------------------------------

    def _call(self, request: ModelRequest) -> _Call:
        history = drop_unpaired(self._conversions(request.messages))
        options = request_options(
            request.system_message,
            request.tools,
            request.tool_choice,
            request.model_settings,
            request.response_format,
        )
        system = request.system_message
        if self._count is None or system is None:
            base = approx(canonical_json(options))
        else:
            rest = {k: v for k, v in options.items() if k != "system"}
            base = approx(canonical_json(rest)) + self._count(system)
        return _Call(history, options, base, model_name(request.model))

    def _run_stream(self) -> str:
        if self._stream is not None:
            return self._stream
        thread = _thread_id()
        if thread is None:
            raise InvalidInputError(
                "ContextMiddleware records on stream=, or on the run's thread: invoke the "
                "agent with config={'configurable': {'thread_id': ...}}"
            )
        try:
            return check_stream(f"{self._prefix}{thread}")
        except InvalidStreamNameError as exc:
            raise InvalidStreamNameError(
                f"thread_id {thread!r} cannot name a journal stream: {exc}"
            ) from exc

    def _engine(
        self, request: ModelRequest, call: _Call, summarize: Summarizer | None, span: CallSpan
    ) -> CallEngine:
        recorder = None
        if self._bridge is not None:
            recorder = CallRecorder(self._bridge.journal, self._run_stream(), FRAMEWORK)
        compact_at = keep = None
        if self._trigger is not None:
            trigger = _tokens(self._trigger, request.model, "trigger")
            keep = trigger / 4 if self._keep is None else _tokens(self._keep, request.model, "keep")
            # The trigger counts the messages, as SummarizationMiddleware's does; the engine
            # counts the whole request.
            compact_at = trigger + call.base
        return CallEngine(
            recorder,
            count=self._count_message,
            summary_message=self._summary_message,
            budget=self._budget,
            keep=self._keep_newest,
            compact_at=compact_at,
            keep_tokens=keep or 0.0,
            summarize=summarize if compact_at is not None else None,
            starts=self._starts or _starts_for(request.model),
            trim_to=self._trim_to,
            span=span,
        )

    def _count_message(self, message: Message) -> float:
        (built,) = messages_from_dict([message.json])
        return convert(built, self._count).tokens

    def _summary_message(self, summary: str) -> Message:
        return convert(summary_human(summary), self._count).message

    async def _prepare(self, engine: CallEngine, call: _Call) -> tuple[Prepared, int | None]:
        key = engine.recorder.stream if engine.recorder is not None else _thread_id() or ""
        prepared = await engine.prepare(
            [c.message for c in call.history],
            base=call.base,
            tokens=[c.tokens for c in call.history],
            previous=self._previous.get(key),
        )
        position = await engine.record(prepared, model=call.model, options=call.options)
        self._previous.put(key, prepared)
        return prepared, position

    def _sent(
        self,
        request: ModelRequest,
        call: _Call,
        prepared: Prepared,
        span: CallSpan,
        position: int | None,
    ) -> ModelRequest:
        self.last_view = prepared.view
        if span.recording:
            system = request.system_message.text if request.system_message is not None else None
            tools = _tool_definitions(request.tools)
            span.sent(prepared.messages, position, system=system, tools=tools)
        summary: BaseMessage | None = None
        if prepared.summary is not None:
            (summary,) = messages_from_dict([prepared.summary.json])
        return request.override(messages=prepared.pick([c.sent for c in call.history], summary))

    async def _record_answer(self, engine: CallEngine, position: int, result: Any) -> None:
        answer = _answer(result)
        if engine.recorder is None or answer is None:
            return
        meta = answer.response_metadata or {}
        finish = meta.get("finish_reason") or meta.get("stop_reason")
        await engine.recorder.answer(
            position,
            self._conversions([answer])[0].message,  # the next call finds it converted
            model=meta.get("model_name") if isinstance(meta.get("model_name"), str) else None,
            usage=usage_of(answer),
            finish_reason=finish if isinstance(finish, str) else None,
        )

    def wrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], ModelResponse],
    ) -> Any:
        call = self._call(request)
        summarize = _summarizer(self._summarizer or request.model, None)
        with self._span(request) as span:
            engine = self._engine(request, call, summarize, span)
            if self._bridge is None:
                prepared, position = _now(self._prepare(engine, call))
            else:
                prepared, position = self._bridge.run(
                    functools.partial(self._prepare, engine, call)
                )
            sent = self._sent(request, call, prepared, span, position)
            with span.current():
                result = handler(sent)
            if self._bridge is not None and position is not None:
                self._bridge.run(functools.partial(self._record_answer, engine, position, result))
            self._answered(span, result)
            return result

    async def awrap_model_call(
        self,
        request: ModelRequest,
        handler: Callable[[ModelRequest], Awaitable[ModelResponse]],
    ) -> Any:
        call = self._call(request)
        loop = asyncio.get_running_loop()
        summarize = _summarizer(self._summarizer or request.model, loop)
        with self._span(request) as span:
            engine = self._engine(request, call, summarize, span)
            if self._bridge is None:
                prepared, position = _now(self._prepare(engine, call))
            else:
                prepared, position = await self._bridge.arun(
                    functools.partial(self._prepare, engine, call)
                )
            sent = self._sent(request, call, prepared, span, position)
            with span.current():
                result = await handler(sent)
            if self._bridge is not None and position is not None:
                await self._bridge.arun(
                    functools.partial(self._record_answer, engine, position, result)
                )
            self._answered(span, result)
            return result

    # -- its span -------------------------------------------------------------------------------

    def _span(self, request: ModelRequest) -> AbstractContextManager[CallSpan]:
        stream = self._run_stream() if self._bridge is not None else self._stream or _thread_id()
        return call_span(
            _span_model(request.model),
            stream=stream,
            namespace=self._bridge.journal.namespace if self._bridge is not None else None,
            summarizer=None
            if self._trigger is None
            else _span_model(self._summarizer or request.model),
        )

    def _answered(self, span: CallSpan, result: Any) -> None:
        answer = _answer(result)
        if answer is None:
            span.answered(None)
            return
        meta = answer.response_metadata or {}
        finish = meta.get("finish_reason") or meta.get("stop_reason")
        model, found = meta.get("model_name"), meta.get("id")
        span.answered(
            self._conversions([answer])[0].message if span.recording else None,
            model=model if isinstance(model, str) else None,
            response_id=found if isinstance(found, str) else answer.id,
            usage=usage_of(answer),
            finish_reason=finish if isinstance(finish, str) else None,
        )


# LangChain's ls_provider names, where the GenAI conventions name the provider otherwise.
_PROVIDERS = {
    "google_genai": "gcp.gemini",
    "google_vertexai": "gcp.vertex_ai",
    "bedrock": "aws.bedrock",
    "amazon_bedrock": "aws.bedrock",
    "mistralai": "mistral_ai",
    "azure": "azure.ai.openai",
    "xai": "x_ai",
}


def _span_model(model: BaseChatModel) -> SpanModel:
    """A chat model as spans name it: its provider is LangChain's ``ls_provider``."""
    try:
        provider = model._get_ls_params().get("ls_provider")
    except Exception:  # a model of the user's own may not have LangSmith parameters
        provider = None
    if not isinstance(provider, str):
        provider = None
    return SpanModel(model_name(model), _PROVIDERS.get(provider or "", provider))


def _tool_definitions(tools: Any) -> list[dict[str, Any]]:
    """The request's tools as name, description and parameters (a tool LangChain cannot
    convert is named only)."""
    found = []
    for tool in tools or ():
        try:
            function = convert_to_openai_tool(tool)["function"]
        except Exception:  # not a tool LangChain converts: only its name, if it has one
            name = getattr(tool, "name", None) or (
                tool.get("name") if isinstance(tool, dict) else None
            )
            function = {"name": name}
        found.append(function)
    return found
