"""The transcript observer closes what a request opened, even when the request is interrupted
or the provider fails: no unfinished rows, nothing left in the writer's buffers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from runtime_helpers import STREAM, requests_of, user

from contextfold.context.events import LlmRequestInterrupted, LlmResponse
from contextfold.errors import ModelError, StoreError
from contextfold.events import Event
from contextfold.journal import Journal
from contextfold.runtime.clients import FunctionModel, OnDelta
from contextfold.runtime.events import LoopCancelled, LoopEvent, RequestInterrupted
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.transcript import TranscriptObserver
from contextfold.transcript import TranscriptBus, TranscriptWriter, open_transcript_store
from contextfold.transcript.parts import TextPart, ToolPart
from contextfold.transcript.store.base import TranscriptStore
from contextfold.wire import ModelOutput, NeutralRequest, RenderedRequest, ToolCall, Transport

SESSION = "session-1"


@pytest.fixture
async def store() -> AsyncIterator[TranscriptStore]:
    opened = open_transcript_store("sqlite:///:memory:")
    await opened.open()
    yield opened
    await opened.close()


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
