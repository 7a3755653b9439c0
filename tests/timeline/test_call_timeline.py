"""The timeline of a framework's call records, whichever framework recorded them: turns
that start at a new user message, each request with its model, size, prefix shared with
the previous body, verify status, usage, answer and tool calls (their results found in
later requests by call id), compactions as items with their summary; and ``stats``."""

from __future__ import annotations

import pytest

import contextfold as cf
from contextfold.canonical import sha256_hex
from contextfold.context.call_records import CallRecorder, call_body, read_calls
from contextfold.telemetry import shared_prefix
from contextfold.timeline import Price, PriceTable, TimelineBuilder
from contextfold.timeline.build import build_timeline
from contextfold.timeline.encode import timeline_json
from contextfold.timeline.stats import stats_json, stats_of, stats_text
from tests.call_streams import (
    FRAMEWORKS,
    MODEL,
    SUMMARY,
    USAGES,
    answer,
    calls,
    message,
    record_session,
    result,
    user,
)
from tests.timeline.helpers import ticking_clock

STREAM = "framework/session"
PRICES = PriceTable(prices={MODEL: Price(input=2.0, output=8.0, cached_input=0.5)})


@pytest.mark.parametrize("framework", FRAMEWORKS)
async def test_turns_requests_tools_and_compactions(framework: str) -> None:
    async with cf.open_journal("memory://", clock=ticking_clock()) as journal:
        session = await record_session(journal, STREAM, framework, compact_at=80)
        timeline = await build_timeline(journal, STREAM)
        records = await read_calls(journal, STREAM)

    assert len(session.compactions) == 1
    first, second = timeline.turns
    assert [(i.kind, i.role, i.text) for i in first.items] == [
        ("context", "system", "Be brief."),
        ("trigger", "user", "What is the weather in Paris?"),
    ]
    assert [(i.kind, i.text) for i in second.items] == [
        ("compaction", SUMMARY),
        ("trigger", "And in Rome?"),
    ]
    (summary,) = [i for i in second.items if i.kind == "compaction"]
    assert summary.position == session.compactions[0]
    assert summary.summarized == len(records.compactions[summary.position].summarized)
    assert summary.model == MODEL and summary.usage is not None

    requests = timeline.requests
    assert [r.offset for r in requests] == session.requests
    assert [len(t.requests) for t in timeline.turns] == [2, 2]
    bodies = [call_body(records, r.offset) for r in requests]
    for n, (request, body) in enumerate(zip(requests, bodies, strict=True)):
        assert request.framework == framework and request.model == MODEL
        assert request.verify == "ok" and request.rebuilt_sha256 == sha256_hex(body)
        assert request.size == len(body)
        if n:
            assert request.previous_offset == requests[n - 1].offset
            assert request.prefix_bytes == shared_prefix(bodies[n - 1], body)
        assert request.usage == USAGES[n] and request.response_position == session.answers[n]
        assert request.latency_ms is not None and request.latency_ms > 0
    texts = ["", "It is 18C and sunny in Paris.", "", "22C and clear in Rome."]
    assert [r.text for r in requests] == texts
    tools = [(c.call_id, c.name, c.output) for r in requests for c in r.tool_calls]
    assert tools == [("c1", "get_weather", "18C, sunny"), ("c2", "get_weather", "22C, clear")]
    for call in (c for r in requests for c in r.tool_calls):
        assert call.result_position is not None and call.latency_ms is not None
        recorded = records.messages[
            next(d for d, (p, _) in records.messages.items() if p == call.result_position)
        ]
        assert recorded[1].readable.tool_call_id == call.call_id

    stats = stats_of(timeline, PRICES)
    assert (stats.requests, stats.turns, stats.tool_calls, stats.compactions) == (4, 2, 2, 1)
    assert stats.input_tokens == sum(u.input_tokens for u in USAGES)
    assert stats.cached_input_tokens == sum(u.cached_input_tokens or 0 for u in USAGES)
    assert stats.verify["ok"] == 4 and stats.model == MODEL and stats.frameworks == (framework,)
    answered = sum(PRICES.cost(MODEL, u) or 0.0 for u in USAGES)
    assert stats.cost == pytest.approx(answered + (PRICES.cost(MODEL, summary.usage) or 0.0))
    assert [lane.lane for lane in stats.lanes] == [
        "system",
        "summary",
        "history",
        "request options",
    ]
    assert [lane.items for lane in stats.lanes] == [1, 1, 4, 1]
    assert stats.prefix_share is not None and 0 < stats.prefix_share < 1
    text = stats_text(stats)
    assert text[0] == f"stream {STREAM}: {timeline.version} events, recorded by {framework}, " + (
        f"model {MODEL}, window {stats.context_window} tokens"
    )
    assert stats_json(stats)["frameworks"] == [framework]
    encoded = timeline_json(timeline, start=0, limit=10, prices=PRICES)
    assert encoded["turns"][0]["requests"][0]["framework"] == framework
    assert encoded["turns"][1]["items"][0]["summarized"] == summary.summarized


