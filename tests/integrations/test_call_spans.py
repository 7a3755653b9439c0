"""The framework integrations that run the context engine inside a model call (LangChain's
ContextMiddleware, pydantic-ai's ContextModel, ADK's ContextPlugin) each make one
``chat {model}`` span per call with the GenAI attributes their data holds, the recorded
request's journal position, a compaction span beside it, ``error.type`` on failure, the
GenAI metrics, and the chosen messages and the answer when content capture is on; read back
through the SDK's in-memory exporter."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.genai import types
from langchain.agents import create_agent
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

import contextfold as cf
from contextfold import telemetry as tm
from contextfold.context.call_records import read_calls
from contextfold.integrations.adk import ContextPlugin, session_stream
from contextfold.integrations.langchain import ContextMiddleware
from contextfold.integrations.pydantic_ai import ContextModel
from tests.integrations import test_adk_engine as adk
from tests.integrations import test_pydantic_ai_engine as pai
from tests.integrations.langchain_scripted import Scripted, read_file
from tests.otel import attributes, histogram, metric_reader, of_operation, span_exporter


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


def _on(found: tuple[ReadableSpan, ...], stream: str, operation: str) -> list[ReadableSpan]:
    return [s for s in of_operation(found, operation) if attributes(s).get(tm.STREAM) == stream]


def _calls_match_records(chats: list[ReadableSpan], positions: list[int]) -> None:
    ordered = sorted(chats, key=lambda s: s.start_time or 0)
    assert [attributes(s)[tm.REQUEST_OFFSET] for s in ordered] == positions
    for span in ordered:
        got = attributes(span)
        assert span.kind is SpanKind.CLIENT and got[tm.OPERATION_NAME] == "chat"
        assert got[tm.CONVERSATION_ID] == got[tm.STREAM]


async def test_langchain_middleware_calls_and_compactions_are_spans(
    spans: InMemorySpanExporter, reader: InMemoryMetricReader
) -> None:
    model = Scripted(steps=2)
    async with cf.open_journal("memory://") as journal:
        middleware = ContextMiddleware(
            journal=journal, stream="lc", trigger=("tokens", 900), keep=("tokens", 300)
        )
        agent: Any = create_agent(
            model, tools=[read_file], system_prompt="You read files.", middleware=[middleware]
        )
        state: dict[str, Any] = {"messages": []}
        for n in range(4):
            state = await agent.ainvoke({"messages": [*state["messages"], ("user", f"read {n}")]})
        calls = await read_calls(journal, "lc")
    found = spans.get_finished_spans()
    chats = _on(found, "lc", tm.MODEL_REQUEST)
    assert all(span.name == "chat Scripted" for span in chats)
    _calls_match_records(chats, sorted(calls.requests))
    answered = [attributes(s) for s in chats]
    assert all(a[tm.USAGE_OUTPUT_TOKENS] == 3 and tm.USAGE_CACHE_READ_TOKENS in a for a in answered)
    compactions = _on(found, "lc", tm.COMPACTION)
    assert [attributes(s)[tm.REQUEST_OFFSET] for s in compactions] == sorted(calls.compactions)
    assert all(span.name == "chat Scripted" for span in compactions)
    assert sum(
        p.count for p in histogram(reader, tm.OPERATION_DURATION, **{tm.REQUEST_MODEL: "Scripted"})
    ) >= len(chats) + len(compactions)


def _failing(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    raise ConnectionError("provider down")


async def test_pydantic_ai_calls_are_spans_with_their_content_when_captured(
    spans: InMemorySpanExporter,
) -> None:
    tm.capture_content(True)
    seen: list[list[ModelMessage]] = []
    summaries: list[str] = []
    async with cf.open_journal("memory://") as journal:
        model = ContextModel(
            pai.scripted(seen, summaries),
            journal,
            "pai",
            budget=3_000,
            compact_at=1_500,
            keep_tokens=300,
        )
        await pai._converse(pai._agent(model), 6)
        calls = await read_calls(journal, "pai")
    found = spans.get_finished_spans()
    chats = _on(found, "pai", tm.MODEL_REQUEST)
    _calls_match_records(chats, sorted(calls.requests))
    first = attributes(min(chats, key=lambda s: s.start_time or 0))
    assert first[tm.PROVIDER_NAME] == "function"  # pydantic-ai's own name of the model's system
    [user] = [m for m in json.loads(first[tm.INPUT_MESSAGES]) if m["role"] == "user"]
    assert user["parts"] == [{"type": "text", "content": "question 0"}]
    [answer] = json.loads(first[tm.OUTPUT_MESSAGES])
    assert answer["role"] == "assistant" and answer["parts"][0]["type"] == "tool_call"
    [tool] = json.loads(first[tm.TOOL_DEFINITIONS])
    assert tool["name"] == "look" and tool["description"] == "Look a topic up."
    compactions = _on(found, "pai", tm.COMPACTION)
    assert [attributes(s)[tm.REQUEST_OFFSET] for s in compactions] == sorted(calls.compactions)
    assert all(attributes(s)[tm.USAGE_OUTPUT_TOKENS] == 3 for s in compactions)

    spans.clear()
    failing = Agent(ContextModel(FunctionModel(_failing), journal=None, stream=None))
    with pytest.raises(ConnectionError):
        await failing.run("hi")
    [chat] = of_operation(spans.get_finished_spans(), tm.MODEL_REQUEST)
    assert chat.status.status_code is StatusCode.ERROR
    assert attributes(chat)[tm.ERROR_TYPE] == "ConnectionError"


async def test_adk_plugin_calls_are_spans_on_the_session_stream(
    spans: InMemorySpanExporter,
) -> None:
    model = adk.Scripted()
    async with cf.open_journal("memory://") as journal:
        service = InMemorySessionService()
        await service.create_session(app_name=adk.APP, user_id="ada", session_id="s")
        plugin = ContextPlugin(journal, budget=4_000, compact_at=1_500, keep_tokens=300)
        await adk._turns(adk._runner(service, model, plugin), "s", 6)
        stream = session_stream(adk.APP, "ada", "s")
        calls = await read_calls(journal, stream)
    found = spans.get_finished_spans()
    chats = _on(found, stream, tm.MODEL_REQUEST)
    _calls_match_records(chats, sorted(calls.requests))
    got = attributes(chats[-1])
    assert chats[-1].name == "chat scripted" and got[tm.PROVIDER_NAME] == "gcp.gen_ai"
    assert got[tm.RESPONSE_FINISH_REASONS] == (types.FinishReason.STOP.value,)
    assert got[tm.USAGE_INPUT_TOKENS] > 0
    compactions = _on(found, stream, tm.COMPACTION)
    assert [attributes(s)[tm.REQUEST_OFFSET] for s in compactions] == sorted(calls.compactions)
