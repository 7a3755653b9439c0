"""The transcript observer: a request's rows in stream order (step-start, text, tools,
step-finish), the user messages it answers with its parent and model, tool parts that a
late result never reopens, a compacted view that is what the model sees next; and it
closes what a request opened, even when the request is interrupted or the provider fails:
no unfinished rows, nothing left in the writer's buffers."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from contextfold.context.compaction import COMPACTION_INSTRUCTION
from contextfold.context.events import (
    Actor,
    ContextAdded,
    FileAttachment,
    LlmRequestInterrupted,
    LlmRequestPolicy,
    LlmResponse,
    ToolCallResult,
)
from contextfold.context.projection import AgentContext
from contextfold.context.request import TAIL_PREFIX, parse_item_header
from contextfold.errors import ModelError, StoreError
from contextfold.events import Event
from contextfold.journal import Journal
from contextfold.runtime.clients import FunctionModel, OnDelta
from contextfold.runtime.events import LoopCancelled, LoopEvent, RequestInterrupted
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.transcript import TranscriptObserver
from contextfold.transcript import (
    TranscriptBus,
    TranscriptWriter,
    compacted_history,
    read_history,
)
from contextfold.transcript.parts import (
    CompactionPart,
    FilePart,
    MessageWithParts,
    StepFinishPart,
    StepStartPart,
    TextPart,
    ToolPart,
)
from contextfold.transcript.store.base import TranscriptStore
from contextfold.wire import (
    ModelOutput,
    NeutralMessage,
    NeutralRequest,
    RenderedRequest,
    ToolCall,
    Transport,
    Usage,
)
from tests.runtime.helpers import STREAM, events_of, requests_of, user

SESSION = "session-1"


class Streaming:
    """Streams ``partial N`` and then, for its first ``stalls`` calls, appends an interrupt
    and waits to be cancelled; ``fail`` raises after the delta instead. Then answers."""

    transport: Transport = "openai-chat"
    model = "streaming"

    def __init__(self, journal: Journal, *, stalls: int = 0, fail: bool = False) -> None:
        self.journal, self.stalls, self.fail = journal, stalls, fail
        self.calls = 0

    async def complete(
        self, request: NeutralRequest, rendered: RenderedRequest, *, on_delta: OnDelta | None = None
    ) -> ModelOutput:
        self.calls += 1
        assert on_delta is not None
        await on_delta("text", f"partial {self.calls}  ")  # type: ignore[misc]
        if self.fail:
            raise ModelError("provider down mid-stream")
        if self.calls <= self.stalls:
            await self.journal.append(STREAM, user(f"stop {self.calls}", "interrupt"))
            await asyncio.sleep(60)
        return ModelOutput(text="done")


def observer(store: TranscriptStore) -> tuple[TranscriptObserver, TranscriptWriter]:
    writer = TranscriptWriter(store, TranscriptBus())
    return TranscriptObserver(writer, SESSION, clock=lambda: "2026-01-01T00:00:00+00:00"), writer


async def text_of_part(store: TranscriptStore, offset: int) -> Any:
    part = await store.get_part(SESSION, f"text-{offset}")
    assert isinstance(part, TextPart)
    return part


async def test_interrupted_requests_leave_no_open_rows(
    journal: Journal, store: TranscriptStore
) -> None:
    rows, writer = observer(store)
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("work"))
    model = Streaming(journal, stalls=20)
    report = await asyncio.wait_for(
        Agent(journal, STREAM, model, observer=rows).run_until_idle(), 30
    )
    assert len(report.interrupted) == 20 and len(report.requests) == 21
    assert writer._blocks == {} and writer._open == {}
    assert await store.unfinished(SESSION) == ((), ())
    for n, offset in enumerate(report.interrupted, start=1):
        message = await store.get_message(SESSION, f"request-{offset}")
        assert message is not None and message.finish == "interrupted"
        part = await text_of_part(store, offset)
        assert part.text == f"partial {n}" and part.end is not None  # what the deltas confirmed
    last = await store.get_message(SESSION, f"request-{report.requests[-1]}")
    assert last is not None and last.finish == "stop"


async def test_a_model_error_closes_the_request_rows(
    journal: Journal, store: TranscriptStore
) -> None:
    rows, writer = observer(store)
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("work"))
    agent = Agent(journal, STREAM, Streaming(journal, fail=True), observer=rows)
    with pytest.raises(ModelError):
        await agent.run_until_idle()
    [offset] = await requests_of(journal, STREAM)
    assert writer._blocks == {} and writer._open == {}
    assert await store.unfinished(SESSION) == ((), ())
    message = await store.get_message(SESSION, f"request-{offset}")
    assert message is not None and message.finish == "error"
    assert message.error is not None and "provider down mid-stream" in message.error
    assert (await text_of_part(store, offset)).text == "partial 1"


class Stalling:
    """Streams one delta, then waits (a long model call) until cancelled."""

    transport: Transport = "openai-chat"
    model = "stalling"

    def __init__(self) -> None:
        self.started = asyncio.Event()

    async def complete(
        self, request: NeutralRequest, rendered: RenderedRequest, *, on_delta: OnDelta | None = None
    ) -> ModelOutput:
        assert on_delta is not None
        await on_delta("text", "partial ")  # type: ignore[misc]
        self.started.set()
        await asyncio.sleep(60)
        return ModelOutput(text="done")


async def test_cancelling_the_agent_mid_request_closes_the_request_rows(
    journal: Journal, store: TranscriptStore
) -> None:
    """The agent's task is cancelled (a shutdown) while the model streams: the rows the
    request opened are closed as interrupted, and the cancel still propagates."""
    rows, writer = observer(store)
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("work"))
    model = Stalling()
    task = asyncio.create_task(Agent(journal, STREAM, model, observer=rows).run_until_idle())
    await asyncio.wait_for(model.started.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [offset] = await requests_of(journal, STREAM)
    assert writer._blocks == {} and writer._open == {}
    assert await store.unfinished(SESSION) == ((), ())
    message = await store.get_message(SESSION, f"request-{offset}")
    assert message is not None and message.finish == "interrupted"


def hold_appends_of(
    journal: Journal, monkeypatch: pytest.MonkeyPatch, cls: type[Event], failure: Exception | None
) -> asyncio.Event:
    """Make the journal's appends holding a ``cls`` event stall (until cancelled), or raise
    ``failure``; the returned event is set when one is attempted."""
    attempted = asyncio.Event()
    original = journal.append

    async def append(stream: str, events: Any, **options: Any) -> Any:
        if any(isinstance(e, cls) for e in (events if isinstance(events, list) else [events])):
            attempted.set()
            if failure is not None:
                raise failure
            await asyncio.sleep(60)
        return await original(stream, events, **options)

    monkeypatch.setattr(journal, "append", append)
    return attempted


def stalls_for(cls: type[Event]) -> int:
    """An interruption is recorded when the model stalls once; otherwise it answers."""
    return 1 if cls is LlmRequestInterrupted else 0


async def assert_closed(store: TranscriptStore, writer: TranscriptWriter, offset: int) -> str:
    assert writer._blocks == {} and writer._open == {}
    assert await store.unfinished(SESSION) == ((), ())
    message = await store.get_message(SESSION, f"request-{offset}")
    assert message is not None and message.finish is not None
    return message.finish


@pytest.mark.parametrize("cls", [LlmResponse, LlmRequestInterrupted])
async def test_cancelling_the_agent_while_it_records_the_outcome_closes_the_request_rows(
    journal: Journal, store: TranscriptStore, monkeypatch: pytest.MonkeyPatch, cls: type[Event]
) -> None:
    """The model call is over, and the agent is cancelled while it appends the answer (or
    the interruption): the rows the request opened are closed as interrupted all the same."""
    rows, writer = observer(store)
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("work"))
    recording = hold_appends_of(journal, monkeypatch, cls, None)
    agent = Agent(journal, STREAM, Streaming(journal, stalls=stalls_for(cls)), observer=rows)
    task = asyncio.create_task(agent.run_until_idle())
    await asyncio.wait_for(recording.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [offset] = await requests_of(journal, STREAM)
    assert await assert_closed(store, writer, offset) == "interrupted"


@pytest.mark.parametrize("cls", [LlmResponse, LlmRequestInterrupted])
async def test_a_journal_error_recording_the_outcome_closes_the_request_rows(
    journal: Journal, store: TranscriptStore, monkeypatch: pytest.MonkeyPatch, cls: type[Event]
) -> None:
    rows, writer = observer(store)
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("work"))
    hold_appends_of(journal, monkeypatch, cls, StoreError("disk full"))
    agent = Agent(journal, STREAM, Streaming(journal, stalls=stalls_for(cls)), observer=rows)
    with pytest.raises(StoreError):
        await agent.run_until_idle()
    [offset] = await requests_of(journal, STREAM)
    assert await assert_closed(store, writer, offset) == "error"


class SlowToClose:
    """An observer whose closing of an interrupted request takes until ``release`` is set."""

    def __init__(self) -> None:
        self.closing, self.release, self.closed = asyncio.Event(), asyncio.Event(), False

    async def on_event(self, event: LoopEvent) -> None:
        if isinstance(event, RequestInterrupted):
            self.closing.set()
            await self.release.wait()
            self.closed = True


async def test_a_second_cancel_neither_cuts_nor_orphans_the_closing_of_the_rows(
    journal: Journal,
) -> None:
    """Cancelled again while its observers close the request's rows, the agent still waits
    for them: it neither ends with the rows open nor leaves the closing running on."""
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("work"))
    model, slow = Stalling(), SlowToClose()
    task = asyncio.create_task(Agent(journal, STREAM, model, observer=slow).run_until_idle())
    await asyncio.wait_for(model.started.wait(), 10)
    task.cancel()
    await asyncio.wait_for(slow.closing.wait(), 10)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=0.2)
    assert not done  # still closing
    slow.release.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert slow.closed


async def test_cancelling_the_agent_while_tools_run_closes_their_rows(
    journal: Journal, store: TranscriptStore
) -> None:
    """Cancelled while the first of two tool calls runs: the running tool and the pending
    one fail "interrupted", and the message that asked for them finishes."""
    rows, writer = observer(store)
    running = asyncio.Event()

    async def wait() -> str:
        """Waits."""
        running.set()
        await asyncio.sleep(60)
        return "waited"

    calls = tuple(ToolCall(id=f"c{n}", name="wait", arguments="{}") for n in (1, 2))
    model = FunctionModel(lambda request: ModelOutput(text="waiting", tool_calls=calls))
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("wait twice"))
    agent = Agent(journal, STREAM, model, tools=[wait], observer=rows)
    task = asyncio.create_task(agent.run_until_idle())
    await asyncio.wait_for(running.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    [offset] = await requests_of(journal, STREAM)
    assert await assert_closed(store, writer, offset) == "interrupted"
    for call in calls:
        part = await store.get_part(SESSION, f"tool-{offset}-{call.id}")
        assert isinstance(part, ToolPart) and part.state == "error"


class FailsToClose:
    """An observer whose closing after a cancel fails (its store is down)."""

    async def on_event(self, event: LoopEvent) -> None:
        if isinstance(event, RequestInterrupted | LoopCancelled):
            raise ConnectionError("transcript store unreachable")


async def test_a_cancelled_agent_ends_cancelled_even_when_closing_its_rows_fails(
    journal: Journal, caplog: pytest.LogCaptureFixture
) -> None:
    """A shutdown must stay a cancel: an observer failing while it closes rows is logged,
    never raised in place of the CancelledError (timeouts and task groups rely on it)."""
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("work"))
    model = Stalling()
    task = asyncio.create_task(
        Agent(journal, STREAM, model, observer=FailsToClose()).run_until_idle()
    )
    await asyncio.wait_for(model.started.wait(), 10)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=10)
    assert task in done and task.cancelled()
    assert "transcript store unreachable" in caplog.text


async def test_an_agent_in_a_task_that_kept_an_earlier_cancel_still_runs(
    journal: Journal,
) -> None:
    """A task that caught a cancel and carried on (without ``uncancel``) keeps a count in
    ``Task.cancelling()``; only cancels requested during the run may stop the agent."""
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("hello?"))

    async def carry_on_then_run() -> list[int]:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(60)  # cancelled below; the task decides to go on
        agent = Agent(journal, STREAM, FunctionModel(lambda request: "hi"))
        return (await agent.run_until_idle()).requests

    task = asyncio.create_task(carry_on_then_run())
    await asyncio.sleep(0)
    task.cancel()
    requests = await asyncio.wait_for(task, 10)
    assert len(requests) == 1


CLOCK = "2026-01-01T00:00:00+00:00"


def recording_observer(
    store: TranscriptStore, journal: Journal
) -> tuple[TranscriptObserver, TranscriptWriter]:
    """An observer that also writes the user messages each request answers."""
    writer = TranscriptWriter(store, TranscriptBus())
    return TranscriptObserver(
        writer, SESSION, clock=lambda: CLOCK, journal=journal, stream=STREAM
    ), writer


def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


def one_call_then_text(request: NeutralRequest) -> ModelOutput:
    if request.messages[-2].role == "tool":
        return ModelOutput(text="done")
    call = ToolCall(id="c1", name="lookup", arguments='{"q": "x"}')
    return ModelOutput(text="looking", tool_calls=(call,))


async def test_each_request_stores_its_step_start_and_step_finish_in_stream_order(
    journal: Journal, store: TranscriptStore
) -> None:
    rows, _writer = observer(store)
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("look it up"))
    report = await Agent(
        journal, STREAM, FunctionModel(one_call_then_text), tools=[lookup], observer=rows
    ).run_until_idle()
    assert len(report.requests) == 2
    history = await read_history(store, SESSION)
    assert [[p.kind for p in e.parts] for e in history] == [
        ["step-start", "text", "tool", "step-finish"],
        ["step-start", "text", "step-finish"],
    ]
    responses = [r for _, r in await events_of(journal, STREAM, LlmResponse)]
    for entry, response in zip(history, responses, strict=True):
        start, text, *_tools, finish = entry.parts
        assert isinstance(start, StepStartPart) and start.time == CLOCK
        assert isinstance(text, TextPart) and text.text == response.text
        assert isinstance(finish, StepFinishPart) and finish.usage == response.usage
        assert finish.reason == response.stop_reason
    tool = history[0].parts[2]
    assert isinstance(tool, ToolPart) and (tool.state, tool.output) == ("completed", "found x")


async def test_the_transcript_records_the_user_messages_and_each_answer_s_parent_and_model(
    journal: Journal, store: TranscriptStore
) -> None:
    rows, _writer = recording_observer(store, journal)
    log_file = FileAttachment(uri="https://ci.example/log.txt", media_type="text/plain", name="log")
    await journal.append(STREAM, system_prompt("Agent."))
    webhook = ContextAdded(
        role="user",
        actor=Actor(type="webhook"),
        content="build 7 failed",
        files=(log_file,),
        llm_request_policy=LlmRequestPolicy(behaviour="none"),
    )
    first = await journal.append(STREAM, [webhook, user("why did it fail?")])

    pinged: list[int] = []

    async def lookup_and_ping(q: str) -> str:
        """Look something up (a deploy notice arrives meanwhile)."""
        notice = ContextAdded(
            role="developer",
            actor=Actor(type="webhook"),
            content="deploy started",
            llm_request_policy=LlmRequestPolicy(behaviour="none"),
        )
        pinged.append((await journal.append(STREAM, notice)).first_position)
        return f"found {q}"

    def model(request: NeutralRequest) -> ModelOutput:
        if "thanks" in request.messages[-2].content:
            return ModelOutput(text="you are welcome")
        output = one_call_then_text(request)
        calls = tuple(c.model_copy(update={"name": "lookup_and_ping"}) for c in output.tool_calls)
        return ModelOutput(text=output.text, tool_calls=calls)

    agent = Agent(
        journal,
        STREAM,
        FunctionModel(model, model="model-a"),
        tools=[lookup_and_ping],
        observer=rows,
    )
    await agent.run_until_idle()
    second = await journal.append(STREAM, user("thanks"))
    await agent.run_until_idle()
    r1, r2, r3 = await requests_of(journal, STREAM)

    history = await read_history(store, SESSION)
    hook_at, asked_at = first.first_position, first.last_position
    thanks_at = second.first_position
    assert [(e.message.id, e.message.role) for e in history] == [
        (f"item-{hook_at}", "user"),
        (f"item-{asked_at}", "user"),
        (f"request-{r1}", "assistant"),
        (f"item-{pinged[0]}", "user"),  # arrived while the tool ran; the tool result did not
        (f"request-{r2}", "assistant"),
        (f"item-{thanks_at}", "user"),
        (f"request-{r3}", "assistant"),
    ]
    hook, asked, a1, ping, a2, thanks, a3 = history
    [ping_text] = ping.parts
    assert isinstance(ping_text, TextPart) and ping_text.synthetic
    assert ping_text.text == "deploy started"
    assert [(p.kind, getattr(p, "text", None)) for p in hook.parts] == [
        ("text", "build 7 failed"),
        ("file", None),
    ]
    file_part = hook.parts[1]
    assert isinstance(file_part, FilePart)
    assert (file_part.url, file_part.mime, file_part.filename) == (
        log_file.uri,
        "text/plain",
        "log",
    )
    assert [getattr(p, "text", None) for p in asked.parts] == ["why did it fail?"]
    assert [getattr(p, "text", None) for p in thanks.parts] == ["thanks"]
    assert all(e.message.completed is not None for e in (hook, asked, thanks))
    # Each answer names the newest message from a person before its request (the notice
    # does not take the question's place), and its model.
    assert [(a.message.parent_id, a.message.model) for a in (a1, a2, a3)] == [
        (asked.message.id, "model-a"),
        (asked.message.id, "model-a"),
        (thanks.message.id, "model-a"),
    ]


async def test_a_retried_request_does_not_write_its_user_messages_twice(
    journal: Journal, store: TranscriptStore
) -> None:
    """A new agent (and a new observer) re-sends an unanswered request: the user messages
    it answers are written once."""
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("work"))
    rows, _writer = recording_observer(store, journal)
    with pytest.raises(ModelError):
        await Agent(journal, STREAM, Streaming(journal, fail=True), observer=rows).run_until_idle()
    rows, _writer = recording_observer(store, journal)
    await Agent(journal, STREAM, FunctionModel(lambda r: "ok"), observer=rows).run_until_idle()
    [offset] = await requests_of(journal, STREAM)
    history = await read_history(store, SESSION)
    assert [e.message.id for e in history] == [f"item-{offset - 1}", f"request-{offset}"]
    assert history[1].message.finish == "stop"
    assert history[1].message.parent_id == f"item-{offset - 1}"


async def test_a_tool_result_after_its_part_was_closed_is_refused_and_reported(
    journal: Journal, store: TranscriptStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The turn's rows are closed (``writer.interrupt``) while a tool runs; the tool then
    returns. The part stays as it was closed, the refusal is logged, the agent goes on, and
    the journal keeps the tool's output."""
    rows, writer = observer(store)
    running, release = asyncio.Event(), asyncio.Event()

    async def slow() -> str:
        """Takes a while."""
        running.set()
        await release.wait()
        return "slow result"

    def model(request: NeutralRequest) -> ModelOutput:
        if request.messages[-2].role == "tool":
            return ModelOutput(text="done")
        return ModelOutput(text="", tool_calls=(ToolCall(id="c1", name="slow", arguments="{}"),))

    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("go"))
    agent = Agent(journal, STREAM, FunctionModel(model), tools=[slow], observer=rows)
    task = asyncio.create_task(agent.run_until_idle())
    await asyncio.wait_for(running.wait(), 10)
    first = (await requests_of(journal, STREAM))[0]
    closed = await writer.interrupt(SESSION, now="closed-at")
    assert [p.id for p in closed.parts] == [f"tool-{first}-c1"]
    release.set()
    report = await asyncio.wait_for(task, 10)

    assert report.status == "idle" and len(report.requests) == 2
    part = await store.get_part(SESSION, f"tool-{first}-c1")
    assert isinstance(part, ToolPart)
    assert (part.state, part.error, part.end) == ("error", "interrupted", "closed-at")
    message = await store.get_message(SESSION, f"request-{first}")
    assert message is not None and message.finish == "interrupted"  # not re-finished
    assert f"tool part 'tool-{first}-c1'" in caplog.text and "already error" in caplog.text
    results = [r for _, r in await events_of(journal, STREAM, ToolCallResult)]
    assert [r.content for r in results] == ["slow result"]
    assert await store.unfinished(SESSION) == ((), ())


