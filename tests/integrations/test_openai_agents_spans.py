"""JournalModel makes the OpenTelemetry spans of contextfold's agent loop: a turn per Runner
run, a ``chat {model}`` span per request with the GenAI attributes, the request's offset and
body hash, and a span per compaction; read back through the SDK's in-memory exporter.

The SDK's tracer provider is process-global and set once: the fixture installs it unless
another test module did (and then reads through what it installed)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from agents import Agent, Runner
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import contextfold as cf
from contextfold import telemetry as tm
from contextfold.integrations.openai_agents import JournalModel
from tests.integrations.helpers import decoded
from tests.integrations.openai_agents_worker import Worker, read_file


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    found = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(found))
    yield found
    found.clear()


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> InMemorySpanExporter:
    exporter.clear()
    return exporter


@pytest.fixture
async def journal() -> AsyncIterator[cf.Journal]:
    async with cf.open_journal("memory://") as opened:
        yield opened


def of(found: tuple[ReadableSpan, ...], operation: str, stream: str) -> list[ReadableSpan]:
    return [
        span
        for span in found
        if span.attributes is not None
        and operation
        in (span.attributes.get(tm.OPERATION_NAME), span.attributes.get(tm.CONTEXTFOLD_OPERATION))
        and span.attributes.get(tm.STREAM) == stream
    ]


async def test_each_run_is_a_turn_of_chat_and_compaction_spans(
    journal: cf.Journal, spans: InMemorySpanExporter
) -> None:
    client = cf.FunctionModel(Worker(), transport="openai-responses", model="gpt-test")
    model = JournalModel(client, journal, "traced", compact_at=3_000)
    agent = Agent(name="worker", model=model, tools=[read_file])
    for n in range(6):
        await Runner.run(agent, f"task {n}")
    found = spans.get_finished_spans()
    turns = of(found, tm.AGENT_TURN, "traced")
    compactions = of(found, tm.COMPACTION, "traced")
    chats = [span for span in of(found, tm.MODEL_REQUEST, "traced") if span not in compactions]
    assert len(turns) == 6
    assert all(span.name == "chat gpt-test" for span in chats)
    recorded = [
        decoded(event, cf.RequestRecorded)
        async for event in journal.read_all("traced", types=[cf.RequestRecorded])
    ]
    assert [span.attributes and span.attributes[tm.REQUEST_OFFSET] for span in chats] == [
        record.request_offset for record in recorded
    ]
    assert [span.attributes and span.attributes[tm.REQUEST_SHA256] for span in chats] == [
        record.sha256 for record in recorded
    ]
    first = chats[0].attributes
    assert first is not None
    assert first[tm.PROVIDER_NAME] == "openai"
    assert first[tm.REQUEST_MODEL] == "gpt-test"
    assert first[tm.CONVERSATION_ID] == "traced"
    assert first[tm.USAGE_INPUT_TOKENS] == recorded[0].size // 4  # the function model's usage
    assert first[tm.RESPONSE_FINISH_REASONS] == ("stop",)
    assert chats[1].attributes and tm.REQUEST_PREFIX_SHARE in chats[1].attributes
    # Every request and compaction span is a child of its turn's span.
    turn_ids = {span.context.span_id for span in turns}
    for child in (*chats, *compactions):
        assert child.parent is not None and child.parent.span_id in turn_ids
    summaries = [
        decoded(event, cf.ContextAdded)
        async for event in journal.read_all("traced", types=[cf.ContextAdded])
    ]
    cutoffs = [item.compaction.replaces_history_through for item in summaries if item.compaction]
    assert (
        cutoffs
        and [span.attributes and span.attributes[tm.REQUEST_OFFSET] for span in compactions]
        == cutoffs
    )
    assert all(span.status.status_code != StatusCode.ERROR for span in (*turns, *chats))


async def test_a_failed_request_ends_its_spans_with_the_error(
    journal: cf.Journal, spans: InMemorySpanExporter
) -> None:
    def down(request: cf.NeutralRequest) -> str:
        raise RuntimeError("provider down")

    client = cf.FunctionModel(down, transport="openai-chat", model="gpt-test")
    agent = Agent(name="down", model=JournalModel(client, journal, "failing"))
    with pytest.raises(cf.ModelError):
        await Runner.run(agent, "hi")
    found = spans.get_finished_spans()
    [chat] = of(found, tm.MODEL_REQUEST, "failing")
    [turn] = of(found, tm.AGENT_TURN, "failing")
    assert chat.status.status_code == StatusCode.ERROR
    assert turn.status.status_code == StatusCode.ERROR
