"""Request policies decide whether an item wakes the model, waits or interrupts; birth waits
for the system prompt (queued, never busy)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from contextfold.context.events import (
    Actor,
    ContextAdded,
    LlmRequestPolicy,
    LlmRequestRequested,
    ToolCallResult,
    tool_result_item,
)
from contextfold.context.projection import AgentContext
from contextfold.context.rebuild import rebuild_request
from contextfold.context.state import SYSTEM_PROMPT_KEY
from contextfold.errors import ModelError
from contextfold.events import RawEvent, StoredEvent
from contextfold.folds.reader import FoldCache
from contextfold.journal import Journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.events import LoopEvent, RequestInterrupted, RequestSent
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.scheduling import Scheduler, behaviour_of, kind_of
from contextfold.store.base import ReadResult
from contextfold.wire import ModelOutput, NeutralRequest
from tests.runtime.helpers import (
    STREAM,
    Observer,
    events_of,
    interrupted_of,
    recorded_of,
    requests_of,
    text_of,
    user,
)


class Script:
    """A scripted model: records every request it gets, answers "answer N"."""

    def __init__(self) -> None:
        self.requests: list[NeutralRequest] = []

    def __call__(self, request: NeutralRequest) -> ModelOutput | str:
        self.requests.append(request)
        return f"answer {len(self.requests)}"


async def born(journal: Journal) -> None:
    await journal.append(STREAM, system_prompt("You are a test agent."))


# -- defaults --------------------------------------------------------------------------------


def _item(role: str, actor: str | None = None, **fields: object) -> ContextAdded:
    return ContextAdded(
        role=role,
        content="x",
        actor=None if actor is None else Actor(type=actor),
        **fields,
    )


@pytest.mark.parametrize(
    ("item", "behaviour", "kind"),
    [
        (_item("user", "user"), "after-current-request", "user"),
        (_item("user"), "after-current-request", "user"),
        (_item("system"), "none", "feedback"),
        (_item("assistant", "agent"), "none", "feedback"),
        (_item("developer", "webhook"), "after-current-request", "integration"),
        (_item("developer", "github"), "after-current-request", "integration"),
        (_item("developer", "slack"), "after-current-request", "integration"),
        (_item("developer"), "after-current-request", "feedback"),
        (_item("developer", "script"), "after-current-request", "feedback"),
        (_item("developer", "agent"), "none", "feedback"),
        (_item("developer", "tool", tool_call_id="c1"), "none", "feedback"),
        (
            _item("developer", "webhook", llm_request_policy=LlmRequestPolicy(behaviour="none")),
            "none",
            "integration",
        ),
        (
            _item("system", llm_request_policy=LlmRequestPolicy(behaviour="interrupt")),
            "interrupt",
            "feedback",
        ),
    ],
)
def test_default_policies_and_budget_kinds(item: ContextAdded, behaviour: str, kind: str) -> None:
    assert behaviour_of(item) == behaviour
    assert kind_of(item) == kind


async def test_user_message_wakes_the_model(journal: Journal) -> None:
    script = Script()
    await born(journal)
    await journal.append(STREAM, user("hello?"))
    report = await Agent(journal, STREAM, FunctionModel(script)).run_until_idle()
    assert report.status == "idle"
    assert len(report.requests) == 1
    assert "hello?" in text_of(script.requests[0])
    assert (await assistant_items(journal)) == ["answer 1"]


async def assistant_items(journal: Journal) -> list[str]:
    return [
        e.content
        for _, e in await events_of(journal, STREAM, ContextAdded)
        if e.role == "assistant"
    ]


async def test_items_that_do_not_wake_the_model(journal: Journal) -> None:
    script = Script()
    agent = Agent(journal, STREAM, FunctionModel(script))
    await born(journal)
    assert (await agent.run_until_idle()).requests == []  # the system prompt wakes nothing
    result = ToolCallResult(tool_call_id="c0", name="t", content="stale result")
    quiet = [
        user("just so you know", behaviour="none"),
        ContextAdded(role="system", content="another durable rule", key="rules"),
        ContextAdded(role="assistant", actor=Actor(type="agent"), content="earlier output"),
        tool_result_item(result),
        ContextAdded(role="developer", actor=Actor(type="agent"), content="agent note"),
        ContextAdded(
            role="developer",
            actor=Actor(type="webhook", id="ci"),
            content="CI passed",
            llm_request_policy=LlmRequestPolicy(behaviour="none"),
        ),
    ]
    for item in quiet:
        await journal.append(STREAM, item)
        report = await agent.run_until_idle()
        assert report.requests == [] and report.status == "idle", item
    assert script.requests == []
    assert await requests_of(journal, STREAM) == []
    # They are context all the same: the next waking item's request carries them.
    await journal.append(STREAM, user("now answer?"))
    report = await agent.run_until_idle()
    assert len(report.requests) == 1
    sent = text_of(script.requests[0])
    for needle in ("just so you know", "another durable rule", "CI passed", "agent note"):
        assert needle in sent


async def test_webhook_developer_item_wakes_the_model_as_user_role(journal: Journal) -> None:
    script = Script()
    await born(journal)
    await journal.append(
        STREAM,
        ContextAdded(
            role="developer", actor=Actor(type="webhook", id="ci"), content="Build 7 failed."
        ),
    )
    report = await Agent(journal, STREAM, FunctionModel(script)).run_until_idle()
    assert len(report.requests) == 1
    [message] = [m for m in script.requests[0].messages if "Build 7 failed." in m.content]
    assert message.role == "user"  # external data never gets developer precedence
    sched = await journal.fold(Scheduler, STREAM)
    assert sched.turn_kind == "integration"


# -- while a request is in flight --------------------------------------------------------------


async def test_after_current_request_waits_and_is_answered_by_the_next_request(
    journal: Journal,
) -> None:
    seen: list[NeutralRequest] = []
    finished: list[int] = []

    async def model(request: NeutralRequest) -> str:
        seen.append(request)
        if len(seen) == 1:
            await journal.append(STREAM, user("and one more thing?"))
            await asyncio.sleep(0.1)  # the watcher sees the item: it must not interrupt
        finished.append(len(seen))
        statuses.append(agent.status)
        return f"answer {len(seen)}"

    statuses: list[str] = []
    agent = Agent(journal, STREAM, FunctionModel(model))
    await born(journal)
    await journal.append(STREAM, user("first question?"))
    report = await agent.run_until_idle()
    assert finished == [1, 2]
    assert statuses == ["busy", "busy"] and agent.status == "idle"
    assert report.interrupted == []
    assert await interrupted_of(journal, STREAM) == []
    assert len(report.requests) == 2
    assert "and one more thing?" not in text_of(seen[0])
    assert "and one more thing?" in text_of(seen[1])
    # Arrival order is the fact: the item landed while request 1 ran, before its answer.
    second = text_of(seen[1])
    assert second.index("and one more thing?") < second.index("answer 1")
    assert await assistant_items(journal) == ["answer 1", "answer 2"]


async def test_none_arriving_in_flight_does_not_wake_the_model(journal: Journal) -> None:
    seen: list[NeutralRequest] = []

    async def model(request: NeutralRequest) -> str:
        seen.append(request)
        if len(seen) == 1:
            await journal.append(STREAM, user("fyi, no answer needed", behaviour="none"))
        return "ok"

    await born(journal)
    await journal.append(STREAM, user("question?"))
    report = await Agent(journal, STREAM, FunctionModel(model)).run_until_idle()
    assert len(report.requests) == 1 and report.status == "idle"
    await journal.append(STREAM, user("next?"))
    await Agent(journal, STREAM, FunctionModel(model)).run_until_idle()
    assert "fyi, no answer needed" in text_of(seen[1])


async def test_interrupt_cancels_the_request_in_flight(journal: Journal) -> None:
    seen: list[NeutralRequest] = []
    cancelled = asyncio.Event()
    never = asyncio.Event()
    interrupter: list[int] = []

    async def model(request: NeutralRequest) -> str:
        seen.append(request)
        if len(seen) == 1:
            appended = await journal.append(STREAM, user("STOP, do this instead", "interrupt"))
            interrupter.append(appended.first_position)
            try:
                await never.wait()
            except asyncio.CancelledError:
                cancelled.set()
                raise
        return "new answer"

    observer = Observer()
    await born(journal)
    await journal.append(STREAM, user("a long task"))
    agent = Agent(journal, STREAM, FunctionModel(model), observer=observer)
    report = await asyncio.wait_for(agent.run_until_idle(), timeout=10)
    first, second = report.requests
    assert report.interrupted == [first]
    assert await interrupted_of(journal, STREAM) == [first]
    assert cancelled.is_set()
    assert [e.offset for e in observer.of(RequestInterrupted)] == [first]
    assert observer.of(RequestInterrupted)[0].by == interrupter[0]
    assert "STOP, do this instead" not in text_of(seen[0])
    assert "STOP, do this instead" in text_of(seen[1])
    assert await assistant_items(journal) == ["new answer"]  # the cancelled one answered nothing
    assert report.status == "idle"
    # The interrupted request stays published and recorded; both rebuild.
    recorded = await recorded_of(journal, STREAM)
    assert set(recorded) == {first, second}
    for offset in (first, second):
        assert (await rebuild_request(journal, STREAM, offset)).sha256 == recorded[offset][0]


async def test_interrupt_from_another_task(journal: Journal) -> None:
    """The interrupting item comes from elsewhere (a user typing), not from the model call."""
    started = asyncio.Event()
    seen: list[NeutralRequest] = []

    async def model(request: NeutralRequest) -> str:
        seen.append(request)
        if len(seen) == 1:
            started.set()
            await asyncio.sleep(60)
        return "done"

    await born(journal)
    await journal.append(STREAM, user("slow work"))
    agent = Agent(journal, STREAM, FunctionModel(model))
    run = asyncio.create_task(agent.run_until_idle())
    await asyncio.wait_for(started.wait(), 5)
    await journal.append(STREAM, user("never mind", "interrupt"))
    report = await asyncio.wait_for(run, 10)
    assert len(report.interrupted) == 1 and len(report.requests) == 2
    assert "never mind" in text_of(seen[1])


async def test_interrupt_with_nothing_in_flight_just_wakes(journal: Journal) -> None:
    script = Script()
    await born(journal)
    await journal.append(STREAM, user("urgent", "interrupt"))
    report = await Agent(journal, STREAM, FunctionModel(script)).run_until_idle()
    assert len(report.requests) == 1 and report.interrupted == []
    assert "urgent" in text_of(script.requests[0])


# -- distributed birth -------------------------------------------------------------------------


async def test_trigger_before_system_prompt_is_queued_then_answered(journal: Journal) -> None:
    script = Script()
    observer = Observer()
    agent = Agent(journal, STREAM, FunctionModel(script), observer=observer)
    await journal.append(STREAM, user("are you there?"))
    for _ in range(3):  # asking again changes nothing: still queued, never busy
        report = await agent.run_until_idle()
        assert report.status == "queued"
        assert agent.status == "queued"
        assert report.requests == []
        assert "system-prompt" in report.reason
    # Other system context is not the base prompt: still queued.
    await journal.append(STREAM, ContextAdded(role="system", content="extra rule", key="rules"))
    assert (await agent.run_until_idle()).status == "queued"
    assert await requests_of(journal, STREAM) == []
    assert script.requests == []
    assert not observer.of(RequestSent)

    await journal.append(STREAM, system_prompt("You are the agent."))
    report = await agent.run_until_idle()
    assert report.status == "idle" and agent.status == "idle"
    assert len(report.requests) == 1
    request = script.requests[0]
    assert "are you there?" in text_of(request)
    assert "You are the agent." in text_of(request)
    context = await journal.fold(AgentContext, STREAM)
    assert context.has_system_prompt


async def test_a_stream_waiting_for_its_system_prompt_is_logged_once_per_agent(
    journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="contextfold.runtime")
    other = "agents/other"
    idle = Agent(journal, "agents/quiet", FunctionModel(Script()))
    agents = [Agent(journal, name, FunctionModel(Script())) for name in (STREAM, other)]
    await journal.append(STREAM, user("are you there?"))
    await journal.append(other, user("hello?"))
    for _ in range(3):  # polled again and again: said once
        assert (await idle.run_until_idle()).status == "idle"
        for agent in agents:
            assert (await agent.run_until_idle()).status == "queued"

    def waiting() -> list[tuple[int, str]]:
        return [
            (r.levelno, r.getMessage())
            for r in caplog.records
            if r.name == "contextfold.runtime" and SYSTEM_PROMPT_KEY in r.getMessage()
        ]

    said = waiting()
    assert [level for level, _ in said] == [logging.WARNING, logging.WARNING]
    assert [repr(STREAM) in m for _, m in said] == [True, False]
    assert [repr(other) in m for _, m in said] == [False, True]
    assert all("cf.system_prompt" in m for _, m in said)

    await born(journal)
    assert len((await agents[0].run_until_idle()).requests) == 1
    assert waiting() == said


async def test_queued_status_from_a_fresh_instance(journal: Journal) -> None:
    """Another process (a new instance) sees the pending trigger as queued too."""
    await journal.append(STREAM, user("hello"))
    await Agent(journal, STREAM, FunctionModel(Script())).run_until_idle()
    report = await Agent(journal, STREAM, FunctionModel(Script())).run_until_idle()
    assert report.status == "queued"
    await born(journal)
    script = Script()
    report = await Agent(journal, STREAM, FunctionModel(script)).run_until_idle()
    assert len(report.requests) == 1 and "hello" in text_of(script.requests[0])


async def test_a_warm_turn_reads_only_new_events(journal: Journal) -> None:
    """On a long stream the loop (interrupt watcher included) never re-reads from the start."""
    await born(journal)
    await journal.append(STREAM, [user(f"old {n}", behaviour="none") for n in range(1500)])
    await journal.append(STREAM, user("first?"))
    agent = Agent(journal, STREAM, FunctionModel(Script()))
    await agent.run_until_idle()
    reads: list[tuple[str | None, int | None]] = []
    store = journal.store
    original = store.read

    async def spy(namespace: str, stream: str, **kw: Any) -> ReadResult:
        reads.append((kw.get("after"), kw.get("limit")))
        return await original(namespace, stream, **kw)

    store.read = spy  # type: ignore[method-assign]
    try:
        await journal.append(STREAM, user("second?"))
        report = await agent.run_until_idle()
    finally:
        store.read = original  # type: ignore[method-assign]
    assert len(report.requests) == 1
    # Its own appends fold into its cached states as they land: it may read nothing at all.
    assert all(after is not None for after, _ in reads), reads


async def test_interrupt_on_a_long_stream(journal: Journal) -> None:
    await born(journal)
    await journal.append(STREAM, [user(f"old {n}", behaviour="none") for n in range(2500)])
    await journal.append(STREAM, user("work"))
    seen: list[NeutralRequest] = []

    async def model(request: NeutralRequest) -> str:
        seen.append(request)
        if len(seen) == 1:
            await journal.append(STREAM, user("stop", "interrupt"))
            await asyncio.sleep(60)
        return "ok"

    report = await asyncio.wait_for(
        Agent(journal, STREAM, FunctionModel(model)).run_until_idle(), 20
    )
    assert len(report.interrupted) == 1 and len(report.requests) == 2


async def test_an_interrupted_model_call_has_finished_before_the_loop_goes_on(
    journal: Journal,
) -> None:
    """The cancelled call's cleanup (an SDK closing its stream) runs to its end before the
    interruption is recorded and the next request starts."""
    cleaned: list[bool] = []

    async def model(request: NeutralRequest) -> str:
        if not cleaned:
            cleaned.append(False)
            await journal.append(STREAM, user("stop", "interrupt"))
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                await asyncio.sleep(0.05)  # closing a connection takes a few awaits
                cleaned[0] = True
                raise
        return "ok"

    seen_at_interrupt: list[bool] = []

    class Watch:
        async def on_event(self, event: LoopEvent) -> None:
            if isinstance(event, RequestInterrupted):
                seen_at_interrupt.append(cleaned[0])

    await born(journal)
    await journal.append(STREAM, user("work"))
    agent = Agent(journal, STREAM, FunctionModel(model), observer=Watch())
    report = await asyncio.wait_for(agent.run_until_idle(), 10)
    assert len(report.interrupted) == 1
    assert seen_at_interrupt == [True]


async def test_the_interrupt_watchers_tail_is_closed_before_the_loop_goes_on(
    journal: Journal,
) -> None:
    """The tail that saw the interrupt is closed (a PostgreSQL tail stops listening) by the
    watcher itself, not later by the garbage collector in a task nobody awaits."""
    closed: list[bool] = []
    subscribe = journal.subscribe

    async def tail(stream: str, **options: Any) -> AsyncIterator[StoredEvent]:
        try:
            async for event in subscribe(stream, **options):
                yield event
        finally:
            await asyncio.sleep(0.05)  # closing a listening connection takes a few awaits
            closed.append(True)

    journal.subscribe = tail  # type: ignore[method-assign]

    async def model(request: NeutralRequest) -> str:
        if not interrupted.is_set():
            interrupted.set()
            await journal.append(STREAM, user("stop", "interrupt"))
            await asyncio.sleep(60)
        return "ok"

    interrupted = asyncio.Event()
    closed_at_interrupt: list[bool] = []

    class Watch:
        async def on_event(self, event: LoopEvent) -> None:
            if isinstance(event, RequestInterrupted):
                closed_at_interrupt.append(bool(closed))

    await born(journal)
    await journal.append(STREAM, user("work"))
    agent = Agent(journal, STREAM, FunctionModel(model), observer=Watch())
    report = await asyncio.wait_for(agent.run_until_idle(), 10)
    assert len(report.interrupted) == 1
    assert closed_at_interrupt == [True]


async def test_status_is_not_left_busy_after_a_model_error(journal: Journal) -> None:
    def model(request: NeutralRequest) -> str:
        raise ModelError("provider down")

    statuses: list[str] = []

    class Watch:
        async def on_event(self, event: LoopEvent) -> None:
            statuses.append(agent.status)

    await born(journal)
    await journal.append(STREAM, user("hello?"))
    agent = Agent(journal, STREAM, FunctionModel(model), observer=Watch())
    with pytest.raises(ModelError):
        await agent.run_until_idle()
    assert "busy" in statuses  # it was busy while the request ran...
    assert agent.status == "idle"  # ...and is not any more


async def test_the_interrupt_watcher_tails_from_the_request_at_a_modest_poll(
    journal: Journal,
) -> None:
    """In-process appends wake the tail at once; the poll is only for other processes. A
    retry tails from its request too, never from the stream's start."""
    tails: list[tuple[str | None, float]] = []
    subscribe = journal.subscribe

    def spy(stream: str, *, after: str | None = None, poll_interval: float = 0.05) -> Any:
        tails.append((after, poll_interval))
        return subscribe(stream, after=after, poll_interval=poll_interval)

    journal.subscribe = spy  # type: ignore[method-assign,assignment]
    answers: Iterator[ModelError | str] = iter([ModelError("provider down"), "ok"])

    async def model(request: NeutralRequest) -> str:
        seen = len(tails)
        for _ in range(1000):  # in flight until it is watched (an instant answer is not)
            if len(tails) > seen:
                break
            await asyncio.sleep(0)
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    await born(journal)
    await journal.append(STREAM, user("hello?"))
    with pytest.raises(ModelError):
        await Agent(journal, STREAM, FunctionModel(model)).run_until_idle()
    await journal.append(STREAM, user("later, context only", "none"))
    report = await Agent(journal, STREAM, FunctionModel(model)).run_until_idle()
    [request] = report.requests
    [stored] = await journal.latest(STREAM, [LlmRequestRequested])
    assert stored.position == request
    assert [after for after, _ in tails] == [stored.cursor] * 2  # the send and the retry
    assert all(poll >= 0.05 for _, poll in tails)


