"""Steps appended ahead: a request and its record go in one append, a response with the
start of its first call, the last tool result with the request after it. The journal is
the one the loop writes when every step appends on its own, event for event (payloads,
meta, times and ids alike), for any script of calls, outputs, usage reports (catch-up and
pressure compactions) and step limits; and it verifies."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.context.compaction import COMPACTION_INSTRUCTION
from contextfold.context.rebuild import verify_requests
from contextfold.journal import Journal, open_journal
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.store.memory import MemoryStore
from contextfold.testing import counter_ids
from tests.runtime.helpers import STREAM, fixed_clock


def lookup(path: str) -> str:
    """Read a file."""
    if path == "boom":
        raise OSError("no such file")
    return f"{path}:" + "x" * (len(path) * 40)


# A call: (tool name, arguments); "lookup" with a path, or a tool the model made up, or
# arguments that do not validate.
calls = st.lists(
    st.sampled_from(
        [
            ("lookup", '{"path": "a.py"}'),
            ("lookup", '{"path": "boom"}'),
            ("lookup", '{"path": "' + "p" * 120 + '"}'),  # cut: over the content limit
            ("lookup", '{"nope": 1}'),
            ("missing", "{}"),
        ]
    ),
    max_size=3,
)
# A model output: calls (maybe none) and the input tokens it reports.
outputs = st.tuples(calls, st.sampled_from([None, 100, 3_000]))
turns = st.lists(st.lists(outputs, min_size=1, max_size=4), min_size=1, max_size=4)


class Scripted:
    """Answers from a script, in order; a summary request gets a summary. Past the script,
    plain answers."""

    def __init__(self, script: Sequence[Sequence[tuple[list[tuple[str, str]], int | None]]]):
        self.outputs = [output for turn in script for output in turn]
        self.n = 0

    def __call__(self, request: cf.NeutralRequest) -> cf.ModelOutput:
        if request.messages[-1].content == COMPACTION_INSTRUCTION:
            return cf.ModelOutput(text="summary", usage=cf.Usage(input_tokens=50))
        self.n += 1
        made, tokens = self.outputs[self.n - 1] if self.n <= len(self.outputs) else ([], None)
        usage = cf.Usage(input_tokens=tokens) if tokens is not None else cf.Usage()
        tool_calls = tuple(
            cf.ToolCall(id=f"c{self.n}-{k}", name=name, arguments=arguments)
            for k, (name, arguments) in enumerate(made)
        )
        return cf.ModelOutput(
            text="" if tool_calls else f"answer {self.n}", tool_calls=tool_calls, usage=usage
        )


async def _journal_of(
    script: list[list[tuple[list[tuple[str, str]], int | None]]], ahead: bool, max_steps: int
) -> tuple[list[tuple[Any, ...]], Journal]:
    journal = open_journal("memory://", clock=fixed_clock(), ids=counter_ids())
    agent = Agent(
        journal,
        STREAM,
        cf.FunctionModel(Scripted(script)),
        tools=[lookup],
        context_window=4_000,  # 3,000 tokens reported crosses the threshold (2,000)
        content_limit=1_000,
        budgets=cf.TurnBudgets(user=3),
    )
    agent._ahead = ahead
    agent.materialize_every = 25
    await journal.append(STREAM, system_prompt("You read files."))
    errors: list[tuple[Any, ...]] = []
    for k in range(len(script)):
        await journal.append(STREAM, cf.ContextAdded(role="user", content=f"turn {k}"))
        for _ in range(3):  # a run cut short by max_steps goes on in the next
            try:
                await agent.run_until_idle(max_steps=max_steps)
            except cf.ContextfoldError as exc:  # still over the threshold: the same either way
                errors.append((type(exc), str(exc)))
    events: list[tuple[Any, ...]] = [
        (e.position, e.type, e.data, e.meta) async for e in journal.read_all(STREAM)
    ]
    return [*events, *errors], journal


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=turns, max_steps=st.sampled_from([1, 2, 3, 1000]))
def test_steps_appended_ahead_leave_the_journal_of_steps_on_their_own(
    script: list[list[tuple[list[tuple[str, str]], int | None]]], max_steps: int
) -> None:
    async def both() -> None:
        ahead, journal = await _journal_of(script, True, max_steps)
        alone, other = await _journal_of(script, False, max_steps)
        assert ahead == alone
        assert await verify_requests(journal, STREAM) == ()
        await journal.close()
        await other.close()

    asyncio.run(both())


class CountingStore(MemoryStore):
    appends = 0

    async def append(self, *args: Any, **options: Any) -> Any:
        self.appends += 1
        return await super().append(*args, **options)


async def test_a_tool_turn_takes_four_appends_of_the_agent() -> None:
    """The request and its record, the response and its call's start, the result and the
    next request and its record, the answer: four appends where there were eight."""
    store = CountingStore()
    journal = Journal(store, clock=fixed_clock())
    script = [[([("lookup", '{"path": "a.py"}')], None), ([], None)]]
    agent = Agent(journal, STREAM, cf.FunctionModel(Scripted(script)), tools=[lookup])
    await journal.append(
        STREAM, [system_prompt("You read files."), cf.ContextAdded(role="user", content="go")]
    )
    before = store.appends
    report = await agent.run_until_idle()
    assert (report.steps, report.tool_calls, len(report.requests)) == (3, 1, 2)
    assert store.appends - before == 4
    assert await verify_requests(journal, STREAM) == ()


@pytest.mark.parametrize("at", ["response", "result"])
async def test_another_writer_between_steps_gets_the_steps_appended_alone(at: str) -> None:
    """An item appended while the model answers (or a tool runs) makes the append ahead
    land nowhere: the steps append on their own, after it, and the journal verifies."""
    journal = open_journal("memory://", clock=fixed_clock())
    script = [[([("lookup", '{"path": "a.py"}')], None), ([], None)]]
    scripted = Scripted(script)

    async def model(request: cf.NeutralRequest) -> cf.ModelOutput:
        output = scripted(request)
        if at == "response" and scripted.n == 1:
            await journal.append(
                STREAM,
                cf.ContextAdded(
                    role="user",
                    content="meanwhile",
                    llm_request_policy=cf.LlmRequestPolicy(behaviour="none"),
                ),
            )
        return output

    def tool(path: str) -> str:
        return f"read {path}"

    async def slow_lookup(path: str) -> str:
        if at == "result":
            await journal.append(STREAM, cf.ContextAdded(role="user", content="meanwhile"))
        return tool(path)

    agent = Agent(
        journal,
        STREAM,
        cf.FunctionModel(model),
        tools=[cf.Tool.from_function(slow_lookup, name="lookup")],
    )
    await journal.append(
        STREAM, [system_prompt("You read files."), cf.ContextAdded(role="user", content="go")]
    )
    report = await agent.run_until_idle()
    assert report.tool_calls == 1 and len(report.requests) >= 2
    assert await verify_requests(journal, STREAM) == ()
    texts = [
        e.payload.get("content") async for e in journal.read_all(STREAM, types=[cf.ContextAdded])
    ]
    assert "meanwhile" in texts
