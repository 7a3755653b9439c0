"""Timelines from real agent sessions: turns split at triggers, each request with its
times, usage, verify status and the exact prefix it shares with the previous body; an
incremental build equals a one-pass build, each building an item once however many
requests see it; request bodies and diffs; prices and stats."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.context import AgentContext
from contextfold.context.rebuild import RequestRecorded
from contextfold.errors import InvalidInputError, RebuildError
from contextfold.events import StoredEvent
from contextfold.prices import Price, prices_from_env
from contextfold.telemetry import shared_prefix
from contextfold.timeline import PriceTable, TimelineBuilder, load_prices
from contextfold.timeline.build import build_timeline
from contextfold.timeline.detail import body_diff, request_bodies
from contextfold.timeline.stats import stats_json, stats_of
from contextfold.wire import ModelOutput, NeutralRequest, ToolCall, Usage
from tests.context.helpers import count_item_builds
from tests.timeline.helpers import ticking_clock

STREAM = "timeline/session"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _model(request: NeutralRequest) -> ModelOutput:
    last = request.messages[-2]
    if last.role == "tool":
        usage = Usage(input_tokens=500, output_tokens=10, cached_input_tokens=300)
        return ModelOutput(text="The sum is 5.", usage=usage)
    if "add" in last.content:
        call = ToolCall(id=f"c{len(request.messages)}", name="add", arguments='{"a": 2, "b": 3}')
        usage = Usage(input_tokens=400, output_tokens=20, cached_input_tokens=0)
        return ModelOutput(tool_calls=(call,), usage=usage, finish_reason="tool_calls")
    return ModelOutput(text="Hello.", usage=Usage(input_tokens=100, output_tokens=2))


@pytest.fixture
async def session() -> AsyncIterator[tuple[cf.Journal, list[int]]]:
    """Two turns: a tool-calling question (with a webhook item meanwhile), then a greeting."""
    async with cf.open_journal("memory://", clock=ticking_clock()) as journal:
        agent = cf.Agent(journal, STREAM, cf.FunctionModel(_model, model="gpt-4.1"), tools=[add])
        await journal.append(STREAM, cf.system_prompt("You add numbers."))
        await journal.append(STREAM, cf.ContextAdded(role="user", content="Please add 2 and 3."))
        first = await agent.run_until_idle()
        quiet = cf.ContextAdded(
            role="developer",
            content="CI passed",
            actor=cf.Actor(type="webhook", id="ci"),
            llm_request_policy=cf.LlmRequestPolicy(behaviour="none"),
        )
        await journal.append(STREAM, quiet, actor="webhook")
        await journal.append(STREAM, cf.ContextAdded(role="user", content="hi"), actor="user")
        second = await agent.run_until_idle()
        yield journal, [*first.requests, *second.requests]


async def _events(journal: cf.Journal) -> list[StoredEvent]:
    return [event async for event in journal.read_all(STREAM)]


async def test_turns_requests_and_tool_calls_come_from_the_journal(
    session: tuple[cf.Journal, list[int]],
) -> None:
    journal, offsets = session
    timeline = await build_timeline(journal, STREAM)
    assert [[r.offset for r in t.requests] for t in timeline.turns] == [offsets[:2], offsets[2:]]
    first, second = timeline.turns
    assert [(i.kind, i.text) for i in first.items] == [
        ("context", "You add numbers."),
        ("trigger", "Please add 2 and 3."),
    ]
    assert [(i.kind, i.actor) for i in second.items] == [
        ("context", "webhook:ci"),
        ("trigger", "user"),
    ]
    recorded = {
        e.payload["request_offset"]: e.payload["sha256"]
        for e in await _events(journal)
        if e.type == RequestRecorded.event_type
    }
    bodies = [(await cf.rebuild_request(journal, STREAM, n)).body for n in offsets]
    for n, request in enumerate(timeline.requests):
        assert request.verify == "ok" and request.recorded_sha256 == (recorded[request.offset],)
        assert request.size == len(bodies[n])
        assert request.model == request.response_model == "gpt-4.1"
        assert request.sent_at is not None and request.answered_at is not None
        assert request.requested_at <= request.sent_at <= request.answered_at
        assert request.latency_ms is not None and request.latency_ms > 0
        if n == 0:
            assert request.previous_offset is None and request.prefix_share is None
        else:
            assert request.previous_offset == offsets[n - 1]
            assert request.prefix_bytes == shared_prefix(bodies[n - 1], bodies[n])
            assert request.prefix_share == request.prefix_bytes / len(bodies[n])
    call_request = timeline.requests[0]
    [call] = call_request.tool_calls
    assert call.name == "add" and call.output == "5" and call.is_error is False
    assert call.started_position is not None and call.result_position is not None
    assert call_request.response_position is not None
    assert call_request.response_position < call.started_position < call.result_position
    assert call.latency_ms is not None and call.latency_ms >= 0
    assert timeline.requests[1].usage == Usage(
        input_tokens=500, output_tokens=10, cached_input_tokens=300
    )


async def test_an_incremental_build_equals_a_build_in_one_pass(
    session: tuple[cf.Journal, list[int]],
) -> None:
    events = await _events(session[0])
    whole = await build_timeline(session[0], STREAM)

    @settings(max_examples=25, deadline=None)
    @given(st.lists(st.integers(0, len(events)), max_size=6))
    def check(cuts: list[int]) -> None:
        builder = TimelineBuilder(STREAM)
        start = 0
        for cut in sorted(cuts):
            for event in events[start:cut]:
                builder.add(event)
            builder.snapshot()  # a snapshot changes nothing of what follows
            start = max(start, cut)
        for event in events[start:]:
            builder.add(event)
        assert builder.snapshot() == whole

    check()


async def test_each_item_is_built_once_however_many_requests_see_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The timeline rebuilds a request from the one before it, and request bodies build the
    request before @offset once, then @offset from it: each history item through the
    request is built once (a fresh build per request built each item once per request)."""
    async with cf.open_journal("memory://", clock=ticking_clock()) as journal:
        agent = cf.Agent(journal, STREAM, cf.FunctionModel(_model, model="gpt-4.1"), tools=[add])
        await journal.append(STREAM, cf.system_prompt("You add numbers."))
        for n in range(8):
            await journal.append(STREAM, cf.ContextAdded(role="user", content=f"add 2 and {n}"))
            await agent.run_until_idle()
        built = count_item_builds(monkeypatch)
        timeline = await build_timeline(journal, STREAM)
        last = timeline.requests[-1].offset
        state = await journal.fold(AgentContext, STREAM)
        seen = sum(item.offset < last for item in state.history)
        assert len(timeline.requests) == 16 and {r.verify for r in timeline.requests} == {"ok"}
        assert len(built) == seen
        built.clear()
        bodies = await request_bodies(journal, STREAM, last)
        assert bodies.rendered.sha256 == timeline.requests[-1].rebuilt_sha256
        assert bodies.previous_offset == timeline.requests[-2].offset
        assert len(built) == seen


