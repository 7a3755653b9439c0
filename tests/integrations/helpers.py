"""Helpers of the integration tests: journals per backend, a probing store, a small LangGraph
agent, a scripted OpenAI Agents model and the pydantic-ai parts of every kind."""

from __future__ import annotations

import json
import re
import threading
import typing
import warnings
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from agents import Model, ModelSettings, Tool, Usage, set_tracing_disabled
from agents import ModelResponse as AgentsModelResponse
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import ModelTracing
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic_ai.messages import (
    AgentInstructionSource,
    AudioUrl,
    BinaryContent,
    CachePoint,
    CapabilityLoadDeltaPart,
    Citation,
    CompactionPart,
    ContentCitationAnchor,
    DocumentCitationSource,
    DocumentUrl,
    FilePart,
    ImageUrl,
    InstructionBaselinePart,
    InstructionDeltaPart,
    InstructionDigest,
    InstructionId,
    InstructionPart,
    LoadCapabilityCallPart,
    LoadCapabilityReturnPart,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    ModelSettingsDeltaPart,
    NativeToolCallPart,
    NativeToolReturnPart,
    NativeToolSearchCallPart,
    NativeToolSearchReturnPart,
    RetryFeedbackPart,
    RetryInfo,
    RetryPromptPart,
    SpeechPart,
    SpeechTimestamp,
    StructuredContent,
    SystemPromptPart,
    TextContent,
    TextPart,
    ThinkingPart,
    ToolAvailabilityDeltaPart,
    ToolCallPart,
    ToolReturnPart,
    ToolSearchCallPart,
    ToolSearchReturnPart,
    UploadedFile,
    UserPromptPart,
    VideoUrl,
    WebCitationSource,
)
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.usage import RequestUsage

from contextfold.events import Event, StoredEvent
from tests.integrations._capability_parts import capability_parts, more_capability_parts

__all__ = [
    "BACKENDS",
    "LEGACY",
    "REQUEST_PARTS",
    "RESPONSE_PARTS",
    "T0",
    "Call",
    "Received",
    "ResponsesServer",
    "ScriptedModel",
    "adapter_round_trip",
    "adding_model",
    "backend_url",
    "build_agent",
    "decoded",
    "fake_model",
    "function_call",
    "installed_tags",
    "response_json",
    "responses_server",
    "retry_prompt",
    "text_message",
    "turn",
]


# --- journals per backend ---


BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The journal URL of ``request.param``: memory, a real SQLite file or a fresh PostgreSQL
    database of the suite's server."""
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'journal.db'}"
    return str(request.getfixturevalue("pg_dsn"))


# --- a small real LangGraph agent ---
# Messages state, a model node that is a plain function (no provider, no key) and a tool
# loop through LangGraph's ToolNode.


_ADD = re.compile(r"^add (\d+) (\d+)")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def fake_model(messages: Sequence[BaseMessage]) -> AIMessage:
    """Answers ``add A B`` with a tool call, a tool result with the sum, anything else with
    an echo: deterministic, like a recorded model."""
    last = messages[-1]
    if isinstance(last, ToolMessage):
        return AIMessage(content=f"The sum is {last.content}.")
    text = str(last.content)
    found = _ADD.match(text)
    if found is not None:
        call = {
            "name": "add",
            "args": {"a": int(found[1]), "b": int(found[2])},
            "id": f"call-{len(messages)}",
        }
        return AIMessage(content="", tool_calls=[call])
    return AIMessage(content=f"echo: {text}")


def _model(state: MessagesState) -> dict[str, Any]:
    return {"messages": [fake_model(state["messages"])]}


