"""A model through which the SDK's requests are contextfold requests: :class:`JournalModel`.

Each call of the SDK's ``Runner`` becomes, on one stream, what contextfold's own agent
records: the input items the stream has not seen as ``cf.ContextAdded`` items (a tool
output as ``cf.ToolCallResult`` with its item, written as the runtime's tool writer), an
``cf.LlmRequestRequested`` with the header (instructions as the system prompt, tools,
structured output, model, sampling) in one append with the rendered body's
``cf.RequestRecorded`` hash, then the model's ``cf.LlmResponse`` with its assistant item.
The body is rendered by contextfold from the journal and sent as those exact bytes by a
contextfold model client (``cf.OpenAIResponsesModel``, ``cf.OpenAIChatModel``,
``cf.AnthropicModel``, ``cf.FunctionModel``), so ``cf.verify_requests`` rebuilds every
request byte for byte and trust rules apply on the wire (user input never reaches the
model as system or developer text).

What the model sees is contextfold's view of the stream, not the SDK's input: the input
only tells which items are new (see :mod:`._openai_agents_input`), so a session with a
limit, a budget or its own compaction works, and so does a run without a session. With
``budget`` or ``compact_at`` the history is bounded by contextfold's compaction by cutoff
(see :mod:`._model_budget`): older steps give way to a note or to a summary written by
the model, recorded as compaction items whose originals stay in the journal.

A stream holds one conversation. Input that does not fit contextfold's wire model (images,
files, reasoning, hosted tools, server-side conversation state) is refused with an error
naming it. Each call makes the OpenTelemetry spans of contextfold's agent loop: a turn,
its ``chat {model}`` requests and its compactions (``runtime.spans``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from agents import FunctionTool, Handoff, Model, ModelResponse, ModelSettings, Tool, Usage
from agents.agent_output import AgentOutputSchemaBase
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import ModelTracing
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails
from pydantic import ValidationError

from ..context.compaction import summary_item
from ..context.events import LlmRequestRequested, LlmResponse, RequestHeader, assistant_item
from ..context.projection import AGENT_WRITER, AgentContext
from ..context.rebuild import RequestRecorded
from ..context.request import Built, build
from ..context.state import AgentContextState
from ..context.trust import trusted_extensions
from ..errors import InvalidInputError, RenderError, StoreError, WrongExpectedVersionError
from ..events import NewEvent, StoredEvent
from ..journal import Journal, SyncJournal
from ..journal.encode import check_stream
from ..runtime.clients import ModelClient, clock_of, developer_role_of
from ..runtime.events import (
    CompactionFinished,
    CompactionStarted,
    RequestFailed,
    RequestSent,
    ResponseRecorded,
)
from ..runtime.spans import LoopSpans, client_server
from ..views.view import check_budget
from ..wire import (
    ModelOutput,
    NeutralRequest,
    OutputSchema,
    RenderedRequest,
    ToolDefinition,
    render_request,
)
from ..wire import Usage as CfUsage
from ._journal_bridge import JournalBridge
from ._model_budget import body_tokens, choose_cutoff, summary_request, trim_note
from ._openai_agents_input import (
    MODEL_RECORD,
    ModelInputRecorded,
    ModelRecord,
    continuation,
    input_events,
)

__all__ = ["OUTPUT_NAME", "JournalModel"]

_ATTEMPTS = 16  # request appends retried while other writers move the stream
OUTPUT_NAME = "final_output"
"""The name a structured output goes out with: the SDK's own for its models."""


def _tool(tool: Tool) -> ToolDefinition:
    if not isinstance(tool, FunctionTool):
        raise RenderError(
            f"tool {getattr(tool, 'name', tool)!r} ({type(tool).__name__}) is not in "
            "contextfold's wire model: only function tools are"
        )
    return ToolDefinition(
        name=tool.name,
        description=tool.description or "",
        parameters=tool.params_json_schema,
        strict=tool.strict_json_schema,
    )


def _handoff(handoff: Handoff[Any, Any]) -> ToolDefinition:
    return ToolDefinition(
        name=handoff.tool_name,
        description=handoff.tool_description or "",
        parameters=handoff.input_json_schema,
        strict=handoff.strict_json_schema,
    )


def _output_schema(schema: AgentOutputSchemaBase | None) -> OutputSchema | None:
    if schema is None or schema.is_plain_text():
        return None
    return OutputSchema.from_schema(
        name=OUTPUT_NAME, schema=schema.json_schema(), strict=schema.is_strict_json_schema()
    )


# -- contextfold answer -> SDK ----------------------------------------------------------------