async def test_a_record_of_other_bytes_is_a_drift_and_an_unrecorded_request_is_unsent(
    session: tuple[cf.Journal, list[int]],
) -> None:
    journal, offsets = session
    bad = RequestRecorded(
        request_offset=offsets[0], transport="openai-chat", sha256="0" * 64, size=1
    )
    await journal.append(STREAM, bad, actor="agent")
    pending = await journal.append(STREAM, cf.LlmRequestRequested(), actor="agent")
    not_agent = cf.LlmResponse(request_offset=pending.first_position, model="x", text="forged")
    await journal.append(STREAM, not_agent, actor="someone")
    timeline = await build_timeline(journal, STREAM)
    by_offset = {r.offset: r for r in timeline.requests}
    assert by_offset[offsets[0]].verify == "drift"
    assert by_offset[offsets[1]].verify == "ok"
    late = by_offset[pending.first_position]
    assert late.verify == "unsent" and late.answered_at is None and late.text == ""


async def test_request_bodies_are_the_rebuilt_request_and_the_one_before(
    session: tuple[cf.Journal, list[int]],
) -> None:
    journal, offsets = session
    bodies = await request_bodies(journal, STREAM, offsets[2])
    assert bodies.rendered == await cf.rebuild_request(journal, STREAM, offsets[2])
    assert bodies.previous == await cf.rebuild_request(journal, STREAM, offsets[1])
    assert bodies.previous_offset == offsets[1]
    assert bodies.header.model == "gpt-4.1"
    diff = bodies.diff
    assert diff is not None
    assert diff.prefix == shared_prefix(bodies.previous.body, bodies.rendered.body)
    first = await request_bodies(journal, STREAM, offsets[0])
    assert first.previous is None and first.diff is None
    with pytest.raises(RebuildError, match="not a model request"):
        await request_bodies(journal, STREAM, 1)


