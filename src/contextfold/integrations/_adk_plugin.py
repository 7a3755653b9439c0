"""contextfold's context engine as an ADK plugin: :class:`ContextPlugin`.

``Runner(..., plugins=[ContextPlugin(journal, budget=30_000, compact_at=60_000)])`` (or
``App(plugins=[...])``) puts the engine (``_call_engine``) before every model call of every
agent of the runner, editing the ``LlmRequest``'s contents:

- they are trimmed pair-safe to ``budget`` (a model content's function calls go with the
  content answering them);
- with ``compact_at``, when the contents behind the newest summary are over that many
  tokens, the oldest are summarized (by ``summarize``, else by the agent's own model) and
  the summary recorded as a ``CallCompacted`` with every content it replaces; later
  requests send the summary, a user content, first in their place, and the newest answer
  survives behind it;
- each request is recorded before it is sent (``CallRequested``: its contents as ADK's
  JSON, its model and config, the view that chose the contents) and each final response
  after it (``CallAnswered``, usage as ``cf.Usage``), so ``verify_calls(await
  read_calls(journal, stream))`` recomputes every request;
- an event marked as external (``custom_metadata=untrusted_metadata(actor=...)``) is sent
  as a user content whose first line names the actor.

Records go on the session's stream, ``adk/session/{app}/{user}/{session}``: on the journal
a ``JournalSessionService`` keeps the session in, beside the session's own events (the
service reads only those); with another session service, on the same name in the plugin's
journal. The session's events are not changed: what a call left out is there for the
next. Plugins run before an agent's own ``before_model_callback``: what those change after
the plugin is not in the record, and a request such a callback answers in the model's place
is recorded without an answer.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from google.adk.agents.callback_context import CallbackContext
from google.adk.agents.invocation_context import InvocationContext
from google.adk.agents.llm_agent import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.models.registry import LLMRegistry
from google.adk.plugins.base_plugin import BasePlugin
from google.genai import types

from ..context.call_records import CallRecorder
from ..context.calls import CallView
from ..errors import InvalidInputError
from ..journal import Journal
from ..wire import Usage
from ._adk_calls import (
    Count,
    History,
    answer_of,
    approx_count,
    approx_json_tokens,
    check_count,
    history_of,
    marked_contents,
    options_of,
    summary_of,
    usage_of,
)
from ._adk_records import session_stream
from ._call_engine import CallEngine, Prepared, Summarizer, check_engine_options
from ._call_spans import CallSpan
from ._call_spans import Model as SpanModel

__all__ = ["ContextPlugin"]

FRAMEWORK = "adk"
_SESSIONS = 256


@dataclass(frozen=True, slots=True)
class _Pending:
    """A recorded request waiting for its response."""

    stream: str
    position: int | None
    """Where the request was recorded (None: without a journal, not recorded)."""
    call: object
    """The model call's ``callback_context.actions``: ADK hands both callbacks of one call
    the same object, so a response is recorded only as the answer of its own call."""
    span: CallSpan


class ContextPlugin(BasePlugin):
    """Budgets, compacts and records every model call of a runner (see the module).

    ``budget`` and ``compact_at`` are in tokens as ``count_tokens`` counts one content
    (default ⌈JSON length / 4⌉); the request's config (system instruction, tools) counts as
    ⌈its JSON / 4⌉. ``keep_newest`` units are kept whatever they cost; ``keep_tokens`` of
    the newest contents stay behind a new summary. A trimmed view keeps its start while it
    fits the budget, so the prompt-cache prefix holds between trims, and is trimmed to
    ``trim_to`` of the budget when it no longer does (None: to the budget).
    ``summarize(prompt)`` returns a summary and its usage (None: the agent's model writes
    it). Without ``journal`` nothing is recorded and nothing compacted. Raises
    InvalidInputError for bad options; a request whose record cannot be written raises the
    journal's error unsent.
    """

    def __init__(
        self,
        journal: Journal | None = None,
        *,
        budget: float | None = None,
        keep_newest: int = 1,
        count_tokens: Count | None = None,
        compact_at: float | None = None,
        keep_tokens: float = 0.0,
        summarize: Summarizer | None = None,
        trim_to: float | None = 0.75,
        name: str = "contextfold",
    ) -> None:
        super().__init__(name)
        check_engine_options(budget, keep_newest, compact_at, keep_tokens, trim_to)
        if journal is not None and not isinstance(journal, Journal):
            raise InvalidInputError(
                f"ContextPlugin takes a cf.Journal (cf.open_journal), got {type(journal).__name__}"
            )
        if compact_at is not None and journal is None:
            raise InvalidInputError(
                "ContextPlugin: compaction (compact_at=) needs a journal to record it on"
            )
        self.journal = journal
        self.budget = budget
        self.keep_newest = keep_newest
        self.compact_at = compact_at
        self.keep_tokens = keep_tokens
        self.trim_to = trim_to
        self._count = approx_count if count_tokens is None else check_count(count_tokens)
        self._summarize = summarize
        # Per model call on its way (invocation, agent): a request waiting for its response.
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._previous: History | None = None
        # The last call prepared on each of the most recent sessions: a budgeted view keeps
        # its start (trim_to); the engine uses one only for a history extending its own.
        self._last: OrderedDict[str, Prepared] = OrderedDict()
        self.last_view: CallView | None = None
        """The view the latest call sent."""

    # -- ADK's callbacks -----------------------------------------------------------------

    async def before_model_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest
    ) -> LlmResponse | None:
        session = callback_context.session
        stream = session_stream(session.app_name, session.user_id, session.id)
        history = history_of(
            llm_request.contents,
            marked=marked_contents(session.events),
            count=self._count,
            previous=self._previous,
        )
        self._previous = history
        options = options_of(llm_request)
        span = self._span(stream, llm_request)
        try:
            engine = self._engine(stream, callback_context, llm_request, span)
            prepared = await engine.prepare(
                history.messages,
                base=approx_json_tokens(options),
                tokens=history.tokens,
                previous=self._last.get(stream),
            )
            position = await engine.record(prepared, model=llm_request.model or "", options=options)
        except BaseException as exc:
            span.failed(exc)
            raise
        if span.recording:
            system, tools = _described(llm_request)
            span.sent(prepared.messages, position, system=system, tools=tools)
        summary = None
        if prepared.summary is not None:
            summary = types.Content.model_validate(prepared.summary.json)
        llm_request.contents = prepared.pick(history.contents, summary)
        self._last[stream] = prepared
        self._last.move_to_end(stream)
        while len(self._last) > _SESSIONS:
            self._last.popitem(last=False)
        self.last_view = prepared.view
        key = (callback_context.invocation_id, callback_context.agent_name)
        earlier = self._pending.pop(key, None)
        if earlier is not None:  # its answer never came (a callback answered it instead)
            earlier.span.end()
        self._pending[key] = _Pending(stream, position, callback_context.actions, span)
        return None

    async def after_model_callback(
        self, *, callback_context: CallbackContext, llm_response: LlmResponse
    ) -> LlmResponse | None:
        key = (callback_context.invocation_id, callback_context.agent_name)
        pending = self._pending.get(key)
        if pending is None or pending.call is not callback_context.actions:
            return None  # a response to no request this plugin recorded
        if llm_response.partial or llm_response.content is None:
            return None
        finish = llm_response.finish_reason
        reason = None if finish is None else str(finish.value)
        usage = usage_of(llm_response.usage_metadata)
        answer = answer_of(llm_response.content)
        pending.span.answered(
            answer, model=llm_response.model_version, usage=usage, finish_reason=reason
        )
        if self.journal is not None and pending.position is not None:
            await CallRecorder(self.journal, pending.stream, FRAMEWORK).answer(
                pending.position,
                answer,
                model=llm_response.model_version,
                usage=usage,
                finish_reason=reason,
            )
        return None

    async def on_model_error_callback(
        self, *, callback_context: CallbackContext, llm_request: LlmRequest, error: Exception
    ) -> LlmResponse | None:
        pending = self._pending.pop(
            (callback_context.invocation_id, callback_context.agent_name), None
        )
        if pending is not None:
            pending.span.failed(error)
        return None

    async def after_run_callback(self, *, invocation_context: InvocationContext) -> None:
        done = invocation_context.invocation_id
        for key in [key for key in self._pending if key[0] == done]:
            self._pending.pop(key).span.end()

    # -- the engine ----------------------------------------------------------------------

    def _span(self, stream: str, llm_request: LlmRequest) -> CallSpan:
        model = _span_model(llm_request.model or "")
        summarizer = None if self.compact_at is None or self._summarize else model
        namespace = None if self.journal is None else self.journal.namespace
        return CallSpan(model, stream=stream, namespace=namespace, summarizer=summarizer)

    def _engine(
        self,
        stream: str,
        callback_context: CallbackContext,
        llm_request: LlmRequest,
        span: CallSpan,
    ) -> CallEngine:
        recorder = None if self.journal is None else CallRecorder(self.journal, stream, FRAMEWORK)

        async def by_the_agents_model(prompt: str) -> tuple[str, Usage | None]:
            return await _summarized(_model_of(callback_context, llm_request), prompt)

        count = self._count
        return CallEngine(
            recorder,
            count=lambda message: count(types.Content.model_validate(message.json)),
            summary_message=lambda text: summary_of(text)[1],
            budget=self.budget,
            keep=self.keep_newest,
            compact_at=self.compact_at,
            keep_tokens=self.keep_tokens,
            summarize=None if self.compact_at is None else self._summarize or by_the_agents_model,
            starts="user",  # Gemini refuses a first turn of function calls
            trim_to=self.trim_to,
            span=span,
        )


def _span_model(name: str) -> SpanModel:
    """A model as spans name it: ADK's own models are Google's Gemini; a LiteLLM name says
    its provider before its first slash."""
    if "/" in name:
        return SpanModel(name, name.split("/", 1)[0])
    return SpanModel(name, "gcp.gemini" if name.startswith("gemini") else "gcp.gen_ai")


def _described(llm_request: LlmRequest) -> tuple[str | None, list[dict[str, Any]]]:
    """The request's system instruction as text, and its function declarations."""
    config = llm_request.config
    instruction = config.system_instruction if config is not None else None
    if isinstance(instruction, types.Content):
        instruction = "".join(part.text or "" for part in instruction.parts or ())
    system = instruction if isinstance(instruction, str) else None
    tools = []
    for tool in (config.tools if config is not None else None) or ():
        for declared in getattr(tool, "function_declarations", None) or ():
            found: dict[str, Any] = {"name": declared.name, "description": declared.description}
            schema = declared.parameters_json_schema
            if schema is None and declared.parameters is not None:
                schema = declared.parameters.model_dump(mode="json", exclude_none=True)
            if schema is not None:
                found["parameters"] = schema
            tools.append(found)
    return system, tools


def _model_of(callback_context: CallbackContext, llm_request: LlmRequest) -> BaseLlm:
    """The model of the agent making the call (ADK resolves a model name through its
    LLMRegistry), else the request's model by name."""
    agent = callback_context.get_invocation_context().agent
    if isinstance(agent, LlmAgent):
        return agent.canonical_model
    if not llm_request.model:
        raise InvalidInputError("ContextPlugin: no model to summarize with; give summarize=")
    return LLMRegistry.new_llm(llm_request.model)


async def _summarized(model: BaseLlm, prompt: str) -> tuple[str, Usage | None]:
    request = LlmRequest(
        model=model.model,
        contents=[types.Content(role="user", parts=[types.Part(text=prompt)])],
    )
    text, usage = "", None
    async for response in model.generate_content_async(request, stream=False):
        if response.partial or response.content is None:
            continue
        text = "".join(p.text or "" for p in response.content.parts or [] if not p.thought)
        usage = usage_of(response.usage_metadata)
    return text, usage
