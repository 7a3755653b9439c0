"""Turn budgets per trigger kind and the circuit breaker of the autonomous loop."""

from __future__ import annotations

import json
from typing import Any

import pytest

from contextfold.context.events import Actor, ContextAdded
from contextfold.journal import Journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.events import LoopEvent, LoopHalted, ResponseRecorded
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.scheduling import Scheduler, TurnBudgets
from contextfold.wire import ModelOutput, NeutralRequest, ToolCall
from tests.runtime.helpers import STREAM, Observer, halts_of, requests_of, text_of, user


def ping(n: int) -> str:
    """Count."""
    return f"pong {n}"


class ToolLover:
    """A runaway model: always asks for another tool call, unless told to stop."""

    def __init__(self) -> None:
        self.requests: list[NeutralRequest] = []

    def __call__(self, request: NeutralRequest) -> ModelOutput:
        self.requests.append(request)
        last_user = [m.content for m in request.messages if m.role == "user"][-2:]
        if any("please stop" in text for text in last_user):
            return ModelOutput(text="Stopping.")
        n = len(self.requests)
        call = ToolCall(id=f"call_{n}", name="ping", arguments=json.dumps({"n": n}))
        return ModelOutput(text=f"step {n}", tool_calls=(call,))


async def start(journal: Journal, trigger: ContextAdded) -> None:
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, trigger)


def agent(journal: Journal, model: Any, budgets: TurnBudgets, **kw: Any) -> Agent:
    return Agent(journal, STREAM, FunctionModel(model), tools=[ping], budgets=budgets, **kw)


def test_budgets_must_be_positive() -> None:
    for name in ("user", "integration", "feedback", "breaker"):
        with pytest.raises(ValueError, match=name):
            TurnBudgets(**{name: 0})


@pytest.mark.parametrize(
    ("trigger", "budgets", "limit"),
    [
        (user("do it"), TurnBudgets(user=3, breaker=100), 3),
        (
            ContextAdded(role="developer", actor=Actor(type="github"), content="PR opened"),
            TurnBudgets(integration=2, breaker=100),
            2,
        ),
        (
            ContextAdded(role="developer", actor=Actor(type="script"), content="script ran"),
            TurnBudgets(feedback=4, breaker=100),
            4,
        ),
        (ContextAdded(role="developer", content="platform says go"), TurnBudgets(feedback=1), 1),
    ],
    ids=["user", "integration", "script-feedback", "platform-feedback"],
)
async def test_turn_budget_per_kind(
    journal: Journal, trigger: ContextAdded, budgets: TurnBudgets, limit: int
) -> None:
    model = ToolLover()
    observer = Observer()
    await start(journal, trigger)
    report = await agent(journal, model, budgets, observer=observer).run_until_idle()
    assert len(report.requests) == limit
    assert report.tool_calls == limit  # every call is answered before the halt
    assert report.status == "stopped"
    assert "turn budget" in report.reason
    [halt] = await halts_of(journal, STREAM)
    assert halt.reason == "turn-budget"
    assert len(observer.of(LoopHalted)) == 1


async def test_circuit_breaker_stops_a_runaway_tool_loop_and_a_user_resumes(
    journal: Journal,
) -> None:
    model = ToolLover()
    budgets = TurnBudgets()  # defaults: the breaker (12) is below the user budget (24)
    await start(journal, user("go"))
    loop = agent(journal, model, budgets)
    report = await loop.run_until_idle()
    assert report.status == "stopped" and loop.status == "stopped"
    assert "circuit breaker" in report.reason
    assert len(report.requests) == budgets.breaker + 1  # the user's request, then 12 more
    [halt] = await halts_of(journal, STREAM)
    assert halt.reason == "circuit-breaker"

    # Stopped stays stopped: another run (or instance) does nothing, feedback does not wake it.
    assert (await loop.run_until_idle()).status == "stopped"
    await journal.append(
        STREAM, ContextAdded(role="developer", actor=Actor(type="script"), content="cron tick")
    )
    again = await agent(journal, model, budgets).run_until_idle()
    assert again.status == "stopped" and again.requests == []
    count = len(model.requests)

    # A human resumes the agent.
    await journal.append(STREAM, user("please stop calling tools"))
    resumed = await agent(journal, model, budgets).run_until_idle()
    assert resumed.status == "idle"
    assert len(resumed.requests) == 1 and len(model.requests) == count + 1
    assert "please stop calling tools" in text_of(model.requests[-1])
    assert "cron tick" in text_of(model.requests[-1])
    assert (await journal.fold(Scheduler, STREAM)).halted is None


async def test_integration_input_resumes_a_halted_agent(journal: Journal) -> None:
    model = ToolLover()
    await start(journal, user("go"))
    await agent(journal, model, TurnBudgets(user=2, breaker=100)).run_until_idle()
    await journal.append(
        STREAM, ContextAdded(role="developer", actor=Actor(type="github"), content="please stop")
    )
    report = await agent(journal, model, TurnBudgets(user=2, breaker=100)).run_until_idle()
    assert report.status == "idle" and len(report.requests) == 1


class ScriptRunner:
    """After every answer a script posts its result: developer items with a script actor,
    agent feedback for the breaker even though they are sent with the user role."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.enabled = True
        self.runs = 0

    async def on_event(self, event: LoopEvent) -> None:
        if isinstance(event, ResponseRecorded) and self.enabled:
            self.runs += 1
            await self.journal.append(
                STREAM,
                ContextAdded(
                    role="developer",
                    actor=Actor(type="script", id="runner"),
                    content=f"script run {self.runs}: exit 1",
                ),
            )


async def test_script_results_count_as_agent_feedback_for_the_breaker(journal: Journal) -> None:
    seen: list[NeutralRequest] = []

    def model(request: NeutralRequest) -> str:
        seen.append(request)
        return "let me run the script again"

    runner = ScriptRunner(journal)
    budgets = TurnBudgets(breaker=3)
    await start(journal, user("fix the build"))
    report = await Agent(
        journal, STREAM, FunctionModel(model), budgets=budgets, observer=runner
    ).run_until_idle()
    # The user's request, then one request per script result until three in a row.
    assert len(report.requests) == budgets.breaker + 1
    assert report.status == "stopped" and "circuit breaker" in report.reason
    assert [h.reason for h in await halts_of(journal, STREAM)] == ["circuit-breaker"]
    # Feedback budgets and provider trust are separate: the script result is sent as user.
    [message] = [m for m in seen[1].messages if "script run 1" in m.content]
    assert message.role == "user"

    runner.enabled = False
    await journal.append(STREAM, user("thanks, that's enough"))
    resumed = await Agent(journal, STREAM, FunctionModel(model), budgets=budgets).run_until_idle()
    assert resumed.status == "idle" and len(resumed.requests) == 1
    assert len(await requests_of(journal, STREAM)) == budgets.breaker + 2


async def test_a_user_message_resets_the_autonomous_streak(journal: Journal) -> None:
    model = ToolLover()
    budgets = TurnBudgets(user=3, breaker=4)
    await start(journal, user("go"))
    await agent(journal, model, budgets).run_until_idle()  # 3 requests, turn budget
    assert [h.reason for h in await halts_of(journal, STREAM)] == ["turn-budget"]
    await journal.append(STREAM, user("go on"))
    report = await agent(journal, model, budgets).run_until_idle()
    # A fresh user turn: its own budget of 3 again, not the breaker's leftover.
    assert len(report.requests) == 3
    assert [h.reason for h in await halts_of(journal, STREAM)] == ["turn-budget"] * 2
