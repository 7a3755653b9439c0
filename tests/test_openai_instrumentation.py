"""OpenAI's official instrumentation (opentelemetry-instrumentation-openai-v2) beside
contextfold: it wraps the SDK's ``create()``, and contextfold posts the exact recorded bytes
past it, so a cf.Agent request through cf.OpenAIChatModel is reported once, by contextfold's
own ``chat`` span (which carries what the instrumentation would: provider, models, server,
response id, finish reasons, usage), and never twice. The same instrumented client's own
``create()`` is still reported by it: the instrumentation is on."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import contextfold as cf
from contextfold import telemetry as tm
from tests.otel import attributes, of_operation, span_exporter
from tests.runtime.helpers import loopback

STREAM = "otel/instrumented"


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    return span_exporter()


@pytest.fixture
def instrumented(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    exporter.clear()
    instrumentor = OpenAIInstrumentor()  # type: ignore[no-untyped-call]
    instrumentor.instrument(tracer_provider=trace.get_tracer_provider())
    try:
        yield exporter
    finally:
        instrumentor.uninstrument()


def _answer(text: str) -> dict[str, object]:
    return {
        "id": "chatcmpl-once",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4.1-2025-04-14",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22},
    }


def _theirs(found: tuple[ReadableSpan, ...]) -> list[ReadableSpan]:
    """The spans of another tracer than contextfold's (the instrumentation's)."""
    return [
        s
        for s in found
        if s.instrumentation_scope is not None and s.instrumentation_scope.name != "contextfold"
    ]


async def test_a_request_through_cf_openai_chat_model_is_reported_once(
    instrumented: InMemorySpanExporter,
) -> None:
    with loopback([_answer("Hi."), _answer("Direct.")]) as server:
        base_url = f"{server.base_url}/v1"
        model = cf.OpenAIChatModel("gpt-4.1", base_url=base_url, api_key="t")
        async with cf.open_journal("memory://") as journal:
            await journal.append(STREAM, cf.system_prompt("Be brief."))
            await journal.append(STREAM, cf.ContextAdded(role="user", content="hello"))
            agent = cf.Agent(journal, STREAM, model, context_window=128_000)
            report = await agent.run_until_idle()
        found = instrumented.get_finished_spans()
        [ours] = of_operation(found, tm.MODEL_REQUEST)
        assert _theirs(found) == []  # the instrumentation saw nothing of contextfold's request
        assert len(report.requests) == 1
        got = attributes(ours)
        assert got[tm.RESPONSE_ID] == "chatcmpl-once" and got[tm.PROVIDER_NAME] == "openai"
        assert got[tm.RESPONSE_MODEL] == "gpt-4.1-2025-04-14" and got[tm.USAGE_INPUT_TOKENS] == 20

        # The same kind of client, called through create(): the instrumentation reports it.
        instrumented.clear()
        client = openai.AsyncOpenAI(base_url=base_url, api_key="t", max_retries=0)
        await client.chat.completions.create(
            model="gpt-4.1", messages=[{"role": "user", "content": "hello"}]
        )
        await client.close()
        [theirs] = _theirs(instrumented.get_finished_spans())
        assert theirs.name == "chat gpt-4.1"
        # Every attribute it records, contextfold's span records too, under the same name.
        recorded = {key for key in attributes(theirs) if key.startswith(("gen_ai.", "server."))}
        assert recorded and recorded <= got.keys(), recorded - got.keys()
