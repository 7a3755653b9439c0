"""Tools run at most once by record: the runtime records ``ToolCallStarted`` right before a
tool runs, and an agent resuming a stream where a call started and recorded no result runs
it again only when the tool may run twice; otherwise the model reads that it may already
have run. Tools get their call id as a stable idempotency key through ``ToolContext``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import contextfold as cf
from contextfold.context.events import ContextAdded, ToolCallResult, ToolCallStarted
from contextfold.errors import InvalidInputError
from contextfold.journal import Journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.tool_runs import NOT_RERUN
from contextfold.runtime.tools import Tool, ToolContext, tool
from contextfold.wire import ModelOutput, NeutralRequest, ToolCall
from tests.runtime.helpers import (
    CALL,
    STREAM,
    Charges,
    charge_tool,
    charging_model,
    events_of,
    user,
)


class Stopped(BaseException):
    """The process stopping while a tool runs (after its side effect, before its result)."""


def stopping(marker: Path) -> Tool:
    inner = charge_tool(marker)

    def charge(amount: int, ctx: ToolContext) -> str:
        """Charge the customer's card."""
        inner.fn(amount, ctx)
        raise Stopped

    return Tool.from_function(charge)


async def started_then_stopped(journal: Journal, marker: Path) -> None:
    await journal.append(STREAM, system_prompt("You charge cards."))
    await journal.append(STREAM, user("charge 100"))
    with pytest.raises(Stopped):
        await Agent(
            journal, STREAM, FunctionModel(charging_model), tools=[stopping(marker)]
        ).run_until_idle()
    [(_, started)] = await events_of(journal, STREAM, ToolCallStarted)
    assert (started.tool_call_id, started.name) == (CALL.id, "charge")
    assert await events_of(journal, STREAM, ToolCallResult) == []


@pytest.mark.parametrize(
    ("idempotent", "policy", "reruns"),
    [
        (None, "report", False),  # the default: report, never run twice silently
        (None, "rerun", True),  # the agent's policy
        (True, "report", True),  # the tool's own declaration wins
        (False, "rerun", False),
    ],
)
async def test_a_call_that_may_have_run_reruns_only_when_allowed(
    journal: Journal, tmp_path: Path, idempotent: bool | None, policy: Any, reruns: bool
) -> None:
    marker = tmp_path / "charges"
    await started_then_stopped(journal, marker)
    assert len(Charges(marker).lines()) == 1

    sent: list[NeutralRequest] = []

    def recording(request: NeutralRequest) -> ModelOutput | str:
        sent.append(request)
        return charging_model(request)

    resumed = Agent(
        journal,
        STREAM,
        FunctionModel(recording),
        tools=[charge_tool(marker, idempotent=idempotent)],
        on_interrupted_tool=policy,
    )
    report = await resumed.run_until_idle()
    assert report.status == "idle" and report.tool_calls == 1
    charges = Charges(marker).lines()
    [(_, result)] = await events_of(journal, STREAM, ToolCallResult)
    [tool_message] = [m for m in sent[-1].messages if m.role == "tool"]
    assert tool_message.tool_call_id == CALL.id
    if reruns:
        assert report.not_rerun == []
        first, second = charges
        assert first[:3] == [CALL.id, first[1], "False"] and second[2] == "True"
        assert second[1] == first[1]  # the same idempotency key on the rerun
        assert (result.content, result.is_error) == ("charged 100", False)
        assert len(await events_of(journal, STREAM, ToolCallStarted)) == 2
    else:
        assert len(charges) == 1  # the side effect happened once
        assert report.not_rerun == [CALL.id]
        assert (result.content, result.is_error) == (NOT_RERUN, True)
        assert len(await events_of(journal, STREAM, ToolCallStarted)) == 1
        assert "may already have run" in tool_message.content
    # Answered: a third agent has nothing to do.
    again = await Agent(
        journal, STREAM, FunctionModel(recording), tools=[charge_tool(marker)]
    ).run_until_idle()
    assert again.requests == [] and again.tool_calls == 0


