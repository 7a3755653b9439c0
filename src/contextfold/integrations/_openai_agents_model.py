"""A model through which the SDK's requests are contextfold requests: :class:`JournalModel`.

Each call of the SDK's ``Runner`` becomes, on one stream, what contextfold's own agent
records: the input items the stream has not seen as ``cf.ContextAdded`` items (a tool
output as ``cf.ToolCallResult`` with its item, written as the runtime's tool writer), an
``cf.LlmRequestRequested`` with the header (instructions as the system prompt, tools,
model, sampling), the rendered body's ``cf.RequestRecorded`` hash, then the model's
``cf.LlmResponse`` with its assistant item. The body is rendered by contextfold and sent
as those exact bytes by a contextfold model client (``cf.OpenAIResponsesModel``,
``cf.OpenAIChatModel``, ``cf.AnthropicModel``, ``cf.FunctionModel``), so
``cf.verify_requests`` rebuilds every request byte for byte and trust rules apply on the
wire (user input never reaches the model as system or developer text).

A stream holds one conversation: each call's input must continue what the stream recorded
(the previous input, the model's answer, then new items), as the Runner's input does with
a session that keeps the whole history, or without a session within one run. Input that
does not fit contextfold's wire model (images, files, reasoning, hosted tools, structured
output, server-side conversation state) is refused with an error naming it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
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
from pyrsistent import PMap, PVector, pmap, pvector

from ..canonical import canonical_json, sha256_hex
from ..context.events import (
    Actor,
    ContextAdded,
    LlmRequestRequested,
    LlmResponse,
    RequestHeader,
    ToolCallResult,
    assistant_item,
    tool_result_item,
)
from ..context.projection import AGENT_WRITER, TOOL_WRITER, AgentContext
from ..context.rebuild import RequestRecorded
from ..context.request import Built, build
from ..context.trust import trusted_extensions
from ..errors import InvalidInputError, RenderError
from ..events import Envelope, Event
from ..folds.fold import Fold
from ..journal import Journal, SyncJournal
from ..journal.encode import check_stream
from ..runtime.clients import ModelClient, clock_of, developer_role_of
from ..wire import (
    ModelOutput,
    NeutralRequest,
    RenderedRequest,
    ToolCall,
    ToolDefinition,
    render_request,
)
from ..wire import Usage as CfUsage
from ._journal_bridge import JournalBridge

__all__ = ["MODEL_RECORD", "JournalModel", "ModelInputRecorded", "ModelRecord"]


class ModelInputRecorded(Event, type="openai-agents/model-input", runtime_only=True):
    """The SDK input items a request accounted for (after those before it), by the SHA-256
    of each item's canonical JSON, in order: what the next request's input must start with."""

    digests: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ModelRecord:
    """What a stream's requests saw: the digest of every input item so far, the model's
    newest answer as the items the SDK will replay (``("message", text)``,
    ``("function_call", call_id)``), and each call's tool name."""

    digests: PVector[str] = field(default_factory=lambda: pvector())
    answer: tuple[tuple[str, str], ...] = ()
    names: PMap[str, str] = field(default_factory=lambda: pmap())


MODEL_RECORD: Fold[ModelRecord] = Fold(
    "openai_agents_model_record", initial=ModelRecord, checkpoints=False
)


@MODEL_RECORD.on(ModelInputRecorded)
def _input(record: ModelRecord, ev: Envelope[ModelInputRecorded]) -> ModelRecord:
    return ModelRecord(record.digests.extend(ev.payload.digests), (), record.names)


@MODEL_RECORD.on(LlmResponse)
def _answer(record: ModelRecord, ev: Envelope[LlmResponse]) -> ModelRecord:
    calls = ev.payload.tool_calls
    answer = [("message", ev.payload.text)] if ev.payload.text or not calls else []
    answer.extend(("function_call", call.id) for call in calls)
    names = record.names.update({call.id: call.name for call in calls})
    return ModelRecord(record.digests, tuple(answer), names)


# -- SDK request -> contextfold ---------------------------------------------------------------


def _digest(item: Any, index: int) -> str:
    try:
        return sha256_hex(canonical_json(item))
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"input[{index}] is not JSON: {exc}") from exc


