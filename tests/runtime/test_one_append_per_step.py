"""Each step appends once: a request with its record, a response with its item, a call's
start, its result with its item, a summary. For any script of calls, outputs, usage
reports (catch-up and pressure compactions) and step limits, every append of the agent is
one of those, in the journal's order (a request's record right after it, a call's start
right before its result unless it was interrupted), and the journal verifies."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.context.compaction import COMPACTION_INSTRUCTION
from contextfold.context.materialized import ContextMaterialized
from contextfold.context.rebuild import RequestRecorded, verify_requests
from contextfold.journal import Journal, open_journal
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.scheduling import AgentHalted
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


ADDED = cf.ContextAdded.event_type
# What one step of the agent appends, by the event types of the append.
STEP_APPENDS = {
    (cf.LlmRequestRequested.event_type, RequestRecorded.event_type),  # with its record
    (RequestRecorded.event_type,),  # the record of a request another writer came after
    (cf.LlmResponse.event_type, ADDED),  # the output and its item
    (cf.ToolCallStarted.event_type,),
    (cf.ToolCallResult.event_type, ADDED),  # a result and the item the model reads
    (ADDED,),  # a summary (and the test's own user turns)
    (AgentHalted.event_type,),
}


class RecordingStore(MemoryStore):
    """Notes the event types of every append."""

    def __init__(self) -> None:
        super().__init__()
        self.appends: list[tuple[str, ...]] = []

    async def append(self, namespace: str, stream: str, events: Any, **options: Any) -> Any:
        self.appends.append(tuple(event.type for event in events))
        return await super().append(namespace, stream, events, **options)


async def _run_script(
    script: list[list[tuple[list[tuple[str, str]], int | None]]], max_steps: int
) -> tuple[Journal, RecordingStore]:
    store = RecordingStore()
    journal = Journal(store, clock=fixed_clock(), ids=counter_ids())
    agent = Agent(
        journal,
        STREAM,
        cf.FunctionModel(Scripted(script)),
        tools=[lookup],
        context_window=4_000,  # 3,000 tokens reported crosses the threshold (2,000)
        content_limit=1_000,
        budgets=cf.TurnBudgets(user=3),
        materialize_every=25,
    )
    await journal.append(STREAM, system_prompt("You read files."))
    for k in range(len(script)):
        await journal.append(STREAM, cf.ContextAdded(role="user", content=f"turn {k}"))
        for _ in range(3):  # a run cut short by max_steps goes on in the next
            with contextlib.suppress(cf.CompactionError):  # still over the threshold
                await agent.run_until_idle(max_steps=max_steps)
    return journal, store


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script=turns, max_steps=st.sampled_from([1, 2, 3, 1000]))
def test_each_step_appends_once_in_the_journal_s_order(
    script: list[list[tuple[list[tuple[str, str]], int | None]]], max_steps: int
) -> None:
    async def check() -> None:
        journal, store = await _run_script(script, max_steps)
        for types in store.appends:
            if (
                ContextMaterialized.event_type in types
                or "checkpoint/" in types[0]
                or ("/snapshot/" in types[0])
            ):
                continue  # a materialization (its own module's tests say what it appends)
            assert types in STEP_APPENDS, types
        stored = [e async for e in journal.read_all(STREAM)]
        for index, event in enumerate(stored):
            if event.type == cf.LlmRequestRequested.event_type:
                following = stored[index + 1]
                assert following.type == RequestRecorded.event_type
                assert RequestRecorded.model_validate_json(following.data).request_offset == (
                    event.position
                )
            if event.type == cf.ToolCallStarted.event_type:
                # Nothing of the agent's comes between a call's start and its result.
                call = event.payload["tool_call_id"]
                after = (e for e in stored[index + 1 :] if e.type != ADDED)
                result = next(after)
                assert result.type == cf.ToolCallResult.event_type
                assert result.payload["tool_call_id"] == call
        assert await verify_requests(journal, STREAM) == ()
        await journal.close()

    asyncio.run(check())


async def test_a_tool_turn_takes_six_appends_of_the_agent() -> None:
    """The request with its record, the response with its item, the call's start, the
    result with its item, the next request with its record, the answer with its item."""
    store = RecordingStore()
    journal = Journal(store, clock=fixed_clock())
    script = [[([("lookup", '{"path": "a.py"}')], None), ([], None)]]
    agent = Agent(journal, STREAM, cf.FunctionModel(Scripted(script)), tools=[lookup])
    await journal.append(
        STREAM, [system_prompt("You read files."), cf.ContextAdded(role="user", content="go")]
    )
    before = len(store.appends)
    report = await agent.run_until_idle()
    assert (report.steps, report.tool_calls, len(report.requests)) == (3, 1, 2)
    assert len(store.appends) - before == 6
    assert await verify_requests(journal, STREAM) == ()


@pytest.mark.parametrize("at", ["response", "result"])
async def test_another_writer_between_steps_is_in_the_next_request(at: str) -> None:
    """An item appended while the model answers (or a tool runs) lands between two steps:
    the next request is built from the journal with it, and the journal verifies."""
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
