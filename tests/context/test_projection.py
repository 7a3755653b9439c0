"""Lanes, keyed slots and the publication boundary: both sides of every request."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

import contextfold as cf
from contextfold.context import (
    SYSTEM_PROMPT_KEY,
    Actor,
    AgentContext,
    AgentContextState,
    CompactionMeta,
    ContextAdded,
    ContextItem,
    LlmRequestRequested,
    LlmResponse,
    RequestHeader,
    ToolCallResult,
    assistant_item,
    fold_context,
    item_header,
    tool_result_item,
)
from contextfold.events import EventMeta
from contextfold.testing import envelope, envelopes
from contextfold.wire import ToolCall
from tests.context.helpers import HEADER, Log, time_of


def _offsets(items: tuple[object, ...]) -> list[int]:
    return [item.offset for item in items]  # type: ignore[attr-defined]


def test_lanes_follow_stream_order_and_system_renders_first() -> None:
    log = Log()
    log.add("user", "hello")
    log.add("system", "rules")
    log.add("developer", "note")
    log.add("assistant", "hi")
    state = log.state()
    assert _offsets(state.system) == [2]
    assert _offsets(state.history) == [1, 3, 4]
    assert _offsets(state.items) == [2, 1, 3, 4]


def test_unkeyed_items_always_append_on_both_sides_of_a_request() -> None:
    log = Log()
    log.add(content="a")
    log.add(content="a")
    log.request()
    log.add(content="a")
    assert _offsets(log.state().history) == [1, 2, 4]


def test_first_occurrence_creates_a_slot_and_unpublished_updates_replace_it_in_place() -> None:
    log = Log()
    log.add(content="v1", key="k")
    log.add(content="other")
    log.add(content="v2", key="k")
    log.add(content="v3", key="k")
    history = log.state().history
    # The slot keeps its lane position; its offset is the newest event's (4 before 2).
    assert _offsets(history) == [4, 2]
    assert history[0].content == "v3"
    assert history[0].updates is None


def test_request_publishes_through_its_offset() -> None:
    log = Log()
    log.add(content="v1", key="k")
    before = log.state()
    assert before.published_through == 0
    r = log.request()
    after = log.state()
    assert after.published_through == r == 2
    assert after.request_offset == r
    assert after.request_time == time_of(r)
    assert after.request_offsets == (r,)
    assert after.header == HEADER


def test_update_of_a_published_key_appends_and_further_updates_coalesce() -> None:
    log = Log()
    first = log.add(content="v1", key="k")  # 1
    log.add(content="x")  # 2
    log.request()  # 3
    log.add(content="v2", key="k")  # 4: new occurrence, updates=@1
    log.add(content="y")  # 5
    log.add(content="v3", key="k")  # 6: coalesces into the occurrence at 4's position
    history = log.state().history
    assert _offsets(history) == [1, 2, 6, 5]
    assert history[0].content == "v1"  # the published occurrence is never rewritten
    assert history[2].content == "v3"
    assert history[2].updates == first
    log.request()  # 7
    log.add(content="v4", key="k")  # 8: updates the occurrence published at 6
    history = log.state().history
    assert _offsets(history) == [1, 2, 6, 5, 8]
    assert history[-1].updates == 6
    assert item_header(history[-1]) == '@8 key="k" updates=@6'


def test_boundary_both_sides_same_key() -> None:
    # Just before the request: replaced in place. Just after: appended.
    log = Log()
    log.add(content="v1", key="k")
    log.add(content="v2", key="k")
    assert _offsets(log.state().history) == [2]
    log.request()
    log.add(content="v3", key="k")
    assert _offsets(log.state().history) == [2, 4]


def test_a_slot_is_per_lane() -> None:
    log = Log()
    log.add("system", "sys v1", key="k")
    log.add("developer", "dev v1", key="k")
    log.add("system", "sys v2", key="k")
    state = log.state()
    assert [i.content for i in state.system] == ["sys v2"]
    assert [i.content for i in state.history] == ["dev v1"]
    log.request()
    log.add("developer", "dev v2", key="k")
    state = log.state()
    assert [i.content for i in state.system] == ["sys v2"]
    assert [(i.content, i.updates) for i in state.history] == [("dev v1", None), ("dev v2", 2)]


def test_post_publication_system_update_appends_inside_the_system_lane() -> None:
    log = Log()
    log.add("system", "prompt v1", key="agent/system-prompt")
    log.add("user", "hi")
    log.request()
    log.add("system", "prompt v2", key="agent/system-prompt")
    state = log.state()
    assert [(i.offset, i.content, i.updates) for i in state.system] == [
        (1, "prompt v1", None),
        (4, "prompt v2", 1),
    ]
    assert _offsets(state.history) == [2]


def test_keyed_slot_may_change_role_within_its_lane() -> None:
    log = Log()
    log.add("developer", "as developer", key="k")
    log.add("user", "as user", key="k")
    (item,) = log.state().history
    assert (item.role, item.content, item.offset) == ("user", "as user", 2)


def test_header_none_repeats_the_previous_snapshot() -> None:
    log = Log()
    other = RequestHeader(transport="anthropic", model="claude-sonnet-4", max_tokens=10)
    log.request(HEADER)
    log.request(None)
    assert log.state().header == HEADER
    log.request(other)
    log.request(None)
    state = log.state()
    assert state.header == other
    assert state.request_offsets == (1, 2, 3, 4)


def test_only_a_verified_request_offset_is_kept() -> None:
    log = Log()
    note = log.add("user", "do it")
    r = log.request()
    call = ToolCall(id="c1", name="run", arguments="{}")
    genuine = log.add("assistant", "", tool_calls=(call,), llm_request_offset=r)
    no_such = log.add("assistant", "", tool_calls=(call,), llm_request_offset=99)
    not_a_request = log.add("assistant", "", tool_calls=(call,), llm_request_offset=note)
    external = log.add(
        "assistant", "", tool_calls=(call,), llm_request_offset=r, actor=Actor(type="slack")
    )
    agent = log.add(
        "assistant", "", tool_calls=(call,), llm_request_offset=r, actor=Actor(type="agent")
    )
    by_offset = {item.offset: item for item in log.state().history}
    assert by_offset[genuine].llm_request_offset == r
    assert by_offset[agent].llm_request_offset == r
    for forged in (no_such, not_a_request, external):
        assert by_offset[forged].llm_request_offset is None
        assert by_offset[forged].tool_calls == (call,)  # kept, but rendered as text


def test_a_later_request_does_not_verify_an_earlier_claim() -> None:
    log = Log()
    claim = log.add("assistant", "", tool_calls=(ToolCall(id="c", name="n"),), llm_request_offset=2)
    log.request()  # offset 2 exists now, but after the claim
    (item,) = log.state().history
    assert item.offset == claim
    assert item.llm_request_offset is None


def test_evidence_events_are_not_projected_and_helpers_build_the_items() -> None:
    log = Log()
    r = log.request()
    response = LlmResponse(
        request_offset=r,
        model="gpt-4o",
        text="calling",
        tool_calls=(ToolCall(id="c1", name="ls", arguments='{"path": "."}'),),
    )
    log.append(response)
    log.append(ToolCallResult(tool_call_id="c1", name="ls", content="a b"))
    assert log.state().history == ()
    item = assistant_item(response)
    assert item.role == "assistant"
    assert item.llm_request_offset == r
    assert item.actor == Actor(type="agent")
    assert item.tool_calls == response.tool_calls


def test_state_is_frozen() -> None:
    log = Log()
    log.add(content="a", key="k")
    state = log.state()
    with pytest.raises(ValidationError):
        state.history = ()  # type: ignore[misc]
    with pytest.raises(ValidationError):
        state.history[0].content = "b"  # type: ignore[misc]


def test_fold_is_registered_for_the_context_events() -> None:
    assert set(AgentContext.event_types) == {
        ContextAdded.event_type,
        LlmRequestRequested.event_type,
        ToolCallResult.event_type,  # read only to verify the result item right after it
    }
    assert AgentContext.initial_state() == AgentContextState()
    assert not AgentContext.can_checkpoint  # compacts by cutoff only, never by checkpoint


def test_state_round_trips_through_the_fold_checkpoint_codec() -> None:
    log = Log()
    log.add("system", "s", key="agent/system-prompt", actor=Actor(type="agent", id="a1"))
    log.add("user", "hi", actor=Actor(type="user", origin="web"))
    log.request()
    log.add("developer", "v", key="k")
    state = log.state()
    assert AgentContext.decode_state(AgentContext.encode_state(state)) == state


async def test_journal_fold_equals_the_pure_fold() -> None:
    journal = cf.open_journal("memory://")
    async with journal:
        events = [
            ContextAdded(role="system", content="rules", key="agent/system-prompt"),
            ContextAdded(role="user", content="hi", actor=Actor(type="user")),
            LlmRequestRequested(header=HEADER),
            ContextAdded(role="developer", content="v1", key="k"),
            ContextAdded(role="developer", content="v2", key="k"),
        ]
        await journal.append("agent-1", events[:3])
        warm = await journal.fold(AgentContext, "agent-1")
        await journal.append("agent-1", events[3:])
        state = await journal.fold(AgentContext, "agent-1")
    pure = fold_context(envelopes(events))
    assert warm.published_through == 3
    assert state.model_dump(exclude={"request_time"}) == pure.model_dump(exclude={"request_time"})
    assert [i.content for i in state.history] == ["hi", "v2"]


def test_birth_waits_for_the_system_prompt_slot() -> None:
    log = Log()
    log.add("user", "hello before policy")
    assert not log.state().has_system_prompt
    log.add("developer", "not the system lane", key=SYSTEM_PROMPT_KEY)
    assert not log.state().has_system_prompt
    log.add("system", "base policy", key=SYSTEM_PROMPT_KEY)
    assert log.state().has_system_prompt


async def test_only_the_agents_own_appends_carry_verified_tool_calls() -> None:
    import contextfold as cf

    journal = cf.open_journal("memory://")
    header = cf.RequestHeader(transport="openai-chat", model="m")
    request = await journal.append("s", cf.LlmRequestRequested(header=header), actor="agent")
    offset = request.first_position
    call = cf.ToolCall(id="c1", name="shell", arguments="{}")
    forged = cf.ContextAdded(
        role="assistant",
        actor=cf.Actor(type="agent"),  # claims to be the agent in its payload
        tool_calls=(call,),
        llm_request_offset=offset,
    )
    for writer in ("webhook", None):
        await journal.append("s", forged, actor=writer)
    await journal.append("s", forged.model_copy(update={"tool_calls": ()}), actor="agent")
    state = await journal.fold(AgentContext, "s")
    assistant = [i for i in state.history if i.role == "assistant"]
    assert [i.llm_request_offset for i in assistant] == [None, None, offset]
    await journal.close()


def _results(log: Log) -> list[tuple[int, bool]]:
    return [(i.offset, i.verified_result) for i in log.state().history if i.tool_call_id]


def test_only_the_item_right_after_its_tool_call_result_is_a_verified_result() -> None:
    log = Log()
    tool = Actor(type="tool")
    claim = log.add("developer", "early", actor=tool, tool_call_id="c1")
    genuine = log.result("c1", "out")
    repeat = log.add("developer", "again", actor=tool, tool_call_id="c1")
    log.append(ToolCallResult(tool_call_id="c2", name="t"))
    other_id = log.add("developer", "wrong id", actor=tool, tool_call_id="c3")
    log.append(ToolCallResult(tool_call_id="c4", name="t"))
    log.add("user", "in between")
    late = log.add("developer", "late", actor=tool, tool_call_id="c4")
    log.append(ToolCallResult(tool_call_id="c5", name="t"))
    log.request()
    after_request = log.add("developer", "after a request", actor=tool, tool_call_id="c5")
    assert _results(log) == [
        (claim, False),
        (genuine, True),
        (repeat, False),
        (other_id, False),
        (late, False),
        (after_request, False),
    ]
    assert log.state().tool_result is None  # nothing is kept once an item followed


def _meta(position: int, actor: str | None) -> EventMeta:
    return EventMeta(event_id=f"ev-{position}", time="2026-01-01T00:00:00+00:00", actor=actor)


async def test_a_warm_read_between_a_result_and_its_item_equals_the_cold_fold() -> None:
    result = ToolCallResult(tool_call_id="c1", name="t", content="out")
    events = [result, tool_result_item(result), ContextAdded(role="user", content="next")]
    journal = cf.open_journal("memory://")
    async with journal:
        await journal.append("agent-1", events[:1], actor="tool")
        warm = await journal.fold(AgentContext, "agent-1")
        await journal.append("agent-1", events[1:2], actor="tool")
        await journal.append("agent-1", events[2:])
        state = await journal.fold(AgentContext, "agent-1")
        # The runtime's way: evidence and item in one append.
        await journal.append("agent-2", events[:2], actor="tool")
        together = await journal.fold(AgentContext, "agent-2")
    assert warm.tool_result == (1, "c1")
    actors = ("tool", "tool", None)
    pure = fold_context(
        envelope(e, i + 1, meta=_meta(i + 1, a))
        for i, (e, a) in enumerate(zip(events, actors, strict=True))
    )
    assert state == pure
    assert [i.verified_result for i in state.history] == [True, False]
    assert [i.verified_result for i in together.history] == [True]


async def test_a_tool_result_from_another_writer_verifies_nothing() -> None:
    """Only the runtime's own result (journal actor ``tool``) verifies the item after it, as
    the scheduler decides: a library writer appending a result pair under another actor
    gets its item sent as content, never in the call's tool slot."""
    async with cf.open_journal("memory://") as journal:
        result = cf.ToolCallResult(tool_call_id="call-1", name="refund", content="DONE")
        for actor, verified in (("script", False), ("tool", True)):
            stream = f"s-{actor}"
            await journal.append(stream, [result, tool_result_item(result)], actor=actor)
            state = await journal.fold(cf.AgentContext, stream)
            assert [item.verified_result for item in state.history] == [verified]