def _usage(usage: CfUsage) -> Usage:
    return Usage(
        requests=1,
        input_tokens=usage.input_tokens,
        input_tokens_details=InputTokensDetails.model_validate(
            {
                "cached_tokens": usage.cached_input_tokens or 0,
                "cache_write_tokens": usage.cache_write_tokens or 0,
            }
        ),
        output_tokens=usage.output_tokens,
        output_tokens_details=OutputTokensDetails(reasoning_tokens=usage.reasoning_tokens or 0),
        total_tokens=usage.input_tokens + usage.output_tokens,
    )


def _output(offset: int, response: LlmResponse) -> list[TResponseOutputItem]:
    items: list[TResponseOutputItem] = []
    if response.text or not response.tool_calls:
        text = ResponseOutputText(type="output_text", text=response.text, annotations=[])
        items.append(
            ResponseOutputMessage(
                id=f"msg_cf_{offset}",
                type="message",
                role="assistant",
                status="completed",
                content=[text],
            )
        )
    items.extend(
        ResponseFunctionToolCall(
            id=f"fc_cf_{offset}_{index}",
            type="function_call",
            call_id=call.id,
            name=call.name,
            arguments=call.arguments or "{}",
            status="completed",
        )
        for index, call in enumerate(response.tool_calls)
    )
    return items


# -- steps of a call --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Prepared:
    """A request recorded and ready to send."""

    offset: int
    neutral: NeutralRequest
    rendered: RenderedRequest


@dataclass(frozen=True, slots=True)
class _Summarize:
    """A compaction to make first: request @cutoff plus the instruction, to summarize."""

    cutoff: int
    neutral: NeutralRequest
    rendered: RenderedRequest


@dataclass(frozen=True, slots=True)
class _Taken:
    """A call's input, taken in: its new items as the events they are (encoded, each with
    its writer, appended with the request), the digests its request records, and whether
    it brought new user input (a new turn)."""

    events: tuple[NewEvent, ...]
    digests: tuple[str, ...]
    new_input: bool


