"""The loop's per-step checks cost what is new: the compaction pick and the call ids of the
history are carried over from the previous step when the reports or items only grew, and
equal what a look at all of them gives."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.context import LlmResponse, pick_compaction
from contextfold.context.state import AgentContextState, ContextItem
from contextfold.journal import open_journal
from contextfold.runtime import compacting
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.loop import Agent
from contextfold.wire import ToolCall, Usage

reports = st.lists(
    st.builds(
        LlmResponse,
        request_offset=st.integers(min_value=1, max_value=40),
        model=st.sampled_from(["gpt-4o", "gpt-4"]),
        usage=st.builds(Usage, input_tokens=st.integers(min_value=0, max_value=120_000)),
    ),
    max_size=25,
)


def _agent() -> Agent:
    return Agent(open_journal("memory://"), "s", FunctionModel(lambda request: "ok"))


@given(batch=reports, cuts=st.lists(st.integers(min_value=0, max_value=25), max_size=5))
def test_the_pick_carried_over_equals_a_pick_of_every_report(
    batch: list[LlmResponse], cuts: list[int]
) -> None:
    agent = _agent()
    for cutoff in (0, 7):
        for cut in [*sorted(cuts), len(batch)]:
            grown = tuple(batch[:cut])
            assert agent._pick(grown, cutoff) is pick_compaction(
                grown, threshold=agent.compaction_threshold, compacted_through=cutoff
            )


def test_a_grown_batch_is_picked_from_its_new_reports(monkeypatch: pytest.MonkeyPatch) -> None:
    agent = _agent()
    looked_at: list[int] = []

    def counting(responses: Any, **settings: Any) -> LlmResponse | None:
        looked_at.append(len(responses))
        return pick_compaction(responses, **settings)

    monkeypatch.setattr(compacting, "pick_compaction", counting)
    batch: tuple[LlmResponse, ...] = ()
    for n in range(1, 51):
        batch = (*batch, LlmResponse(request_offset=n, model="gpt-4o", usage=Usage()))
        assert agent._pick(batch, 0) is None
        assert agent._pick(batch, 0) is None  # the next step, nothing new
    assert looked_at == [1, 0] * 50


items = st.lists(
    st.builds(
        lambda offset, ids: ContextItem(
            offset=offset,
            role="assistant",
            tool_calls=tuple(ToolCall(id=i, name="t") for i in ids),
        ),
        st.integers(min_value=1, max_value=99),
        st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=2),
    ),
    max_size=20,
)


@given(history=items, other=items, cuts=st.lists(st.integers(min_value=0, max_value=20)))
def test_call_ids_carried_over_equal_every_call_of_the_history(
    history: list[ContextItem], other: list[ContextItem], cuts: list[int]
) -> None:
    agent = _agent()
    for cut in [*sorted(cuts), len(history)]:
        for seen in (tuple(history[:cut]), tuple(other)):  # another history in between
            assert agent._call_ids(seen) == {c.id for item in seen for c in item.tool_calls}


async def test_the_header_is_made_again_only_when_what_it_is_made_of_changes() -> None:
    agent = _agent()
    state = AgentContextState()
    first = await agent._header(state)
    assert await agent._header(state) is first
    agent.temperature = 0.0
    zero = await agent._header(state)
    assert zero is not first and zero.temperature == 0.0
    agent.temperature = -0.0  # equal to 0.0, other bytes on the wire
    negative = await agent._header(state)
    assert negative is not zero and repr(negative.temperature) == "-0.0"
    agent.max_tokens = 7
    assert (await agent._header(state)).max_tokens == 7
    assert await agent._header(state) is await agent._header(state)