async def test_a_call_never_started_runs_normally(journal: Journal, tmp_path: Path) -> None:
    """Stopped after the model's answer and before the tool started: no record says it
    may have run, so the resumed agent runs it (once)."""
    marker = tmp_path / "charges"
    await journal.append(STREAM, system_prompt("You charge cards."))
    await journal.append(STREAM, user("charge 100"))
    tools = [charge_tool(marker)]
    first = await Agent(journal, STREAM, FunctionModel(charging_model), tools=tools).run_until_idle(
        max_steps=1
    )
    assert first.requests and first.tool_calls == 0 and Charges(marker).lines() == []
    report = await Agent(
        journal, STREAM, FunctionModel(charging_model), tools=tools
    ).run_until_idle()
    assert report.tool_calls == 1 and report.not_rerun == []
    [charged] = Charges(marker).lines()
    assert charged[2] == "False"
    [(_, result)] = await events_of(journal, STREAM, ToolCallResult)
    assert (result.content, result.is_error) == ("charged 100", False)


async def test_started_is_recorded_before_each_tool_runs_after_the_previous_result(
    journal: Journal,
) -> None:
    """Sequential calls: each call's ToolCallStarted is durable when its function runs, and
    comes after the previous call's result."""
    seen: list[tuple[str, list[str], list[str]]] = []

    async def step(n: int, ctx: ToolContext) -> str:
        """One step."""
        started = [e.tool_call_id for _, e in await events_of(journal, STREAM, ToolCallStarted)]
        results = [e.tool_call_id for _, e in await events_of(journal, STREAM, ToolCallResult)]
        seen.append((ctx.call_id, started, results))
        return f"step {n}"

    calls = tuple(ToolCall(id=f"c{n}", name="step", arguments=json.dumps({"n": n})) for n in (1, 2))

    def two_steps(request: NeutralRequest) -> ModelOutput | str:
        if request.messages[-2].role == "tool":
            return "done"
        return ModelOutput(tool_calls=calls)

    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("go"))
    report = await Agent(journal, STREAM, FunctionModel(two_steps), tools=[step]).run_until_idle()
    assert report.tool_calls == 2
    assert seen == [("c1", ["c1"], []), ("c2", ["c1", "c2"], ["c1"])]
    records = [
        (position, type(event).__name__, event.tool_call_id)
        for cls in (ToolCallStarted, ToolCallResult)
        for position, event in await events_of(journal, STREAM, cls)
    ]
    assert [(kind, call) for _, kind, call in sorted(records)] == [
        ("ToolCallStarted", "c1"),
        ("ToolCallResult", "c1"),
        ("ToolCallStarted", "c2"),
        ("ToolCallResult", "c2"),
    ]


async def test_a_call_that_cannot_run_records_no_start(journal: Journal) -> None:
    """Invalid arguments and unknown tools never run: no ToolCallStarted, an error result."""
    calls = (
        ToolCall(id="bad", name="charge", arguments='{"amount": "lots"}'),
        ToolCall(id="nobody", name="refund", arguments="{}"),
    )

    def answer(request: NeutralRequest) -> ModelOutput | str:
        if request.messages[-2].role == "tool":
            return "done"
        return ModelOutput(tool_calls=calls)

    def charge(amount: int) -> str:
        """Charge."""
        raise AssertionError("must not run")

    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("go"))
    report = await Agent(journal, STREAM, FunctionModel(answer), tools=[charge]).run_until_idle()
    assert report.tool_calls == 2
    assert await events_of(journal, STREAM, ToolCallStarted) == []
    results = [e for _, e in await events_of(journal, STREAM, ToolCallResult)]
    assert [(r.tool_call_id, r.is_error) for r in results] == [("bad", True), ("nobody", True)]


def test_the_tool_context_is_not_an_argument_the_model_sees() -> None:
    def refund(order: str, ctx: ToolContext, amount: int = 1) -> str:
        """Refund an order."""
        return ctx.idempotency_key

    made = Tool.from_function(refund)
    assert made.context_parameter == "ctx"
    schema = json.loads(made.definition.parameters)
    assert set(schema["properties"]) == {"order", "amount"} and schema["required"] == ["order"]
    assert "ToolContext" not in made.definition.parameters

    def twice(a: ToolContext, b: ToolContext) -> str:
        """Two contexts."""
        return ""

    with pytest.raises(TypeError, match="'a' and 'b' both ask for the ToolContext"):
        Tool.from_function(twice)