def build_agent(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    """model -> (tools -> model)* -> end, compiled with ``checkpointer``."""
    builder = StateGraph(MessagesState)
    builder.add_node("model", _model)
    builder.add_node("tools", ToolNode([add]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


def turn(i: int) -> dict[str, Any]:
    """The input of turn ``i``: every third turn asks for the tool."""
    text = f"add {i} {i + 1}" if i % 3 == 0 else f"question {i}: how is the weather today?"
    return {"messages": [HumanMessage(content=text)]}


# --- the OpenAI Agents SDK: a scripted model, a hooked store, a Responses server ---


E = TypeVar("E", bound=Event)


def decoded(stored: StoredEvent, cls: type[E]) -> E:
    """The stored event's payload as ``cls``."""
    return cast(E, stored.decode(cls))


# The SDK traces runs to OpenAI by default: these tests send nothing anywhere.
set_tracing_disabled(True)


def text_message(text: str, id: str = "msg_1") -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def function_call(name: str, arguments: str, call_id: str = "call_1") -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", name=name, arguments=arguments, call_id=call_id
    )


@dataclass(frozen=True)
class Call:
    """One request the scripted model got."""

    instructions: str | None
    input: list[TResponseInputItem]
    tools: tuple[str, ...]


class ScriptedModel(Model):
    """A model that answers each request with the next scripted output (no network)."""

    def __init__(self, *outputs: list[Any]) -> None:
        self.outputs = list(outputs)
        self.calls: list[Call] = []

    def enqueue(self, output: list[Any]) -> None:
        self.outputs.append(output)

    def _answer(
        self, instructions: str | None, input: str | list[TResponseInputItem], tools: list[Tool]
    ) -> list[TResponseOutputItem]:
        items: list[TResponseInputItem] = (
            [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        )
        self.calls.append(Call(instructions, items, tuple(tool.name for tool in tools)))
        if not self.outputs:
            raise AssertionError("the scripted model got a request it has no answer for")
        return self.outputs.pop(0)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AgentsModelResponse:
        output = self._answer(system_instructions, input, tools)
        response_id = f"resp_{len(self.calls)}"
        return AgentsModelResponse(output=output, usage=Usage(requests=1), response_id=response_id)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        output = self._answer(system_instructions, input, tools)
        response = Response(
            id=f"resp_{len(self.calls)}",
            created_at=0,
            model="scripted",
            object="response",
            output=output,
            tool_choice="auto",
            tools=[],
            parallel_tool_calls=False,
            status="completed",
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )


@dataclass(frozen=True)
class Received:
    """One request the loopback server got: its path and exact body bytes."""

    path: str
    body: bytes


class ResponsesServer(ThreadingHTTPServer):
    """An OpenAI Responses endpoint on 127.0.0.1 answering each POST with the next scripted
    ``Response`` JSON, recording the exact bytes it got."""

    daemon_threads = True

    def __init__(self, replies: list[dict[str, Any]]) -> None:
        super().__init__(("127.0.0.1", 0), _ResponsesHandler)
        self.replies = list(replies)
        self.received: list[Received] = []
        self.lock = threading.Lock()

    @property
    def base_url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/v1"


class _ResponsesHandler(BaseHTTPRequestHandler):
    server: ResponsesServer

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.server.lock:
            self.server.received.append(Received(self.path, body))
            reply = self.server.replies.pop(0) if self.server.replies else None
        if reply is None:
            self.send_error(500, "no scripted reply left")
            return
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        pass


@contextmanager
def responses_server(replies: list[dict[str, Any]]) -> Iterator[ResponsesServer]:
    """Serve ``replies`` (one per request, in order) on a free loopback port."""
    server = ResponsesServer(replies)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def response_json(*output: dict[str, Any]) -> dict[str, Any]:
    """A whole Responses API answer with these output items."""
    return {
        "id": "resp_loopback",
        "object": "response",
        "created_at": 0,
        "model": "gpt-4.1",
        "status": "completed",
        "output": list(output),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 20,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 25,
        },
    }


# --- pydantic-ai: parts of every kind and a tool-calling FunctionModel ---


T0 = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
_PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\x00\x80"
# Tags of the legacy members that load a stored "retry-prompt" part (covered by it).
LEGACY = frozenset({"legacy-retry-tool-return", "legacy-retry-feedback"})


def installed_tags(union: Any) -> frozenset[str]:
    """The discriminator tags of a pydantic-ai part union (``ModelRequestPart``, …)."""
    members = typing.get_args(typing.get_args(union)[0])
    tags = set()
    for member in members:
        for extra in typing.get_args(member)[1:]:
            tag = getattr(extra, "tag", None)
            if isinstance(tag, str):
                tags.add(tag)
    return frozenset(tags)


def retry_prompt(content: str, *, tool_name: str | None, tool_call_id: str) -> Any:
    """A legacy RetryPromptPart, without the deprecation warning its constructor gives."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RetryPromptPart(
            content, tool_name=tool_name, tool_call_id=tool_call_id, timestamp=T0
        )


def _user_content(text: str, data: bytes) -> list[Any]:
    return [
        text,
        TextContent(text, metadata={"source": "note"}),
        StructuredContent({"rows": [1, 2.5, None]}, metadata={"k": "v"}),
        ImageUrl("https://example.com/a.png", vendor_metadata={"detail": "low"}),
        AudioUrl("https://example.com/a.wav"),
        DocumentUrl("https://example.com/a.pdf", force_download=True),
        VideoUrl("https://example.com/a.mp4"),
        BinaryContent(data, media_type="image/png", vendor_metadata={"detail": "high"}),
        BinaryContent(data, media_type="application/octet-stream"),
        UploadedFile("file-1", provider_name="openai", media_type="application/pdf"),
        CachePoint(),
    ]


def _request_parts(text: str, data: bytes, signature: str) -> dict[str, Callable[[], Any]]:
    del signature
    search: Any = {"discovered_tools": [{"name": "add"}], "message": text}
    return {
        "system-prompt": lambda: SystemPromptPart(
            text, timestamp=T0, dynamic_ref="dyn", metadata={"m": [1, 2]}
        ),
        "user-prompt": lambda: UserPromptPart(_user_content(text, data), timestamp=T0),
        "speech": lambda: SpeechPart(
            speaker="user",
            transcript=text,
            audio=BinaryContent(data, media_type="audio/wav"),
            timestamps=[SpeechTimestamp(text="w", start_ms=0, duration_ms=5)],
            provider_name="openai",
        ),
        "tool-search-return": lambda: ToolSearchReturnPart(
            content=search, tool_call_id="search-1", timestamp=T0
        ),
        "capability-load-return": lambda: LoadCapabilityReturnPart(
            content={"message": text}, tool_call_id="load-1", timestamp=T0
        ),
        "tool-return": lambda: ToolReturnPart(
            "add",
            [text, {"n": 1.25, "big": 2**60}, BinaryContent(data, media_type="image/png")],
            "call-1",
            metadata={"kept": True},
            timestamp=T0,
            outcome="retried",
            retry=RetryInfo(cause="model_retry", attempt=1, max_retries=3),
        ),
        "retry-prompt": lambda: retry_prompt(text, tool_name="add", tool_call_id="call-2"),
        "retry-feedback": lambda: RetryFeedbackPart(
            text, retry=RetryInfo(cause="validation_error"), timestamp=T0
        ),
        "tool-availability-delta": lambda: ToolAvailabilityDeltaPart(
            tools_added=["add"], tool_call_id="search-1"
        ),
        "capability-load-delta": lambda: CapabilityLoadDeltaPart(loaded=["cap"]),
        "model-settings-delta": lambda: ModelSettingsDeltaPart(
            settings={"thinking": "high"}, top_level=True
        ),
        "instruction-delta": lambda: InstructionDeltaPart(
            id=InstructionId(AgentInstructionSource(), name="limits"),
            content=text,
            base_hash="0" * 64,
        ),
        "instruction-baseline": lambda: InstructionBaselinePart(
            instructions=[
                InstructionPart(text, dynamic=True, on_change="append", name="limits"),
                InstructionDigest(content_hash="1" * 64),
            ]
        ),
        "compaction": lambda: CompactionPart(text, metadata={"by": "app"}),
        **capability_parts(text),
    }


def _response_parts(text: str, data: bytes, signature: str) -> dict[str, Callable[[], Any]]:
    citation = Citation(
        sources=[
            WebCitationSource("https://example.com", title=text, excerpts=[text]),
            DocumentCitationSource(document_id="doc-1"),
        ],
        anchor=ContentCitationAnchor(start=0, end=1),
    )
    return {
        "text": lambda: TextPart(
            text,
            id="msg_1",
            provider_name="openai",
            provider_details={"a": 1},
            citations=[citation],
        ),
        "tool-search-call": lambda: ToolSearchCallPart(
            args={"queries": [text]}, tool_call_id="search-1"
        ),
        "capability-load-call": lambda: LoadCapabilityCallPart(
            args={"id": "cap"}, tool_call_id="load-1"
        ),
        "tool-call": lambda: ToolCallPart("add", {"a": 2, "b": [text, None]}, "call-1"),
        "builtin-tool-search-call": lambda: NativeToolSearchCallPart(
            args={"queries": [text]}, tool_call_id="native-search", provider_name="anthropic"
        ),
        "builtin-tool-call": lambda: NativeToolCallPart(
            "web_search", '{"query": "x"}', "native-1", provider_name="openai", id="ws_1"
        ),
        "builtin-tool-search-return": lambda: NativeToolSearchReturnPart(
            content={"discovered_tools": [{"name": "add"}]},
            tool_call_id="native-search",
            provider_name="anthropic",
            timestamp=T0,
        ),
        "builtin-tool-return": lambda: NativeToolReturnPart(
            "web_search",
            {"results": [text]},
            "native-1",
            provider_name="openai",
            provider_details={"status": "completed"},
            timestamp=T0,
        ),
        "thinking": lambda: ThinkingPart(
            text, id="rs_1", signature=signature, provider_name="anthropic"
        ),
        "compaction": lambda: CompactionPart(
            text, id="cmp_1", provider_name="openai", provider_details={"encrypted": signature}
        ),
        "file": lambda: FilePart(BinaryContent(data, media_type="image/png"), id="f1"),
        "speech": lambda: SpeechPart(
            speaker="assistant", transcript=text, interrupted_at_ms=10, provider_name="openai"
        ),
    }


REQUEST_PARTS = _request_parts
RESPONSE_PARTS = _response_parts


def conversation(
    text: str = "héllo ✓", data: bytes = _PNG, signature: str = "EqQBCkgIAR-sig=="
) -> list[ModelMessage]:
    """One request holding a part of every request kind, one response of every response kind."""
    request: list[ModelRequestPart] = [
        make() for make in _request_parts(text, data, signature).values()
    ]
    request.extend(more_capability_parts(text))
    response: list[ModelResponsePart] = [
        make() for make in _response_parts(text, data, signature).values()
    ]
    return [
        ModelRequest(request, timestamp=T0, instructions=text, run_id="run-1", metadata={"app": 1}),
        ModelResponse(
            response,
            usage=RequestUsage(input_tokens=3, output_tokens=4, details={"reasoning": 2}),
            model_name="m-1",
            timestamp=T0 + timedelta(seconds=1),
            provider_name="openai",
            provider_response_id="resp_1",
            finish_reason="tool_call",
            run_id="run-1",
        ),
    ]


def adapter_round_trip(messages: list[ModelMessage]) -> list[ModelMessage]:
    """What pydantic-ai's own adapter gives back for the JSON it dumps of ``messages``."""
    return ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(messages))


def adding_model(
    seen: list[list[ModelMessage]] | None = None,
) -> Callable[[list[ModelMessage], AgentInfo], ModelResponse]:
    """A FunctionModel function: call ``add`` on the first request of a run, then answer with
    the sum. Records the messages it is handed in ``seen``."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if seen is not None:
            seen.append(list(messages))
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        for part in last.parts:
            if isinstance(part, ToolReturnPart):
                return ModelResponse(parts=[TextPart(f"The sum is {part.content}.")])
        call = ToolCallPart("add", {"a": 2, "b": 3}, f"call-{len(messages)}")
        return ModelResponse(parts=[call])

    return model
