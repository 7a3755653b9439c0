"""Typed loop events: each a frozen keyword-only dataclass with its own ``kind``, one union,
and observers (the transcript, the demo printer) that handle every member of it."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import AsyncIterator
from typing import Any, cast, get_args, get_type_hints

import pytest
from rich.console import Console

from contextfold import demo as demo_module
from contextfold.context.events import ContextAdded
from contextfold.journal import Journal
from contextfold.runtime.events import (
    LOOP_EVENT_TYPES,
    CompactionFinished,
    CompactionStarted,
    DeltaReceived,
    LoopCancelled,
    LoopEvent,
    LoopHalted,
    Observers,
    RequestFailed,
    RequestInterrupted,
    RequestRetried,
    RequestSent,
    ResponseRecorded,
    ToolFinished,
    ToolStarted,
)
from contextfold.runtime.tools import ToolOutcome
from contextfold.runtime.transcript import TranscriptObserver
from contextfold.transcript import TranscriptBus, TranscriptWriter, open_transcript_store
from contextfold.transcript.store.base import TranscriptStore
from contextfold.wire import ModelOutput, NeutralRequest, RenderedRequest, ToolCall

SESSION = "session-1"
CALL = ToolCall(id="c1", name="add", arguments='{"a": 2, "b": 3}')
RENDERED = RenderedRequest(transport="openai-chat", body=b'{"model":"m"}')
NEUTRAL = NeutralRequest(model="m", system="", messages=())

# One session's worth of loop events, every member of the union at least once: a request
# answered with a tool call, a retried request interrupted, a failed one, a compaction.
SESSION_EVENTS: tuple[LoopEvent, ...] = (
    RequestSent(offset=1, rendered=RENDERED, neutral=NEUTRAL),
    DeltaReceived(offset=1, channel="text", text="adding"),
    ResponseRecorded(
        offset=1,
        output=ModelOutput(
            text="adding",
            tool_calls=(ToolCall(id=CALL.id, name=CALL.name, arguments=CALL.arguments),),
            finish_reason="tool_calls",
        ),
    ),
    ToolStarted(call=CALL),
    ToolFinished(call=CALL, outcome=ToolOutcome(CALL.id, CALL.name, "5")),
    RequestRetried(offset=3),
    RequestSent(offset=3, rendered=RENDERED, neutral=NEUTRAL),
    RequestInterrupted(offset=3, by=4),
    RequestSent(offset=5, rendered=RENDERED, neutral=NEUTRAL),
    RequestFailed(offset=5, error=ConnectionError("provider down")),
    CompactionStarted(offset=1),
    CompactionFinished(offset=1, summary="added 2 and 3"),
    LoopHalted(reason="turn budget spent"),
    LoopCancelled(),
)


@pytest.fixture
async def store() -> AsyncIterator[TranscriptStore]:
    opened = open_transcript_store("memory://")
    await opened.open()
    yield opened
    await opened.close()


def test_the_session_covers_every_loop_event() -> None:
    # A new member of the union must be added here, so the observers below are run on it.
    assert {type(event) for event in SESSION_EVENTS} == set(LOOP_EVENT_TYPES)


@pytest.mark.parametrize("cls", LOOP_EVENT_TYPES, ids=lambda cls: cls.__name__)
def test_each_loop_event_is_frozen_keyword_only_with_its_own_kind(cls: type[Any]) -> None:
    params = cls.__dataclass_params__
    assert params.frozen
    assert all(f.kw_only for f in dataclasses.fields(cls))
    (kind,) = get_args(get_type_hints(cls)["kind"])
    sample = next(event for event in SESSION_EVENTS if type(event) is cls)
    assert sample.kind == kind
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.kind = "other"  # type: ignore[misc, assignment]
    if dataclasses.fields(cls)[1:]:
        with pytest.raises(TypeError):
            cls(*[getattr(sample, f.name) for f in dataclasses.fields(cls)])


def test_the_kinds_are_unique() -> None:
    kinds = [get_args(get_type_hints(cls)["kind"])[0] for cls in LOOP_EVENT_TYPES]
    assert len(set(kinds)) == len(kinds) == len(LOOP_EVENT_TYPES)


async def test_the_transcript_observer_handles_every_loop_event(store: TranscriptStore) -> None:
    writer = TranscriptWriter(store, TranscriptBus())
    rows = TranscriptObserver(writer, SESSION, clock=lambda: "2026-01-01T00:00:00+00:00")
    for event in SESSION_EVENTS:
        await rows.on_event(event)
    assert await store.unfinished(SESSION) == ((), ())
    finishes = {}
    for name in ("request-1", "request-3", "request-5", "summary-1"):
        message = await store.get_message(SESSION, name)
        assert message is not None, name
        finishes[name] = message.finish
    assert finishes == {
        "request-1": "tool-calls",
        "request-3": "interrupted",
        "request-5": "error",
        "summary-1": "stop",
    }


async def test_the_demo_printer_handles_every_loop_event(journal: Journal) -> None:
    out = io.StringIO()
    console = Console(file=out, width=200, color_system=None)
    printer = demo_module._Printer(console, journal, "demo")
    for event in SESSION_EVENTS:
        await printer.on_event(event)
    text = out.getvalue()
    for line in (
        "→ request @1 openai-chat",
        "← answer adding  calls add(",
        "webhook ci/status ← build #1",
        "tool add: 1 chars",
        "interrupted request @3 by @4",
        "compaction summary replaces history through @1",
    ):
        assert line in text, text
    [status] = [e.decode() for e in (await journal.read("demo")).events]
    assert isinstance(status, ContextAdded) and status.key == "ci/status"


async def test_observers_refuse_what_is_not_a_loop_event(
    journal: Journal, store: TranscriptStore
) -> None:
    """An event the union does not name fails loudly (it was silently skipped when events
    were dispatched by name)."""
    writer = TranscriptWriter(store, TranscriptBus())
    rows = TranscriptObserver(writer, SESSION, clock=lambda: "2026-01-01T00:00:00+00:00")
    printer = demo_module._Printer(Console(file=io.StringIO()), journal, "demo")
    stray = cast(LoopEvent, object())
    with pytest.raises(AssertionError):
        await rows.on_event(stray)
    with pytest.raises(AssertionError):
        await printer.on_event(stray)


async def test_observers_tell_each_observer_every_event_in_order() -> None:
    class Recording:
        def __init__(self) -> None:
            self.events: list[LoopEvent] = []

        async def on_event(self, event: LoopEvent) -> None:
            self.events.append(event)

    first, second = Recording(), Recording()
    both = Observers(first, second)
    for event in SESSION_EVENTS:
        await both.on_event(event)
    assert first.events == second.events == list(SESSION_EVENTS)