async def test_a_tool_receives_its_call_id_and_a_stable_idempotency_key(
    journal: Journal,
) -> None:
    contexts: list[ToolContext] = []

    def refund(order: str, ctx: ToolContext) -> str:
        """Refund an order."""
        contexts.append(ctx)
        return "ok"

    call = ToolCall(id="call-7", name="refund", arguments='{"order": "A1"}')
    made = Tool.from_function(refund)
    for context in (
        ToolContext("call-7", "refund", "s1"),
        ToolContext("call-7", "refund", "s1", resumed=True),
        ToolContext("call-8", "refund", "s1"),
        ToolContext("call-7", "refund", "s2"),
        None,  # outside an agent: a context without a stream
    ):
        assert (await made.call(call, context)).output == "ok"
    one, rerun, other_call, other_stream, outside = contexts
    assert (one.call_id, one.stream) == ("call-7", "s1")
    assert (outside.call_id, outside.stream) == ("call-7", None)
    assert one.idempotency_key == rerun.idempotency_key  # stable across runs of one call
    keys = {c.idempotency_key for c in (one, other_call, other_stream, outside)}
    assert len(keys) == 4 and all(len(k) == 64 and int(k, 16) >= 0 for k in keys)

    # Through the agent: the recorded call id and the agent's stream.
    def answer(request: NeutralRequest) -> ModelOutput | str:
        if request.messages[-2].role == "tool":
            return "done"
        return ModelOutput(tool_calls=(call,))

    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("refund A1"))
    await Agent(journal, STREAM, FunctionModel(answer), tools=[refund]).run_until_idle()
    assert (contexts[-1].call_id, contexts[-1].stream, contexts[-1].resumed) == (
        "call-7",
        STREAM,
        False,
    )


def test_the_decorator_declares_idempotence_and_keeps_the_function_callable() -> None:
    @tool(idempotent=True, name="lookup_order")
    def lookup(order: str) -> str:
        """Look an order up."""
        return f"order {order}"

    @tool
    def ping() -> str:
        """Ping."""
        return "pong"

    assert isinstance(lookup, Tool) and lookup.idempotent is True and lookup.name == "lookup_order"
    assert lookup("A1") == "order A1" and ping() == "pong"
    assert ping.idempotent is None and Tool.from_function(ping.fn).idempotent is None
    assert cf.tool is tool and cf.ToolContext is ToolContext


def test_an_unknown_interrupted_tool_policy_is_refused(journal: Journal) -> None:
    with pytest.raises(InvalidInputError, match="on_interrupted_tool must be 'report' or 'rerun'"):
        Agent(journal, STREAM, FunctionModel(charging_model), on_interrupted_tool="twice")  # type: ignore[arg-type]


async def test_a_cancelled_tool_is_reported_by_the_next_agent(
    journal: Journal, tmp_path: Path
) -> None:
    """A shutdown (cancel) while a tool runs leaves it started: the next agent reports it."""
    marker = tmp_path / "charges"
    entered = asyncio.Event()
    inner = charge_tool(marker)

    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charge."""
        inner.fn(amount, ctx)
        entered.set()
        await asyncio.sleep(3600)
        return "never"

    await journal.append(STREAM, system_prompt("You charge cards."))
    await journal.append(STREAM, user("charge 100"))
    task = asyncio.create_task(
        Agent(journal, STREAM, FunctionModel(charging_model), tools=[charge]).run_until_idle()
    )
    await asyncio.wait_for(entered.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    report = await Agent(
        journal, STREAM, FunctionModel(charging_model), tools=[charge_tool(marker)]
    ).run_until_idle()
    assert report.not_rerun == [CALL.id] and len(Charges(marker).lines()) == 1
    items = [e for _, e in await events_of(journal, STREAM, ContextAdded) if e.tool_call_id]
    assert [i.content for i in items] == [f"error: {NOT_RERUN}"]
