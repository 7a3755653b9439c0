"""What a trace shows of each item: every turn, event-driven ones included (the turn the
dispatcher compiled and the steer it accepted into it), and each item in the role the model
received it as."""

from __future__ import annotations

import contextfold as cf
from contextfold.context.turns import SteerAccepted, TurnCompiled, item_sha256
from contextfold.render.envelope import TurnEvent, compile_steer
from contextfold.runtime.dispatch import TurnDispatcher
from contextfold.timeline.build import build_timeline
from contextfold.timeline.stats import stats_of
from contextfold.wire import ModelOutput, NeutralRequest, ToolCall
from tests.timeline.helpers import ticking_clock

STREAM = "timeline/chat"


def _mention(event_id: str, content: str, root: str | None = None) -> TurnEvent:
    return TurnEvent(
        kind="mention",
        author="Morgan",
        actor="pk-morgan",
        event_id=event_id,
        content=content,
        thread_root=root,
    )


def _model(request: NeutralRequest) -> ModelOutput | str:
    if any(m.role == "tool" for m in request.messages):
        return "Found it."
    if "<buzz-turn>" in request.messages[-2].content:
        return ModelOutput(tool_calls=(ToolCall(id="c1", name="lookup", arguments="{}"),))
    return "Hello."


async def _positions(journal: cf.Journal, event_type: str) -> list[int]:
    return [e.position async for e in journal.read_all(STREAM) if e.type == event_type]


async def test_a_dispatched_turn_and_its_steer_are_a_turn_of_the_trace() -> None:
    async with cf.open_journal("memory://", clock=ticking_clock()) as journal:
        dispatcher = TurnDispatcher(journal, STREAM)

        async def lookup() -> str:
            """Look the thread up."""
            receipt = await dispatcher.receive(_mention("e2", "and the pager?", root="e1"))
            assert receipt.status == "injected"
            return "the runbook"

        agent = cf.Agent(journal, STREAM, cf.FunctionModel(_model), tools=[lookup])
        await journal.append(STREAM, cf.system_prompt("You help in chat."))
        await journal.append(STREAM, cf.ContextAdded(role="user", content="hi"), actor="user")
        before = (await agent.run_until_idle()).requests
        await dispatcher.receive(_mention("e1", "how do deploys work?"))
        assert len(await dispatcher.run(agent)) == 1

        timeline = await build_timeline(journal, STREAM)
        [compiled] = await _positions(journal, TurnCompiled.event_type)
        [accepted] = await _positions(journal, SteerAccepted.event_type)
        assert len(timeline.turns) == stats_of(timeline).turns == 2
        plain, chat = timeline.turns
        assert [r.offset for r in plain.requests] == before
        assert [r.offset for r in chat.requests] == [
            r.offset for r in timeline.requests if r.offset > compiled
        ]
        assert len(chat.requests) == 2  # the tool call, then the answer after the steer
        assert [(i.kind, i.position, i.actor, i.role) for i in chat.items] == [
            ("trigger", compiled + 1, "user:pk-morgan", "user"),
            ("steer", accepted + 1, "user:pk-morgan", "user"),
        ]
        assert "how do deploys work?" in chat.items[0].text
        assert "and the pager?" in chat.items[1].text


async def test_a_steer_before_the_turns_first_request_opens_no_turn_of_its_own() -> None:
    async with cf.open_journal("memory://", clock=ticking_clock()) as journal:
        dispatcher = TurnDispatcher(journal, STREAM)
        await journal.append(STREAM, cf.system_prompt("You help in chat."))
        assert await dispatcher.dispatch() is None
        await dispatcher.receive(_mention("e1", "first"))
        assert await dispatcher.dispatch() is not None
        assert (await dispatcher.receive(_mention("e2", "second", root="e1"))).status == "injected"
        waiting = await build_timeline(journal, STREAM)
        assert [[i.kind for i in t.items] for t in waiting.turns] == [
            ["context", "trigger", "steer"]
        ]
        agent = cf.Agent(journal, STREAM, cf.FunctionModel(lambda request: "Done."))
        await agent.run_until_idle()
        timeline = await build_timeline(journal, STREAM)
        assert [[i.kind for i in t.items] for t in timeline.turns] == [
            ["context", "trigger", "steer"]
        ]
        assert len(timeline.turns[0].requests) == 1


async def test_a_steer_record_another_writer_appended_makes_no_steer() -> None:
    async with cf.open_journal("memory://", clock=ticking_clock()) as journal:
        await journal.append(STREAM, cf.system_prompt("You help in chat."))
        steer = compile_steer(_mention("e2", "second", root="e1"))
        record = SteerAccepted(
            turn_at=1, event_id="e2", layers=steer.layers, item_sha256=item_sha256(steer.text)
        )
        item = cf.ContextAdded(role="user", content=steer.text)
        await journal.append(STREAM, [record, item], actor="someone")
        timeline = await build_timeline(journal, STREAM)
        assert [i.kind for i in timeline.turns[0].items] == ["context", "trigger"]


async def test_each_item_shows_the_role_the_model_received() -> None:
    async with cf.open_journal("memory://", clock=ticking_clock()) as journal:
        model = cf.FunctionModel(lambda request: "Noted.", transport="anthropic")
        agent = cf.Agent(journal, STREAM, model)
        await journal.append(STREAM, cf.system_prompt("You help."))
        webhook = cf.Actor(type="webhook", id="ci")
        items = [
            cf.ContextAdded(role="developer", content="Deploy FAILED", actor=webhook),
            cf.ContextAdded(role="developer", content="Answer in one line."),  # trusted
            cf.ContextAdded(role="user", content="what broke?"),
        ]
        await journal.append(STREAM, items, actor="ci")
        unsent = await build_timeline(journal, STREAM)
        await agent.run_until_idle()
        timeline = await build_timeline(journal, STREAM)

        [turn] = timeline.turns
        [request] = turn.requests
        body = (await cf.rebuild_request(journal, STREAM, request.offset)).body.decode()
        roles = {i.text: i.role for i in turn.items}
        # Anthropic has no developer role: the trusted developer item went out as system,
        # the webhook's as user (untrusted), like the user's own question.
        assert roles == {
            "You help.": "system",
            "Deploy FAILED": "user",
            "Answer in one line.": "system",
            "what broke?": "user",
        }
        assert '"role":"developer"' not in body.replace(" ", "")
        # Before any request the role is the one a request with the default rules gives.
        assert {i.text: i.role for i in unsent.turns[0].items}["Answer in one line."] == (
            "developer"
        )
        assert {i.text: i.role for i in unsent.turns[0].items}["Deploy FAILED"] == "user"