async def test_a_request_that_does_not_rebuild_to_its_digest_drifts() -> None:
    async with cf.open_journal("memory://") as journal:
        session = await record_session(journal, STREAM, "langchain")
        records = await read_calls(journal, STREAM)
        sent = records.requests[session.requests[-1]]
        await journal.append(STREAM, sent.model_copy(update={"sha256": "0" * 64}))
        missing = sent.model_copy(update={"messages": ("f" * 64,)})
        await journal.append(STREAM, missing)
        timeline = await build_timeline(journal, STREAM)
    *_, drifted, broken = timeline.requests
    assert drifted.verify == "drift" and broken.verify == "error"
    assert broken.rebuild_error is not None and "does not hold" in broken.rebuild_error
    assert stats_of(timeline).verify == {"ok": 4, "drift": 1, "error": 1, "unsent": 0}


async def test_calls_without_recorded_answers_still_show_with_their_results() -> None:
    """An integration that records requests only: the tool calls come from the assistant
    messages the next request sends, their results from the request after."""
    async with cf.open_journal("memory://") as journal:
        recorder = CallRecorder(journal, STREAM, "adk")
        history = [message("adk", user("Weather?"))]
        first = await recorder.request(history, model=MODEL, options={})
        history += [message("adk", calls("c9", "get_weather", "{}"))]
        history += [message("adk", result("c9", "get_weather", "sunny"))]
        second = await recorder.request(history, model=MODEL, options={})
        history += [message("adk", answer("Sunny.")), message("adk", user("Thanks!"))]
        third = await recorder.request(history, model=MODEL, options={})
        timeline = await build_timeline(journal, STREAM)
    assert [[r.offset for r in t.requests] for t in timeline.turns] == [[first, second], [third]]
    (call,) = timeline.requests[0].tool_calls
    assert (call.call_id, call.output) == ("c9", "sunny") and call.result_position is not None
    assert timeline.requests[0].usage is None and stats_of(timeline).answered == 0


async def test_an_agent_and_a_framework_on_one_stream_in_order_and_incremental() -> None:
    async with cf.open_journal("memory://", clock=ticking_clock()) as journal:
        await journal.append(STREAM, cf.system_prompt("Be brief."))
        await journal.append(STREAM, cf.ContextAdded(role="user", content="hi"))
        agent = cf.Agent(journal, STREAM, cf.FunctionModel(lambda request: "hello"))
        offsets = list((await agent.run_until_idle()).requests)
        session = await record_session(journal, STREAM, "pydantic-ai")
        timeline = await build_timeline(journal, STREAM)
        # The server's way: event by event, a snapshot taken midway.
        builder = TimelineBuilder(STREAM)
        async for stored in journal.read_all(STREAM):
            builder.add(stored)
            if stored.position == session.requests[1]:
                midway = builder.snapshot()
    assert [t.index for t in timeline.turns] == [0, 1, 2]
    assert [[r.offset for r in t.requests] for t in timeline.turns] == [
        offsets,
        session.requests[:2],
        session.requests[2:],
    ]
    assert [r.framework for r in timeline.requests] == [None, *["pydantic-ai"] * 4]
    assert builder.snapshot() == timeline
    assert [r.offset for r in midway.requests] == [*offsets, *session.requests[:2]]
    assert midway.requests[-1].answered_at is None
    # An agent's header decides the model and lanes; the frameworks are still named.
    stats = stats_of(timeline)
    assert stats.model == "function-model" and stats.frameworks == ("pydantic-ai",)
    assert [lane.lane for lane in stats.lanes] == ["system", "session prefix", "history"]