class JournalModel(Model):
    """An SDK ``Model`` (give it to ``Agent(model=...)``) through which contextfold renders,
    records and sends every request on ``stream`` (see the module docstring).

    ``client`` is a contextfold model client, which sends the rendered bytes as they are.
    ``journal`` is a :class:`~contextfold.Journal` or :class:`~contextfold.SyncJournal`.
    ``budget``: the most input tokens a request may carry (its body's bytes / 4); over it,
    the oldest whole steps are left out behind a note. ``compact_at``: over it, they are
    summarized by the model first. ``keep_tokens``: the newest history either keeps
    verbatim (default: half of the smaller of the two). Raises InvalidInputError for a bad
    argument; a call raises RenderError for input that does not fit contextfold's wire
    model, before anything is sent.
    """

    def __init__(
        self,
        client: ModelClient,
        journal: Journal | SyncJournal,
        stream: str,
        *,
        budget: float | None = None,
        compact_at: float | None = None,
        keep_tokens: float | None = None,
    ) -> None:
        if not callable(getattr(client, "complete", None)) or not getattr(client, "model", None):
            raise InvalidInputError(
                f"JournalModel takes a contextfold model client (cf.OpenAIResponsesModel, "
                f"cf.FunctionModel, …), got {type(client).__name__}"
            )
        self.client = client
        self._bridge = JournalBridge(journal, what="JournalModel")
        self.stream = check_stream(stream)
        self.budget = None if budget is None else check_budget(budget)
        self.compact_at = (
            None if compact_at is None else check_budget(compact_at, name="compact_at")
        )
        limits = [limit for limit in (self.budget, self.compact_at) if limit is not None]
        if keep_tokens is not None:
            if isinstance(keep_tokens, bool) or not isinstance(keep_tokens, (int, float)):
                raise InvalidInputError(f"keep_tokens must be a number, got {keep_tokens!r}")
            if not keep_tokens >= 0:
                raise InvalidInputError(f"keep_tokens must be >= 0, got {keep_tokens!r}")
        self.keep_tokens = keep_tokens if keep_tokens is not None else min(limits, default=0) / 2
        # The build and body of the request this model sent last on its stream: the next
        # request reuses them (an unrelated one only costs a fresh build), so a call costs
        # what it adds to the conversation, not its length.
        self._last: tuple[Built, RenderedRequest] | None = None
        self._version: int | None = None  # the stream's version after this model's append
        self._spans = LoopSpans(
            self._bridge.journal.namespace,
            self.stream,
            client.model,
            client.transport,
            server=client_server(client),
        )
        self._turn = False  # whether a turn span is open

    def __repr__(self) -> str:
        return f"<JournalModel {self.client.model!r} on {self.stream!r}>"

    @property
    def journal(self) -> Journal:
        return self._bridge.journal

    def _header(
        self,
        instructions: str | None,
        settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        server_state: dict[str, Any],
    ) -> RequestHeader:
        given = {name: value for name, value in server_state.items() if value is not None}
        if given:
            raise RenderError(
                f"{', '.join(sorted(given))}: server-side conversation state is not in "
                "contextfold's wire model (the journal holds the conversation)"
            )
        try:
            return RequestHeader(
                transport=self.client.transport,
                model=self.client.model,
                system_prompt=instructions or None,
                tools=(*(_tool(tool) for tool in tools), *(_handoff(h) for h in handoffs)),
                max_tokens=settings.max_tokens,
                temperature=settings.temperature,
                output_schema=_output_schema(output_schema),
                trusted_actor_types=trusted_extensions(),
                developer_role=developer_role_of(self.client),
                layout=2,
                clock=clock_of(self.client),
            )
        except ValidationError as exc:
            raise RenderError(f"the request header cannot be recorded: {exc}") from exc

    # -- on the journal's loop ----------------------------------------------------------------

    async def _known_version(self) -> int:
        if self._version is None:
            self._version = await self.journal.version(self.stream)
        return self._version

    async def _take(self, items: list[Any]) -> _Taken:
        """The items of ``items`` new to the stream, as events (nothing is appended)."""
        journal = self.journal
        record: ModelRecord = await journal.fold(MODEL_RECORD, self.stream)
        taken = continuation(record, items)
        groups = input_events(items[taken.new :], taken.new, record.names)
        events = tuple(
            new for group in groups for new in journal.encode(group.events, actor=group.writer)
        )
        new_input = any(
            group.writer is None and getattr(event, "role", None) == "user"
            for group in groups
            for event in group.events
        )
        return _Taken(events, taken.digests, new_input)

    def _ahead(
        self, context: AgentContextState, events: tuple[NewEvent, ...], version: int
    ) -> AgentContextState:
        """``context`` with ``events`` folded in as if appended after ``version``: what the
        request is built from before the one append that stores them with it."""
        namespace, stream = self.journal.namespace, self.stream
        for position, new in enumerate(events, start=version + 1):
            stored = StoredEvent.appended(namespace, stream, 0, position, new)
            envelope = AgentContext.decode(stored)
            if envelope is not None:
                context = AgentContext.apply(context, envelope)
        return context

    def _build(
        self, context: AgentContextState, header: RequestHeader, time: str
    ) -> tuple[Built, RenderedRequest]:
        last = self._last
        built = build(context, header, timestamp=time, previous=last[0] if last else None)
        rendered = render_request(
            built.request, header.transport, previous=last[1] if last else None
        )
        self._last = (built, rendered)
        return built, rendered

    async def _decide(
        self, header: RequestHeader, taken: _Taken, *, summarize: bool
    ) -> _Prepared | _Summarize:
        """Record the input's items and the request in one append (after a note when it is
        over the budget) and return it, or the summary to make first when it is over
        ``compact_at`` (and ``summarize``)."""
        journal, stream = self.journal, self.stream
        version = await self._known_version()
        trimmed = False
        for _ in range(_ATTEMPTS):
            context = self._ahead(await journal.fold(AgentContext, stream), taken.events, version)
            logged = None if context.header == header else header
            [request] = journal.encode(
                LlmRequestRequested(header=logged, reason="openai-agents"), actor=AGENT_WRITER
            )
            if logged is not None:  # what a rebuild reads: the stored bytes
                stored = LlmRequestRequested.model_validate_json(request.data).header
                header = stored if stored is not None else header
            built, rendered = self._build(context, header, request.meta.time)
            tokens = body_tokens(rendered)
            if summarize and self.compact_at is not None and tokens > self.compact_at:
                step = await self._summary(context)
                if step is not None:
                    return step
                summarize = False
            if not trimmed and self.budget is not None and tokens > self.budget:
                trimmed, summarize = True, False
                cutoff = choose_cutoff(context, keep_tokens=self.keep_tokens)
                if cutoff is not None:
                    note = trim_note(context, cutoff)
                    self._spans.on_event(CompactionStarted(offset=cutoff))
                    version = await self._compacted(cutoff, note, None)
                    self._spans.on_event(CompactionFinished(offset=cutoff, summary=note))
                    continue
            offset = version + len(taken.events) + 2  # the items, the input record, then it
            recorded = RequestRecorded(
                request_offset=offset,
                transport=rendered.transport,
                sha256=rendered.sha256,
                size=len(rendered.body),
            )
            events = [
                *taken.events,
                *journal.encode(ModelInputRecorded(digests=taken.digests), actor=AGENT_WRITER),
                request,
                *journal.encode(recorded, actor=AGENT_WRITER, channels=()),
            ]
            try:
                appended = await journal.append(stream, events, expected_version=version)
            except WrongExpectedVersionError as exc:
                version = exc.actual  # another writer moved the stream: build it again
                continue
            self._version = appended.last_position
            return _Prepared(offset, built.request, rendered)
        raise StoreError(f"stream {stream!r} moved under {_ATTEMPTS} request appends in a row")

    async def _summary(self, context: AgentContextState) -> _Summarize | None:
        cutoff = choose_cutoff(context, keep_tokens=self.keep_tokens)
        if cutoff is None:
            return None
        neutral = await summary_request(
            self.journal, self.stream, context, cutoff, self.client.transport
        )
        if neutral is None:
            return None
        return _Summarize(cutoff, neutral, render_request(neutral, self.client.transport))

    async def _compacted(self, cutoff: int, text: str, usage: CfUsage | None) -> int:
        """Append the compaction item replacing history through @cutoff; the new version."""
        item = summary_item(text, cutoff=cutoff, usage=usage)
        appended = await self.journal.append(self.stream, item, actor=AGENT_WRITER)
        self._version = appended.last_position
        return appended.last_position

    async def _record(self, offset: int, output: ModelOutput) -> LlmResponse:
        response = LlmResponse(
            request_offset=offset,
            model=self.client.model,
            text=output.text,
            tool_calls=output.tool_calls,
            usage=output.usage,
            stop_reason=output.finish_reason,
        )
        item = assistant_item(response)
        appended = await self.journal.append(self.stream, [response, item], actor=AGENT_WRITER)
        self._version = appended.last_position
        return response

    # -- on the caller's loop -----------------------------------------------------------------

    async def _prepare(self, header: RequestHeader, items: list[Any]) -> _Prepared:
        """Take the input in, compact when it is due, and record the request."""
        arun = self._bridge.arun
        taken: _Taken = await arun(lambda: self._take(items))
        if taken.new_input or not self._turn:
            if self._turn:
                self._spans.end_turn("stopped", "new input came before an answer")
            self._spans.start_turn()
            self._turn = True
        step = await arun(lambda: self._decide(header, taken, summarize=True))
        if isinstance(step, _Prepared):
            return step
        # The summarizer is the model itself, called on the caller's loop like any request.
        cutoff = step.cutoff
        self._spans.on_event(CompactionStarted(offset=cutoff, rendered=step.rendered))
        output = await self.client.complete(step.neutral, step.rendered)
        text = output.text or trim_note(await arun(self._context), cutoff)
        await arun(lambda: self._compacted(cutoff, text, output.usage))
        self._spans.on_event(CompactionFinished(offset=cutoff, summary=text, usage=output.usage))
        done = await arun(lambda: self._decide(header, taken, summarize=False))
        assert isinstance(done, _Prepared)  # no second summary is asked for
        return done

    async def _context(self) -> AgentContextState:
        return await self.journal.fold(AgentContext, self.stream)

    async def _respond(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        server_state: dict[str, Any],
    ) -> ModelResponse:
        header = self._header(
            system_instructions, model_settings, tools, output_schema, handoffs, server_state
        )
        items: list[Any] = (
            [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        )
        prepared = await self._prepare(header, items)
        spans = self._spans
        spans.on_event(
            RequestSent(
                offset=prepared.offset, rendered=prepared.rendered, neutral=prepared.neutral
            )
        )
        try:
            # The provider call runs on the caller's loop (its client lives there).
            output = await self.client.complete(prepared.neutral, prepared.rendered)
            output = replace(output, tool_calls=tuple(output.tool_calls))
            response: LlmResponse = await self._bridge.arun(
                lambda: self._record(prepared.offset, output)
            )
        except Exception as exc:
            spans.on_event(RequestFailed(offset=prepared.offset, error=exc))
            spans.end_turn("stopped", f"request @{prepared.offset} failed")
            self._turn = False
            raise
        spans.on_event(ResponseRecorded(offset=prepared.offset, output=output))
        if not output.tool_calls:
            spans.end_turn("idle", "answered")
            self._turn = False
        return ModelResponse(
            output=_output(prepared.offset, response),
            usage=_usage(output.usage or CfUsage()),
            response_id=None,
        )

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        """One request: recorded, rendered, sent, and its answer recorded."""
        state = {
            "previous_response_id": previous_response_id,
            "conversation_id": conversation_id,
            "prompt": prompt,
        }
        return await self._respond(
            system_instructions, input, model_settings, tools, output_schema, handoffs, state
        )

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff[Any, Any]],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        """The same request as :meth:`get_response`, its answer as one completed event."""
        state = {
            "previous_response_id": previous_response_id,
            "conversation_id": conversation_id,
            "prompt": prompt,
        }
        answer = await self._respond(
            system_instructions, input, model_settings, tools, output_schema, handoffs, state
        )
        response = Response(
            id="contextfold",
            created_at=0,
            model=self.client.model,
            object="response",
            output=answer.output,
            tool_choice="auto",
            tools=[],
            parallel_tool_calls=True,
            status="completed",
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )
