"""Rows, the stream vocabulary, and the public surface of contextfold.transcript."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
from pydantic import BaseModel, ValidationError

import contextfold.transcript as transcript
from contextfold.errors import InvalidInputError
from contextfold.events import event_class
from contextfold.transcript import (
    INTERRUPTED,
    AgentPart,
    CompactionPart,
    FilePart,
    Message,
    Part,
    PatchPart,
    ReasoningPart,
    StepFinishPart,
    StepStartPart,
    SubtaskPart,
    TextDelta,
    TextEnd,
    TextPart,
    ToolPart,
    close_message,
    close_part,
    is_unfinished,
    project,
)
from contextfold.transcript.parts import PART_TYPES, decode_part
from contextfold.transcript.stream import BOUNDARY_EVENTS, DELTA_EVENTS, DROPPED_EVENTS

IDS = {"session": "s", "message_id": "m"}
ONE_OF_EACH: list[Part] = [
    TextPart(id="1", **IDS, text="hi", synthetic=True),
    ReasoningPart(id="2", **IDS, text="hmm", start="t", end="t"),
    ToolPart(
        id="3", **IDS, call_id="c", tool="sh", state="completed", input={"a": [1]}, output="ok"
    ),
    FilePart(id="4", **IDS, mime="text/plain", url="file:///a.txt", filename="a.txt"),
    AgentPart(id="5", **IDS, name="reviewer"),
    CompactionPart(id="6", **IDS, auto=True),
    SubtaskPart(id="7", **IDS, agent="explore", prompt="find it", description="search"),
    StepStartPart(id="8", **IDS, time="t", snapshot="abc"),
    StepFinishPart(id="9", **IDS, time="t", reason="stop", cost=0.25),
    PatchPart(id="10", **IDS, hash="abc", files=("a.py", "b.py")),
]


def test_every_part_kind_round_trips_through_json() -> None:
    assert {p.kind for p in ONE_OF_EACH} == {
        "text",
        "reasoning",
        "tool",
        "file",
        "agent",
        "compaction",
        "subtask",
        "step-start",
        "step-finish",
        "patch",
    }
    assert {type(p) for p in ONE_OF_EACH} == set(PART_TYPES)
    for part in ONE_OF_EACH:
        assert decode_part(part.model_dump_json()) == part
        assert decode_part(part.model_dump(mode="json")) == part


def test_rows_are_frozen_and_strict() -> None:
    part = TextPart(id="1", **IDS, text="hi")
    with pytest.raises(ValidationError):
        part.text = "changed"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        TextPart(id="x", **IDS, colour="red")  # type: ignore[call-arg]
    with pytest.raises(ValidationError):
        StepFinishPart(id="x", **IDS, time="t", reason="stop", cost=float("nan"))
    with pytest.raises(ValidationError):
        Message(id="", session="s", role="user", created="t")
    with pytest.raises(ValidationError):
        Message(id="m", session="s", role="system", created="t")


def test_every_row_field_has_a_docstring() -> None:
    classes: tuple[type[BaseModel], ...] = (Message, *PART_TYPES)
    for cls in classes:
        for name, info in cls.model_fields.items():
            if name != "kind":
                assert info.description, f"{cls.__name__}.{name} has no docstring"


def test_what_counts_as_unfinished_and_how_it_closes() -> None:
    streaming = TextPart(id="t", **IDS, text="so far ", start="t1")
    whole = TextPart(id="w", **IDS, text="written whole")
    running = ToolPart(id="c", **IDS, call_id="c", tool="sh", state="running", input={"x": 1})
    assert is_unfinished(streaming) and is_unfinished(running)
    assert not is_unfinished(whole) and not any(is_unfinished(p) for p in ONE_OF_EACH)

    assert close_part(streaming, now="t9") == streaming.model_copy(
        update={"text": "so far", "end": "t9"}
    )
    assert close_part(streaming, now="t9", confirmed="more text\n").text == "more text"  # type: ignore[union-attr]
    closed = close_part(running, now="t9")
    assert isinstance(closed, ToolPart)
    assert (closed.state, closed.error, closed.end, closed.input) == (
        "error",
        INTERRUPTED,
        "t9",
        {"x": 1},
    )
    assert close_part(whole, now="t9") is whole

    open_message = Message(id="m", session="s", role="assistant", created="t0")
    done = close_message(open_message, now="t9")
    assert (done.finish, done.completed) == (INTERRUPTED, "t9") and done.error
    assert not done.succeeded and close_message(done, now="t10") is done


def test_the_vocabulary_is_registered_and_classified() -> None:
    every = (*BOUNDARY_EVENTS, *DELTA_EVENTS, *DROPPED_EVENTS)
    assert len({cls.event_type for cls in every}) == len(every) == 15
    for cls in every:
        assert cls.event_type.startswith("contextfold.transcript/")
        assert event_class(cls.event_type) is cls
    with pytest.raises(InvalidInputError, match="writes no row"):
        project(TextDelta(**IDS, part_id="p", delta="x"), None)
    end = TextEnd(**IDS, part_id="p", time="t", text="x")
    assert TextEnd.model_validate_json(end.to_json()) == end


def test_all_is_sorted_complete_and_importable() -> None:
    assert transcript.__all__ == sorted(transcript.__all__, key=lambda n: (not n.isupper(), n))
    for name in transcript.__all__:
        assert hasattr(transcript, name), name
    for info in pkgutil.iter_modules(transcript.__path__):
        module = importlib.import_module(f"contextfold.transcript.{info.name}")
        names = module.__all__
        assert len(names) == len(set(names)), info.name
        for name in names:
            assert hasattr(module, name), f"{info.name}.{name}"
            public = getattr(transcript, name, None)
            assert public is None or public is getattr(module, name)