@given(
    common=st.binary(max_size=300),
    middle_a=st.binary(max_size=40),
    middle_b=st.binary(max_size=40),
    tail=st.binary(max_size=300),
)
def test_a_body_diff_rebuilds_both_bodies(
    common: bytes, middle_a: bytes, middle_b: bytes, tail: bytes
) -> None:
    previous, body = common + middle_a + tail, common + middle_b + tail
    diff = body_diff(previous, body)
    assert diff.prefix == shared_prefix(previous, body) >= len(common)
    assert previous[: diff.prefix] + diff.removed + previous[len(previous) - diff.suffix :] == (
        previous
    )
    assert body[: diff.prefix] + diff.added + body[len(body) - diff.suffix :] == body
    assert diff.prefix + diff.suffix <= min(len(previous), len(body))
    assert diff.share == (diff.prefix / len(body) if body else 0.0)


def test_prices_match_by_name_then_by_longest_prefix() -> None:
    table = PriceTable(
        prices={
            "claude-": Price(input=1, output=5),
            "claude-haiku-4-5": Price(input=1, output=5, cached_input=0.1, cache_write=1.25),
            "gpt-4.1": Price(input=2, output=8, cached_input=0.5),
        }
    )
    assert table.price_of("claude-haiku-4-5-20251001") == table.prices["claude-haiku-4-5"]
    assert table.price_of("claude-opus") == table.prices["claude-"]
    assert table.price_of("o3") is None and table.cost("o3", Usage(input_tokens=9)) is None
    usage = Usage(input_tokens=1_000_000, cached_input_tokens=600_000, output_tokens=100_000)
    # 400k fresh at $2, 600k cached at $0.50, 100k out at $8
    assert table.cost("gpt-4.1", usage) == pytest.approx(0.8 + 0.3 + 0.8)
    written = Usage(input_tokens=1_000_000, cache_write_tokens=1_000_000, output_tokens=0)
    assert table.cost("claude-haiku-4-5", written) == pytest.approx(1.25)


def test_price_files_say_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    with pytest.raises(InvalidInputError, match="cannot be read"):
        load_prices(path)
    path.write_text("{nope")
    with pytest.raises(InvalidInputError, match="is not JSON"):
        load_prices(path)
    path.write_text("[1]")
    with pytest.raises(InvalidInputError, match="JSON object of model names"):
        load_prices(path)
    path.write_text(json.dumps({"gpt-4.1": {"input": -1, "output": 8}}))
    with pytest.raises(InvalidInputError, match=r"gpt-4\.1\.input"):
        load_prices(path)
    path.write_text(json.dumps({"gpt-4.1": {"input": 2, "output": 8, "cahced": 1}}))
    with pytest.raises(InvalidInputError, match=r"gpt-4\.1\.cahced"):
        load_prices(path)
    path.write_text(json.dumps({"gpt-4.1": {"input": 2, "output": 8}}))
    assert load_prices(path).prices["gpt-4.1"] == Price(input=2, output=8)
    assert prices_from_env({"CONTEXTFOLD_PRICES": str(path)}) == load_prices(path)
    assert prices_from_env({}) is None


async def test_stats_add_up_what_the_timeline_holds(session: tuple[cf.Journal, list[int]]) -> None:
    journal, offsets = session
    timeline = await build_timeline(journal, STREAM)
    prices = PriceTable(prices={"gpt-4.1": Price(input=2, output=8, cached_input=0.5)})
    stats = stats_of(timeline, prices)
    usages = [r.usage for r in timeline.requests if r.usage is not None]
    assert (stats.requests, stats.turns, stats.tool_calls) == (len(offsets), 2, 1)
    assert stats.input_tokens == sum(u.input_tokens for u in usages) == 1000
    assert stats.cached_input_tokens == 300
    # the greeting's provider reported no cache count: only the two others count
    assert stats.cached_share == pytest.approx(300 / 900)
    sizes = [r.size or 0 for r in timeline.requests[1:]]
    shared = [r.prefix_bytes or 0 for r in timeline.requests[1:]]
    assert stats.prefix_share == pytest.approx(sum(shared) / sum(sizes))
    assert stats.cost == pytest.approx(sum(prices.cost("gpt-4.1", u) or 0 for u in usages))
    assert stats.verify == {"ok": 3, "drift": 0, "error": 0, "unsent": 0}
    assert [lane.lane for lane in stats.lanes] == ["system", "session prefix", "history"]
    assert stats.lanes[0].items == 1 and stats.lanes[2].items == len(timeline.state.history)
    assert stats.context_window == 1_047_576
    assert stats_of(timeline).cost is None
    encoded = stats_json(stats)
    assert encoded["tokens"]["cached_input"] == 300 and encoded["cost"] == stats.cost