def _text(content: Any, index: int, parts: tuple[str, ...]) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in parts:
                raise RenderError(
                    f"input[{index}]: a {kind!r} content part is not in contextfold's wire "
                    f"model (text only: {', '.join(parts)})"
                )
            texts.append(str(part.get("text", "")))
        return "".join(texts)
    raise RenderError(f"input[{index}]: message content must be text, got {content!r:.60}")


def _matches(item: Any, expected: tuple[str, str]) -> bool:
    kind, key = expected
    if not isinstance(item, dict):
        return False
    if kind == "function_call":
        return item.get("type") == "function_call" and item.get("call_id") == key
    return (
        item.get("role") == "assistant"
        and item.get("type", "message") == "message"
        and _text(item.get("content", ""), 0, ("output_text", "input_text", "text")) == key
    )


@dataclass(frozen=True, slots=True)
class _Group:
    """Events of one append, all by one journal writer."""

    writer: str | None
    events: tuple[Event, ...]


def _events(items: Sequence[Any], first: int, names: PMap[str, str]) -> list[_Group]:
    """The contextfold events of new input items, grouped by journal writer in order."""
    groups: list[_Group] = []

    def add(writer: str | None, *events: Event) -> None:
        if groups and groups[-1].writer == writer:
            groups[-1] = _Group(writer, (*groups[-1].events, *events))
        else:
            groups.append(_Group(writer, events))

    calls: dict[str, str] = {}  # the calls of these items; earlier ones are in names
    for offset, item in enumerate(items):
        index = first + offset
        if not isinstance(item, dict):
            raise RenderError(f"input[{index}] is a {type(item).__name__}, not an input item")
        kind = item.get("type", "message")
        try:
            if kind == "message" and item.get("role") in ("user", "system", "developer"):
                role = item["role"]
                text = _text(item.get("content"), index, ("input_text", "text"))
                actor = Actor(type="user") if role == "user" else None
                add(None, ContextAdded(role=role, content=text, actor=actor))
            elif kind == "message" and item.get("role") == "assistant":
                text = _text(item.get("content"), index, ("output_text", "input_text", "text"))
                add(None, ContextAdded(role="assistant", content=text))
            elif kind == "function_call":
                call = ToolCall(
                    id=item["call_id"], name=item["name"], arguments=item.get("arguments", "")
                )
                calls[call.id] = call.name
                # Another model's call: the projection sends it as text, never as a call.
                add(None, ContextAdded(role="assistant", tool_calls=(call,)))
            elif kind == "function_call_output":
                content = _text(item.get("output"), index, ("input_text",))
                result = ToolCallResult(
                    tool_call_id=item["call_id"],
                    name=calls.get(item["call_id"]) or names.get(item["call_id"], "unknown"),
                    content=content,
                )
                add(TOOL_WRITER, result, tool_result_item(result))
            else:
                raise RenderError(
                    f"input[{index}]: a {kind!r} item is not in contextfold's wire model "
                    "(messages, function calls and their outputs)"
                )
        except (KeyError, ValidationError) as exc:
            raise RenderError(f"input[{index}] ({kind}) is malformed: {exc}") from exc
    return groups


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


@dataclass(frozen=True, slots=True)
class _Prepared:
    offset: int
    neutral: NeutralRequest
    rendered: RenderedRequest


class JournalModel(Model):
    """An SDK ``Model`` (give it to ``Agent(model=...)``) through which contextfold renders,
    records and sends every request on ``stream`` (see the module docstring).

    ``client`` is a contextfold model client, which sends the rendered bytes as they are.
    ``journal`` is a :class:`~contextfold.Journal` or :class:`~contextfold.SyncJournal`.
    Raises InvalidInputError for a bad argument; a call raises RenderError for input that
    does not fit contextfold's wire model and InvalidInputError for input that does not
    continue the stream's conversation, before anything is sent.
    """

    def __init__(self, client: ModelClient, journal: Journal | SyncJournal, stream: str) -> None:
        if not callable(getattr(client, "complete", None)) or not getattr(client, "model", None):
            raise InvalidInputError(
                f"JournalModel takes a contextfold model client (cf.OpenAIResponsesModel, "
                f"cf.FunctionModel, …), got {type(client).__name__}"
            )
        self.client = client
        self._bridge = JournalBridge(journal, what="JournalModel")
        self.stream = check_stream(stream)
        # The build and body of the request this model sent last on its stream: the next
        # request reuses them (an unrelated one only costs a fresh build), so a call costs
        # what it adds to the conversation, not its length.
        self._last: tuple[Built, RenderedRequest] | None = None

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
        if output_schema is not None and not output_schema.is_plain_text():
            raise RenderError(
                "structured output (an output_type) is not in contextfold's wire model"
            )
        try:
            return RequestHeader(
                transport=self.client.transport,
                model=self.client.model,
                system_prompt=instructions or None,
                tools=(*(_tool(tool) for tool in tools), *(_handoff(h) for h in handoffs)),
                max_tokens=settings.max_tokens,
                temperature=settings.temperature,
                trusted_actor_types=trusted_extensions(),
                developer_role=developer_role_of(self.client),
                layout=2,
                clock=clock_of(self.client),
            )
        except ValidationError as exc:
            raise RenderError(f"the request header cannot be recorded: {exc}") from exc

    async def _prepare(self, header: RequestHeader, items: list[Any]) -> _Prepared:
        journal, stream = self.journal, self.stream
        record = await journal.fold(MODEL_RECORD, stream)
        seen = len(record.digests)
        digests = [_digest(item, index) for index, item in enumerate(items)]
        if len(items) < seen or any(digests[i] != record.digests[i] for i in range(seen)):
            at = next(
                (i for i in range(min(seen, len(items))) if digests[i] != record.digests[i]),
                min(seen, len(items)),
            )
            raise InvalidInputError(
                f"JournalModel: the input ({len(items)} items) does not continue the "
                f"conversation stream {stream!r} recorded ({seen} items) at input[{at}]: "
                "give each conversation its own stream, and a session that keeps the whole "
                "history (no limit or budget: contextfold's context is the history)"
            )
        start = seen
        for expected in record.answer:  # the model's newest answer, as the SDK replays it
            if start < len(items) and _matches(items[start], expected):
                start += 1
            else:
                raise InvalidInputError(
                    f"JournalModel: input[{start}] is not the model's answer {expected[0]} "
                    f"{expected[1]!r:.60} that stream {stream!r} recorded last"
                )
        groups = _events(items[start:], start, record.names)
        # A retry after a crash between these appends makes the same keys: nothing twice.
        base = "|".join((stream, str(seen), *digests[seen:]))
        for index, group in enumerate(groups):
            key = f"openai-agents:model:{sha256_hex(f'{base}|{index}')}"
            await journal.append(stream, group.events, actor=group.writer, idempotency_key=key)
        context = await journal.fold(AgentContext, stream)
        logged = None if context.header == header else header
        request = LlmRequestRequested(header=logged, reason="openai-agents")
        appended = await journal.append(
            stream,
            [ModelInputRecorded(digests=tuple(digests[seen:])), request],
            actor=AGENT_WRITER,
        )
        offset = appended.last_position
        context = await journal.fold(AgentContext, stream)
        last = self._last
        built = build(context, through=offset, previous=last[0] if last else None)
        neutral = built.request
        rendered = render_request(neutral, header.transport, previous=last[1] if last else None)
        self._last = (built, rendered)
        await journal.append(
            stream,
            RequestRecorded(
                request_offset=offset,
                transport=rendered.transport,
                sha256=rendered.sha256,
                size=len(rendered.body),
            ),
            actor=AGENT_WRITER,
            channels=(),
        )
        return _Prepared(offset, neutral, rendered)

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
        await self.journal.append(self.stream, [response, item], actor=AGENT_WRITER)
        return response

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
        prepared: _Prepared = await self._bridge.arun(lambda: self._prepare(header, items))
        # The provider call runs on the caller's loop (its client lives there), not the journal's.
        output = await self.client.complete(prepared.neutral, prepared.rendered)
        output = replace(output, tool_calls=tuple(output.tool_calls))
        response: LlmResponse = await self._bridge.arun(
            lambda: self._record(prepared.offset, output)
        )
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
