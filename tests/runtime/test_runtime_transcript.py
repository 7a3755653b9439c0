"""The transcript observer closes what a request opened, even when the request is interrupted
or the provider fails: no unfinished rows, nothing left in the writer's buffers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from runtime_helpers import STREAM, requests_of, user

from contextfold.journal import Journal
from contextfold.render.neutral import NeutralRequest, RenderedRequest, Transport
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.models import ModelError, ModelOutput, OnDelta
from contextfold.runtime.transcript import TranscriptObserver
from contextfold.transcript import TranscriptBus, TranscriptWriter, open_transcript_store
from contextfold.transcript.parts import TextPart
from contextfold.transcript.persist import TranscriptStore

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