BIG = 100_000  # input tokens over half the default context window


def _body(message: NeutralMessage) -> str:
    """An item message's content without its header line (the agent's own answers have
    none: layout 2)."""
    if message.role == "assistant" and parse_item_header(message.content) is None:
        return message.content
    assert parse_item_header(message.content) is not None, message.content
    return message.content.split("\n", 1)[1]


def model_view(request: NeutralRequest) -> list[tuple[str, str]]:
    """What the model sees of the conversation: (role, content) of each item message."""
    return [
        (m.role, _body(m))
        for m in request.messages
        if m.role != "system" and not m.content.startswith(TAIL_PREFIX)
    ]


def transcript_view(view: tuple[MessageWithParts, ...]) -> list[tuple[str, str]]:
    """The same of a compacted transcript view: the summary (sent as user), each message's
    text, each tool's output (sent as a tool message after its call)."""
    seen: list[tuple[str, str]] = []
    for entry in view:
        role = "user" if entry.message.summary else entry.message.role
        texts = [p.text for p in entry.parts if isinstance(p, TextPart)]
        if texts:
            seen.append((role, "\n".join(texts)))
        seen.extend(("tool", p.output or "") for p in entry.parts if isinstance(p, ToolPart))
    return seen


async def test_after_a_runtime_compaction_the_compacted_view_is_what_the_model_sees_next(
    journal: Journal, store: TranscriptStore
) -> None:
    sent: list[NeutralRequest] = []

    def model(request: NeutralRequest) -> ModelOutput:
        if request.messages[-1].content == COMPACTION_INSTRUCTION:
            return ModelOutput(text="SUMMARY of the first two questions")
        sent.append(request)
        last = request.messages[-2]
        if "HEAVY" in last.content:  # the measured request: a tool call, a big prompt
            call = ToolCall(id="c1", name="lookup", arguments='{"q": "heavy"}')
            return ModelOutput(
                text="answer 3", tool_calls=(call,), usage=Usage(input_tokens=BIG, output_tokens=9)
            )
        return ModelOutput(text=f"answer {len(sent)}", usage=Usage(input_tokens=500))

    rows, _writer = recording_observer(store, journal)
    agent = Agent(journal, STREAM, FunctionModel(model), tools=[lookup], observer=rows)
    await journal.append(STREAM, system_prompt("Agent."))
    for text in ("question one", "question two", "question three HEAVY", "question five"):
        await journal.append(STREAM, user(text))
        report = await agent.run_until_idle()
    cutoff = (await journal.fold(AgentContext, STREAM)).compacted_through
    assert cutoff == (await requests_of(journal, STREAM))[2]

    view = await compacted_history(store, SESSION)
    boundary, summary, measured, *_rest, answer = view
    assert boundary.message.id == f"compaction-{cutoff}" and summary.message.summary
    [marker] = [p for p in boundary.parts if isinstance(p, CompactionPart)]
    assert marker.tail_start_id == measured.message.id == f"request-{cutoff}"
    # Everything between the summary and the newest answer is what the newest request sent.
    assert transcript_view(view[1:-1]) == model_view(sent[-1])
    assert [t for _, t in model_view(sent[-1])] == [
        "SUMMARY of the first two questions",  # the summary,
        "answer 3",  # the measured answer,
        "found heavy",  # and everything after the cutoff
        "answer 4",
        "question five",
    ]
    assert answer.message.id == f"request-{report.requests[-1]}"
