"""cf.Agent's spans and metrics against the OpenTelemetry GenAI semantic conventions (the
``opentelemetry-semantic-conventions`` release uv.lock pins): every attribute name is the
conventions package's own constant (a rename upstream fails here), the required and
recommended attributes the data holds are there (a real SDK client on a loopback server:
server address, response id and model), ``error.type`` marks a failure, a compaction is a
chat span, both client metrics are recorded, and content is captured only when asked for,
exactly as the request's rebuilt body carried it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics
from opentelemetry.semconv.attributes import error_attributes, server_attributes
from opentelemetry.trace import SpanKind, StatusCode

import contextfold as cf
from contextfold import telemetry as tm
from contextfold.context.compaction import COMPACTION_INSTRUCTION
from contextfold.prices import CataloguePrices
from contextfold.runtime.span_content import request_content
from contextfold.wire import (
    ModelOutput,
    NeutralMessage,
    NeutralRequest,
    ToolCall,
    ToolDefinition,
    Usage,
    render_request,
)
from tests.otel import attributes, histogram, metric_reader, of_operation, span_exporter
from tests.runtime.helpers import loopback

STREAM = "otel/conventions"

CONVENTIONS = {
    tm.OPERATION_NAME: gen_ai.GEN_AI_OPERATION_NAME,
    tm.PROVIDER_NAME: gen_ai.GEN_AI_PROVIDER_NAME,
    tm.CONVERSATION_ID: gen_ai.GEN_AI_CONVERSATION_ID,
    tm.AGENT_NAME: gen_ai.GEN_AI_AGENT_NAME,
    tm.REQUEST_MODEL: gen_ai.GEN_AI_REQUEST_MODEL,
    tm.REQUEST_MAX_TOKENS: gen_ai.GEN_AI_REQUEST_MAX_TOKENS,
    tm.REQUEST_TEMPERATURE: gen_ai.GEN_AI_REQUEST_TEMPERATURE,
    tm.REQUEST_STREAM: gen_ai.GEN_AI_REQUEST_STREAM,
    tm.RESPONSE_ID: gen_ai.GEN_AI_RESPONSE_ID,
    tm.RESPONSE_MODEL: gen_ai.GEN_AI_RESPONSE_MODEL,
    tm.RESPONSE_FINISH_REASONS: gen_ai.GEN_AI_RESPONSE_FINISH_REASONS,
    tm.OUTPUT_TYPE: gen_ai.GEN_AI_OUTPUT_TYPE,
    tm.USAGE_INPUT_TOKENS: gen_ai.GEN_AI_USAGE_INPUT_TOKENS,
    tm.USAGE_OUTPUT_TOKENS: gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS,
    tm.USAGE_CACHE_READ_TOKENS: gen_ai.GEN_AI_USAGE_CACHE_READ_INPUT_TOKENS,
    tm.USAGE_CACHE_WRITE_TOKENS: gen_ai.GEN_AI_USAGE_CACHE_CREATION_INPUT_TOKENS,
    tm.USAGE_REASONING_TOKENS: gen_ai.GEN_AI_USAGE_REASONING_OUTPUT_TOKENS,
    tm.TOKEN_TYPE: gen_ai.GEN_AI_TOKEN_TYPE,
    tm.TOOL_NAME: gen_ai.GEN_AI_TOOL_NAME,
    tm.TOOL_CALL_ID: gen_ai.GEN_AI_TOOL_CALL_ID,
    tm.TOOL_TYPE: gen_ai.GEN_AI_TOOL_TYPE,
    tm.TOOL_DESCRIPTION: gen_ai.GEN_AI_TOOL_DESCRIPTION,
    tm.TOOL_CALL_ARGUMENTS: gen_ai.GEN_AI_TOOL_CALL_ARGUMENTS,
    tm.TOOL_CALL_RESULT: gen_ai.GEN_AI_TOOL_CALL_RESULT,
    tm.INPUT_MESSAGES: gen_ai.GEN_AI_INPUT_MESSAGES,
    tm.OUTPUT_MESSAGES: gen_ai.GEN_AI_OUTPUT_MESSAGES,
    tm.SYSTEM_INSTRUCTIONS: gen_ai.GEN_AI_SYSTEM_INSTRUCTIONS,
    tm.TOOL_DEFINITIONS: gen_ai.GEN_AI_TOOL_DEFINITIONS,
    tm.ERROR_TYPE: error_attributes.ERROR_TYPE,
    tm.SERVER_ADDRESS: server_attributes.SERVER_ADDRESS,
    tm.SERVER_PORT: server_attributes.SERVER_PORT,
    tm.TOKEN_USAGE: gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE,
    tm.OPERATION_DURATION: gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION,
}
OPERATIONS = {
    tm.AGENT_TURN: gen_ai.GenAiOperationNameValues.INVOKE_AGENT.value,
    tm.MODEL_REQUEST: gen_ai.GenAiOperationNameValues.CHAT.value,
    tm.EXECUTE_TOOL: gen_ai.GenAiOperationNameValues.EXECUTE_TOOL.value,
}
KNOWN = {
    value
    for module in (gen_ai, error_attributes, server_attributes)
    for name, value in vars(module).items()
    if name.isupper() and isinstance(value, str)
}
"""Every attribute name the conventions define in the namespaces contextfold reports in."""


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return span_exporter()


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    exporter.clear()
    yield exporter
    tm.capture_content(None)


@pytest.fixture(scope="module")
def reader() -> InMemoryMetricReader:
    found = metric_reader()
    if found is None:
        pytest.skip("a global MeterProvider without an InMemoryMetricReader is already set")
    return found


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _completion(message: dict[str, Any], finish: str, usage: tuple[int, int]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{finish}",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4.1-2025-04-14",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": sum(usage),
        },
    }


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a":2,"b":3}'},
}
REPLIES = [
    _completion(
        {"role": "assistant", "content": None, "tool_calls": [CALL]}, "tool_calls", (120, 9)
    ),
    _completion({"role": "assistant", "content": "It is 5."}, "stop", (150, 4)),
]


async def _session(journal: cf.Journal) -> tuple[cf.RunReport, int]:
    """An agent named ``adder`` on a real OpenAI client (loopback): a tool call, an answer."""
    await journal.append(STREAM, cf.system_prompt("You add numbers."))
    await journal.append(STREAM, cf.ContextAdded(role="user", content="What is 2 + 3?"))
    with loopback(list(REPLIES)) as server:
        model = cf.OpenAIChatModel("gpt-4.1", base_url=f"{server.base_url}/v1", api_key="t")
        agent = cf.Agent(journal, STREAM, model, tools=[add], name="adder", context_window=128_000)
        report = await agent.run_until_idle()
        port = int(server.base_url.rsplit(":", 1)[1])
    return report, port


def test_every_name_is_the_conventions_own() -> None:
    for ours, theirs in CONVENTIONS.items():
        assert ours == theirs
    for ours, theirs in OPERATIONS.items():
        assert ours == theirs
    assert tm.CAPTURE_CONTENT_ENV == "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"


def _conventional_keys(found: tuple[ReadableSpan, ...]) -> set[str]:
    return {
        key
        for span in found
        for key in attributes(span)
        if key.split(".", 1)[0] in ("gen_ai", "error", "server")
    }


async def test_an_agent_session_has_the_conventions_attributes(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader
) -> None:
    before = len(histogram(reader, tm.OPERATION_DURATION, **{tm.REQUEST_MODEL: "gpt-4.1"}))
    async with cf.open_journal("memory://") as journal:
        report, port = await _session(journal)
    found = spans.get_finished_spans()
    assert _conventional_keys(found) <= KNOWN  # nothing of our own in their namespaces

    [turn] = of_operation(found, tm.AGENT_TURN)
    assert turn.name == "invoke_agent adder"
    assert attributes(turn) | {
        tm.AGENT_NAME: "adder",
        tm.PROVIDER_NAME: "openai",
        tm.CONVERSATION_ID: STREAM,
        tm.REQUEST_MODEL: "gpt-4.1",
        tm.SERVER_ADDRESS: "127.0.0.1",
        tm.SERVER_PORT: port,
        tm.USAGE_INPUT_TOKENS: 120 + 150,  # the turn's requests together
        tm.USAGE_OUTPUT_TOKENS: 9 + 4,
    } == attributes(turn)

    first, second = sorted(of_operation(found, tm.MODEL_REQUEST), key=lambda s: s.start_time or 0)
    for span, finish in ((first, "tool_calls"), (second, "stop")):
        got = attributes(span)
        assert span.name == "chat gpt-4.1" and span.kind is SpanKind.CLIENT
        assert got[tm.OPERATION_NAME] == "chat" and got[tm.PROVIDER_NAME] == "openai"
        assert got[tm.REQUEST_MODEL] == "gpt-4.1" and got[tm.REQUEST_MAX_TOKENS] == 1024
        assert (got[tm.SERVER_ADDRESS], got[tm.SERVER_PORT]) == ("127.0.0.1", port)
        assert got[tm.CONVERSATION_ID] == STREAM and got[tm.OUTPUT_TYPE] == "text"
        assert got[tm.RESPONSE_ID] == f"chatcmpl-{finish}"
        assert got[tm.RESPONSE_MODEL] == "gpt-4.1-2025-04-14"
        assert got[tm.RESPONSE_FINISH_REASONS] == (finish,)
        usage = Usage(
            input_tokens=got[tm.USAGE_INPUT_TOKENS], output_tokens=got[tm.USAGE_OUTPUT_TOKENS]
        )
        cost = CataloguePrices().cost("gpt-4.1", usage)
        assert cost is not None and got[tm.USAGE_COST] == cost > 0
        assert not {tm.INPUT_MESSAGES, tm.OUTPUT_MESSAGES, tm.SYSTEM_INSTRUCTIONS} & got.keys()
    assert attributes(first)[tm.USAGE_INPUT_TOKENS] == 120
    assert [attributes(s)[tm.REQUEST_OFFSET] for s in (first, second)] == report.requests

    [tool] = of_operation(found, tm.EXECUTE_TOOL)
    assert tool.name == "execute_tool add"
    assert attributes(tool) | {
        tm.TOOL_NAME: "add",
        tm.TOOL_CALL_ID: "call_1",
        tm.TOOL_TYPE: "function",
        tm.TOOL_DESCRIPTION: "Add two integers.",
    } == attributes(tool)
    assert tm.TOOL_CALL_ARGUMENTS not in attributes(tool)

    durations = histogram(reader, tm.OPERATION_DURATION, **{tm.REQUEST_MODEL: "gpt-4.1"})
    assert len(durations) > before or sum(p.count for p in durations) >= 2
    answered = {tm.RESPONSE_MODEL: "gpt-4.1-2025-04-14", tm.SERVER_PORT: port}
    assert sum(p.count for p in histogram(reader, tm.OPERATION_DURATION, **answered)) == 2
    tokens = histogram(reader, tm.TOKEN_USAGE, **answered, **{tm.TOKEN_TYPE: "input"})
    assert sum(p.sum for p in tokens) == 120 + 150


async def test_a_failure_sets_error_type_on_its_spans_and_metric(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader
) -> None:
    def down(request: NeutralRequest) -> str:
        raise ConnectionError("provider down")

    async with cf.open_journal("memory://") as journal:
        await journal.append(STREAM, cf.system_prompt("Agent."))
        await journal.append(STREAM, cf.ContextAdded(role="user", content="hi"))
        model = cf.FunctionModel(down, model="failing-model")
        with pytest.raises(cf.ModelError):
            await cf.Agent(journal, STREAM, model).run_until_idle()
    found = spans.get_finished_spans()
    [turn] = of_operation(found, tm.AGENT_TURN)
    [chat] = of_operation(found, tm.MODEL_REQUEST)
    assert turn.name == "invoke_agent"  # an agent without a name
    assert chat.status.status_code is StatusCode.ERROR is turn.status.status_code
    assert attributes(chat)[tm.ERROR_TYPE] == "ConnectionError" == attributes(turn)[tm.ERROR_TYPE]
    failed = {tm.REQUEST_MODEL: "failing-model", tm.ERROR_TYPE: "ConnectionError"}
    assert sum(p.count for p in histogram(reader, tm.OPERATION_DURATION, **failed)) >= 1


async def test_a_compaction_is_a_chat_span_with_its_summary_usage(
    spans: InMemorySpanExporter,
) -> None:
    def model(request: NeutralRequest) -> ModelOutput:
        if COMPACTION_INSTRUCTION in request.messages[-1].content:
            return ModelOutput(text="short summary", usage=Usage(input_tokens=10, output_tokens=5))
        return ModelOutput(text="ok", usage=Usage(input_tokens=7_000, output_tokens=5))

    async with cf.open_journal("memory://") as journal:
        await journal.append(STREAM, cf.system_prompt("Agent."))
        await journal.append(STREAM, cf.ContextAdded(role="user", content="hello"))
        agent = cf.Agent(journal, STREAM, cf.FunctionModel(model, model="contextfold-local"))
        report = await agent.run_until_idle()
    [compaction] = of_operation(spans.get_finished_spans(), tm.COMPACTION)
    got = attributes(compaction)
    assert compaction.name == "chat contextfold-local" and compaction.kind is SpanKind.CLIENT
    assert got[tm.OPERATION_NAME] == "chat" and got[tm.REQUEST_OFFSET] == report.compactions[0]
    assert (got[tm.USAGE_INPUT_TOKENS], got[tm.USAGE_OUTPUT_TOKENS]) == (10, 5)


def _calling(request: NeutralRequest) -> ModelOutput:
    if any(message.role == "tool" for message in request.messages):
        return ModelOutput(text="The sum is 5.", usage=Usage(input_tokens=40, output_tokens=6))
    call = ToolCall(id="c1", name="add", arguments='{"a": 2, "b": 3}')
    return ModelOutput(tool_calls=(call,), finish_reason="tool_use")


async def _captured_session(
    spans: InMemorySpanExporter,
) -> tuple[list[ReadableSpan], ReadableSpan, list[cf.RenderedRequest]]:
    async with cf.open_journal("memory://") as journal:
        await journal.append(STREAM, cf.system_prompt("You add numbers."))
        await journal.append(STREAM, cf.ContextAdded(role="user", content="What is 2 + 3?"))
        model = cf.FunctionModel(_calling, transport="anthropic", model="claude-test")
        report = await cf.Agent(journal, STREAM, model, tools=[add]).run_until_idle()
        bodies = [await cf.rebuild_request(journal, STREAM, n) for n in report.requests]
    found = spans.get_finished_spans()
    chats = sorted(of_operation(found, tm.MODEL_REQUEST), key=lambda s: s.start_time or 0)
    [tool] = of_operation(found, tm.EXECUTE_TOOL)
    return chats, tool, bodies


async def test_content_is_captured_only_when_asked_exactly_as_rebuilt(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(tm.CAPTURE_CONTENT_ENV, raising=False)
    chats, tool, _ = await _captured_session(spans)
    assert all(tm.INPUT_MESSAGES not in attributes(span) for span in (*chats, tool))

    spans.clear()
    monkeypatch.setenv(tm.CAPTURE_CONTENT_ENV, "SPAN_ONLY")
    chats, tool, bodies = await _captured_session(spans)
    for span, body in zip(chats, bodies, strict=True):
        got = attributes(span)
        assert {k: got[k] for k in request_content(body)} == request_content(body)
    first = attributes(chats[0])
    assert json.loads(first[tm.SYSTEM_INSTRUCTIONS])[0]["type"] == "text"
    assert "You add numbers." in first[tm.SYSTEM_INSTRUCTIONS]
    [user] = json.loads(first[tm.INPUT_MESSAGES])
    assert user["role"] == "user" and "What is 2 + 3?" in user["parts"][0]["content"]
    [definition] = json.loads(first[tm.TOOL_DEFINITIONS])
    assert definition["name"] == "add" and definition["description"] == "Add two integers."
    [answer] = json.loads(first[tm.OUTPUT_MESSAGES])
    assert answer["finish_reason"] == "tool_call"
    assert answer["parts"] == [
        {"type": "tool_call", "id": "c1", "name": "add", "arguments": {"a": 2, "b": 3}}
    ]
    messages = json.loads(attributes(chats[1])[tm.INPUT_MESSAGES])
    # Anthropic carries a tool result in a user turn (here beside the time tail): kept so.
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    result = messages[2]["parts"][0]
    assert result["type"] == "tool_call_response" and result["id"] == "c1"
    assert result["response"].endswith("\n5")
    assert attributes(tool)[tm.TOOL_CALL_ARGUMENTS] == '{"a": 2, "b": 3}'
    assert attributes(tool)[tm.TOOL_CALL_RESULT] == "5"

    # The Python option overrides the environment, both ways.
    spans.clear()
    tm.capture_content(False)
    chats, tool, _ = await _captured_session(spans)
    assert all(tm.INPUT_MESSAGES not in attributes(span) for span in chats)
    spans.clear()
    monkeypatch.setenv(tm.CAPTURE_CONTENT_ENV, "NO_CONTENT")
    tm.capture_content(True)
    chats, tool, _ = await _captured_session(spans)
    assert all(tm.INPUT_MESSAGES in attributes(span) for span in chats)


def test_the_switch_reads_the_conventions_values() -> None:
    for value, on in (("SPAN_ONLY", True), ("span_and_event", True), ("true", True)):
        assert tm.content_captured({tm.CAPTURE_CONTENT_ENV: value}) is on
    for value in ("", "NO_CONTENT", "EVENT_ONLY", "false"):
        assert tm.content_captured({tm.CAPTURE_CONTENT_ENV: value}) is False
    with pytest.raises(TypeError):
        tm.capture_content("yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("transport", ["openai-chat", "openai-responses", "anthropic"])
def test_each_transport_s_body_reads_as_the_conventions_messages(transport: cf.Transport) -> None:
    call = ToolCall(id="c1", name="add", arguments='{"a": 2}')
    request = NeutralRequest(
        model="m",
        system="Be brief.",
        messages=(
            NeutralMessage(role="user", content="Add."),
            NeutralMessage(role="assistant", content="", tool_calls=(call,)),
            NeutralMessage(role="tool", content="2", tool_call_id="c1"),
        ),
        tools=(ToolDefinition(name="add", description="Adds.", parameters={"type": "object"}),),
        max_tokens=100,
    )
    found = request_content(render_request(request, transport))
    messages = json.loads(str(found[tm.INPUT_MESSAGES]))
    if transport == "openai-chat":  # the system message is part of the chat history
        system, *messages = messages
        assert system == {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]}
    else:
        assert json.loads(str(found[tm.SYSTEM_INSTRUCTIONS]))[0]["content"] == "Be brief."
    assert messages[0] == {"role": "user", "parts": [{"type": "text", "content": "Add."}]}
    assert messages[1] == {
        "role": "assistant",
        "parts": [{"type": "tool_call", "id": "c1", "name": "add", "arguments": {"a": 2}}],
    }
    assert messages[2] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "c1", "response": "2"}],
    }
    [tool] = json.loads(str(found[tm.TOOL_DEFINITIONS]))
    assert tool == {
        "type": "function",
        "name": "add",
        "description": "Adds.",
        "parameters": tool["parameters"],
    }
    assert tool["parameters"]["type"] == "object"