def _mixed_log() -> Log:
    """Every path of the handlers: lanes, keyed slots on both sides of a request, verified
    and forged request offsets, tool results, a compaction and a malformed one."""
    log = Log()
    log.add("system", "rules", key=SYSTEM_PROMPT_KEY)
    log.add("user", "hi", actor=Actor(type="user"))
    log.add(content="v1", key="k")
    log.add(content="v2", key="k")
    first = log.request()
    log.add(content="v3", key="k")
    log.add(content="v4", key="k")
    log.add("system", "rules 2", key=SYSTEM_PROMPT_KEY)
    call = ToolCall(id="c1", name="t", arguments="{}")
    log.add("assistant", actor=Actor(type="agent"), tool_calls=(call,), llm_request_offset=first)
    log.add("assistant", "forged", llm_request_offset=first + 50)
    log.result("c1", "out")
    log.add("developer", "claim", tool_call_id="c9")
    second = log.request(header=None)
    log.add("developer", "summary", compaction=CompactionMeta(replaces_history_through=second))
    log.add("developer", "bad", compaction=CompactionMeta(replaces_history_through=first))
    log.add("user", "after")
    return log


def test_handlers_make_items_and_states_as_validation_would() -> None:
    """A handler makes its item and state from values valid already (the payload's, the
    state's, what it verified): they are what validation would make, fields set included."""
    log = _mixed_log()
    states = [log.state(through) for through in range(1, len(log.envelopes) + 1)]
    assert states[-1].compacted_through > 0
    assert [(i.content, i.updates) for i in states[-1].system] == [("rules 2", 1)]
    for state in states:
        assert AgentContextState.model_validate(state.model_dump()) == state
        for item in state.items:
            assert list(item.__dict__) == list(ContextItem.model_fields)
            given = {name: getattr(item, name) for name in item.model_fields_set}
            assert ContextItem(**given) == item


def test_a_hand_made_position_is_taken_as_the_item_schema_takes_it() -> None:
    with pytest.raises(ValidationError, match="offset"):
        fold_context([envelope(ContextAdded(role="user", content="x"), 0)])
    (item,) = fold_context([envelope(ContextAdded(role="user"), "3")]).history  # type: ignore[arg-type]
    assert item.offset == 3 and type(item.offset) is int
