"""OpenTelemetry: the agent loop's GenAI spans (turn, model request, tool call, compaction)
and the journal's append and fold-read metrics, read back through the SDK's in-memory
exporter and reader; without an SDK nothing records and the prefix measure is skipped.

The SDK's providers are process-global and set once: the fixtures install them unless
another test module did (and then read through what it installed).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import contextfold as cf
from contextfold import telemetry as tm
from contextfold.context.compaction import COMPACTION_INSTRUCTION
from contextfold.context.rebuild import RequestRecorded
from contextfold.runtime.events import RequestSent, ToolFinished
from contextfold.runtime.spans import LoopSpans
from contextfold.runtime.tools import ToolOutcome
from contextfold.wire import ModelOutput, NeutralRequest, RenderedRequest, ToolCall, Usage

STREAM = "otel/session"


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


@pytest.fixture(scope="module")
def metric_reader() -> InMemoryMetricReader:
    current = metrics.get_meter_provider()
    if isinstance(current, MeterProvider):  # another test module installed the SDK already
        found = [r for r in current._metric_readers if isinstance(r, InMemoryMetricReader)]
        if not found:
            pytest.skip("a global MeterProvider without an InMemoryMetricReader is already set")
        return found[0]
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def _sum(reader: InMemoryMetricReader, name: str, **attributes: object) -> float:
    total = 0.0
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name or not isinstance(metric.data, Sum):
                    continue
                for point in metric.data.data_points:
                    if attributes.items() <= dict(point.attributes or {}).items():
                        total += point.value
    return total


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _calling_model(request: NeutralRequest) -> ModelOutput:
    last = request.messages[-2]
    if last.role == "tool":
        usage = Usage(input_tokens=400, output_tokens=9, cached_input_tokens=256)
        return ModelOutput(text="The sum is 5.", usage=usage, finish_reason="stop")
    call = ToolCall(id="c1", name="add", arguments='{"a": 2, "b": 3}')
    usage = Usage(input_tokens=300, output_tokens=12, cached_input_tokens=0)
    return ModelOutput(tool_calls=(call,), usage=usage, finish_reason="tool_calls")


def _offset(span: ReadableSpan) -> int:
    offset = (span.attributes or {})[tm.REQUEST_OFFSET]
    assert isinstance(offset, int)
    return offset


def _by_operation(found: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    """The spans of GenAI operation ``name``, or of contextfold operation ``name`` (a
    compaction's chat span is both)."""
    return [
        s
        for s in found
        if name
        in (
            (s.attributes or {}).get(tm.OPERATION_NAME),
            (s.attributes or {}).get(tm.CONTEXTFOLD_OPERATION),
        )
    ]


async def test_a_turn_is_one_span_with_its_requests_and_tool_calls_under_it(
    spans: InMemorySpanExporter,
) -> None:
    async with cf.open_journal("memory://") as journal:
        await journal.append(STREAM, cf.system_prompt("You add numbers."))
        await journal.append(STREAM, cf.ContextAdded(role="user", content="What is 2 + 3?"))
        model = cf.FunctionModel(_calling_model, model="gpt-test")
        report = await cf.Agent(journal, STREAM, model, tools=[add]).run_until_idle()
        recorded = {
            e.payload["request_offset"]: e.payload["sha256"]
            for e in (await journal.read(STREAM, types=[RequestRecorded])).events
        }
        bodies = [(await cf.rebuild_request(journal, STREAM, n)).body for n in report.requests]

    found = spans.get_finished_spans()
    [turn] = _by_operation(found, tm.AGENT_TURN)
    requests = _by_operation(found, tm.MODEL_REQUEST)
    [tool] = _by_operation(found, tm.EXECUTE_TOOL)
    assert turn.attributes is not None and turn.context is not None
    assert turn.attributes[tm.STREAM] == STREAM
    assert turn.attributes["contextfold.turn.requests"] == 2
    assert turn.attributes["contextfold.turn.tool_calls"] == 1
    for child in (*requests, tool):
        assert child.parent is not None and child.parent.span_id == turn.context.span_id

    first, second = sorted(requests, key=_offset)
    assert [_offset(first), _offset(second)] == report.requests
    for span in (first, second):
        attrs = span.attributes or {}
        assert span.name == "chat gpt-test"
        assert attrs[tm.REQUEST_MODEL] == "gpt-test"
        assert attrs[tm.PROVIDER_NAME] == "openai"
        offset = attrs[tm.REQUEST_OFFSET]
        assert attrs[tm.REQUEST_SHA256] == recorded[offset]
    assert (first.attributes or {})[tm.RESPONSE_FINISH_REASONS] == ("tool_calls",)
    attrs = second.attributes or {}
    assert attrs[tm.USAGE_INPUT_TOKENS] == 400
    assert attrs[tm.USAGE_OUTPUT_TOKENS] == 9
    assert attrs[tm.USAGE_CACHE_READ_TOKENS] == 256
    assert tm.USAGE_CACHE_WRITE_TOKENS not in attrs  # not reported: absent, not zero
    assert attrs[tm.RESPONSE_FINISH_REASONS] == ("stop",)
    # the prompt cache: the second body starts with most of the first one, byte for byte
    shared = tm.shared_prefix(bodies[0], bodies[1])
    assert attrs[tm.REQUEST_PREFIX_BYTES] == shared > 0
    assert attrs[tm.REQUEST_PREFIX_SHARE] == pytest.approx(shared / len(bodies[1]))
    assert tm.REQUEST_PREFIX_SHARE not in (first.attributes or {})  # no previous body

    tool_attrs = tool.attributes or {}
    assert tool.name == "execute_tool add"
    assert tool_attrs[tm.TOOL_NAME] == "add"
    assert tool_attrs[tm.TOOL_CALL_ID] == "c1"
    assert tool_attrs[tm.REQUEST_OFFSET] == report.requests[0]
    assert tool.status.status_code is StatusCode.UNSET


async def test_a_failed_request_and_a_failing_tool_mark_their_spans(
    spans: InMemorySpanExporter,
) -> None:
    def broken(a: int) -> int:
        """Always fails."""
        raise RuntimeError("no luck")

    answers = iter(["call", "boom"])

    def model(request: NeutralRequest) -> ModelOutput:
        if next(answers) == "call":
            return ModelOutput(tool_calls=(ToolCall(id="b1", name="broken", arguments="{}"),))
        raise ConnectionError("provider down")

    async with cf.open_journal("memory://") as journal:
        await journal.append(STREAM, cf.system_prompt("Agent."))
        await journal.append(STREAM, cf.ContextAdded(role="user", content="go"))
        agent = cf.Agent(journal, STREAM, cf.FunctionModel(model), tools=[broken])
        with pytest.raises(cf.ModelError):
            await agent.run_until_idle()

    found = spans.get_finished_spans()
    [turn] = _by_operation(found, tm.AGENT_TURN)
    [tool] = _by_operation(found, tm.EXECUTE_TOOL)
    failed = [s for s in _by_operation(found, tm.MODEL_REQUEST) if s.status.is_ok is False]
    assert tool.status.status_code is StatusCode.ERROR
    assert len(failed) == 1 and failed[0].events[0].name == "exception"
    assert turn.status.status_code is StatusCode.ERROR


async def test_compaction_gets_a_span_naming_the_request_it_summarizes(
    spans: InMemorySpanExporter,
) -> None:
    def model(request: NeutralRequest) -> ModelOutput:
        if COMPACTION_INSTRUCTION in request.messages[-1].content:
            return ModelOutput(text="short summary", usage=Usage(input_tokens=10, output_tokens=5))
        return ModelOutput(text="ok", usage=Usage(input_tokens=7_000, output_tokens=5))

    async with cf.open_journal("memory://") as journal:
        await journal.append(STREAM, cf.system_prompt("Agent."))
        await journal.append(STREAM, cf.ContextAdded(role="user", content="hello"))
        agent = cf.Agent(
            journal,
            STREAM,
            cf.FunctionModel(model, model="contextfold-local"),
            compaction_threshold=0.5,
        )
        report = await agent.run_until_idle()
    assert report.compactions
    [compaction] = _by_operation(spans.get_finished_spans(), tm.COMPACTION)
    assert (compaction.attributes or {})[tm.REQUEST_OFFSET] == report.compactions[0]


async def test_an_idle_run_exports_no_turn(spans: InMemorySpanExporter) -> None:
    async with cf.open_journal("memory://") as journal:
        await journal.append(STREAM, cf.system_prompt("Agent."))
        await cf.Agent(journal, STREAM, cf.FunctionModel(lambda r: "hi")).run_until_idle()
    assert spans.get_finished_spans() == ()


def test_a_call_answered_without_running_gets_a_span_saying_so(
    spans: InMemorySpanExporter,
) -> None:
    loop = LoopSpans("default", STREAM, "m", "anthropic")
    loop.start_turn()
    call = ToolCall(id="x1", name="pay")
    loop.on_event(ToolFinished(call=call, outcome=ToolOutcome("x1", "pay", "no", is_error=True)))
    loop.end_turn("idle", "")
    [tool] = _by_operation(spans.get_finished_spans(), tm.EXECUTE_TOOL)
    assert (tool.attributes or {})["contextfold.tool.not_rerun"] is True


def test_spans_left_open_end_with_the_turn(spans: InMemorySpanExporter) -> None:
    loop = LoopSpans("default", STREAM, "m", "anthropic")
    loop.start_turn()
    rendered = RenderedRequest(transport="anthropic", body=b'{"x":1}')
    neutral = NeutralRequest(model="m", system="", messages=())
    loop.on_event(RequestSent(offset=3, rendered=rendered, neutral=neutral))
    loop.end_turn("idle", "")
    [request] = _by_operation(spans.get_finished_spans(), tm.MODEL_REQUEST)
    assert request.status.status_code is StatusCode.ERROR
    assert (request.attributes or {})[tm.PROVIDER_NAME] == "anthropic"


async def test_appends_and_fold_reads_are_counted(metric_reader: InMemoryMetricReader) -> None:
    namespace = "otel-metrics"
    appends = {"contextfold.namespace": namespace}
    async with cf.open_journal("memory://", namespace=namespace) as journal:
        before = _sum(metric_reader, "contextfold.journal.appends", **appends)
        events = _sum(metric_reader, "contextfold.journal.appended_events", **appends)
        batch = [cf.ContextAdded(role="user", content=str(n)) for n in range(3)]
        await journal.append(STREAM, batch, idempotency_key="k")
        await journal.append(STREAM, batch, idempotency_key="k")  # a retry: nothing written
        assert _sum(metric_reader, "contextfold.journal.appends", **appends) == before + 2
        assert _sum(metric_reader, "contextfold.journal.appended_events", **appends) == events + 3
        dedup = {**appends, "contextfold.append.deduplicated": True}
        assert _sum(metric_reader, "contextfold.journal.appends", **dedup) >= 1

        reads = {"contextfold.fold": cf.AgentContext.name, "contextfold.namespace": namespace}
        start = _sum(metric_reader, "contextfold.fold.reads", **reads)
        await journal.fold(cf.AgentContext, STREAM)
        await journal.fold(cf.AgentContext, STREAM)
        assert _sum(metric_reader, "contextfold.fold.reads", **reads) == start + 2


_NO_SDK = textwrap.dedent(
    """
    import asyncio, json
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    import contextfold as cf
    from contextfold import telemetry

    # Metrics have a provider of their own: set, it records although nothing traces.
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

    def refuse(*args):
        raise AssertionError("the prefix measure ran without an SDK")

    telemetry.shared_prefix = refuse
    started = []
    start_span = telemetry.TRACER.start_span

    def counting(*args, **options):
        started.append(args[0])
        return start_span(*args, **options)

    telemetry.TRACER.start_span = counting

    async def main():
        async with cf.open_journal("memory://") as journal:
            await journal.append("s", cf.system_prompt("Agent."))
            for text in ("one", "two"):
                await journal.append("s", cf.ContextAdded(role="user", content=text))
                await cf.Agent(journal, "s", cf.FunctionModel(lambda r: "ok")).run_until_idle()
        made = list(started)
        span = telemetry.TRACER.start_span("probe")
        usage = [
            point.count
            for resource in reader.get_metrics_data().resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
            if metric.name == "gen_ai.client.token.usage"
            for point in metric.data.data_points
        ]
        return {
            "provider": type(trace.get_tracer_provider()).__name__,
            "recording": span.is_recording(),
            "spans_made": made,
            "token_usage_records": sum(usage),
        }

    print(json.dumps(asyncio.run(main())))
    """
)


def test_without_an_sdk_no_span_is_made_and_the_prefix_is_not_measured(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _NO_SDK], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    # No span is made at all (each would be a no-op), yet the token metric of both
    # responses is recorded (input and output: two records each).
    assert json.loads(done.stdout) == {
        "provider": "ProxyTracerProvider",
        "recording": False,
        "spans_made": [],
        "token_usage_records": 4,
    }


@given(
    common=st.binary(max_size=9000),
    left=st.binary(max_size=50),
    right=st.binary(max_size=50),
)
def test_shared_prefix_is_the_longest_common_head(common: bytes, left: bytes, right: bytes) -> None:
    a, b = common + left, common + right
    naive = 0
    while naive < min(len(a), len(b)) and a[naive] == b[naive]:
        naive += 1
    assert tm.shared_prefix(a, b) == naive == tm.shared_prefix(b, a)
    assert a[:naive] == b[:naive]
    share = tm.prefix_share(a, b)
    if b:
        assert share is not None and 0 <= share <= 1 and share == naive / len(b)
    else:
        assert share is None
    assert tm.prefix_share(None, b) is None