@pytest.mark.parametrize("payload", [{"role": "critic", "content": "x"}, "not an object"])
async def test_an_undecodable_item_after_a_request_does_not_stop_the_agent(
    journal: Journal, payload: Any
) -> None:
    """A ContextAdded this version cannot decode (a newer writer's role) lands after an
    unanswered request: the folds skip it, and so does the interrupt watcher of the retry."""
    calls: list[int] = []

    async def model(request: NeutralRequest) -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ModelError("provider 503")
        await asyncio.sleep(0.2)  # the watcher reads the stream meanwhile
        return "answer"

    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("hi"))
    with pytest.raises(ModelError):
        await Agent(journal, STREAM, FunctionModel(model)).run_until_idle()
    await journal.append(STREAM, RawEvent(ContextAdded.event_type, payload))
    report = await Agent(journal, STREAM, FunctionModel(model)).run_until_idle()
    assert report.status == "idle" and report.requests == [3]
    history = (await journal.fold(AgentContext, STREAM)).history
    assert [i.content for i in history if i.role == "assistant"] == ["answer"]


async def test_a_tool_turn_folds_appended_into_the_state_a_cold_fold_gives(
    journal: Journal,
) -> None:
    """Its handlers run once per appended event: a tool turn and a usage report fold into
    the state a cold fold of the same events gives."""
    from contextfold.wire import ToolCall, Usage

    await born(journal)
    seen: list[int] = []

    def answer(request: NeutralRequest) -> ModelOutput | str:
        seen.append(len(request.messages))
        if request.messages[-2].role == "tool":
            return ModelOutput(text="done", usage=Usage(input_tokens=5, output_tokens=1))
        return ModelOutput(tool_calls=(ToolCall(id="c1", name="lookup", arguments="{}"),))

    def lookup() -> str:
        """Look something up."""
        return "found"

    agent = Agent(journal, STREAM, FunctionModel(answer), tools=[lookup])
    await journal.append(STREAM, user("look it up"))
    await agent.run_until_idle()
    warm = await journal.fold(Scheduler, STREAM)
    assert len(seen) == 2 and warm.answered and warm.outstanding == () and warm.started == ()
    assert len(warm.reports) == 2 and warm.reports[-1].usage == Usage(
        input_tokens=5, output_tokens=1
    )
    assert all(r.text == "" and r.tool_calls == () for r in warm.reports)
    cold = await Journal(journal.store, fold_cache=FoldCache()).fold(Scheduler, STREAM)
    assert cold == warm and cold.model_fields_set == warm.model_fields_set
