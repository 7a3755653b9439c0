"""The stream vocabulary the agent runtime emits while a model answers.

Each class is a journal :class:`~contextfold.events.Event` named
``contextfold.transcript/<name>``. The runtime hands them to a
:class:`~contextfold.transcript.writer.TranscriptWriter`, which applies the persistence
policy of seed 001:

========================================  ===========================================
event                                     what is written
========================================  ===========================================
message-started, message-finished         the full message row
text-start / reasoning-start              a new empty part row
text-delta / reasoning-delta              nothing: the bus only (``DELTA_EVENTS``)
text-end / reasoning-end                  the full part row, text trailing-trimmed
tool-input-delta                          nothing, not even the bus (``DROPPED_EVENTS``)
tool-state (pending/running/completed/
error), step-start, step-finish, patch,
compaction, part-added                    the full part row
========================================  ===========================================

Only the boundary events (``BOUNDARY_EVENTS``) are durable: they are what a journal holds
and what :mod:`~contextfold.transcript.projector` folds into rows. Deltas are not journal
events in practice; they are classes here so one vocabulary covers the whole stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, Field

from ..events import Event
from ..wire import Usage
from .parts import Part, Role, ToolState

__all__ = [
    "BOUNDARY_EVENTS",
    "DELTA_EVENTS",
    "DROPPED_EVENTS",
    "CompactionRequested",
    "MessageFinished",
    "MessageStarted",
    "PartAdded",
    "PatchRecorded",
    "ReasoningDelta",
    "ReasoningEnd",
    "ReasoningStart",
    "StepFinished",
    "StepStarted",
    "StreamEvent",
    "TextDelta",
    "TextEnd",
    "TextStart",
    "ToolInputDelta",
    "ToolStateChanged",
]

_NS = "contextfold.transcript/"


class StreamEvent(Event):
    """Base of the transcript vocabulary: every event names its session and message."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    session: str = Field(min_length=1)
    """The session the message belongs to."""
    message_id: str = Field(min_length=1)
    """The message the event is about."""


class MessageStarted(StreamEvent, type=_NS + "message-started"):
    """A message begins; its row is written (unfinished)."""

    role: Role
    time: str
    """ISO-8601 time it started."""
    parent_id: str | None = None
    model: str | None = None
    summary: bool = False


class MessageFinished(StreamEvent, type=_NS + "message-finished"):
    """A message ends; its row is rewritten with finish, error and completion time."""

    time: str
    finish: str | None = None
    error: str | None = None


class TextStart(StreamEvent, type=_NS + "text-start"):
    """A text block begins: an empty text part row is written."""

    part_id: str = Field(min_length=1)
    time: str
    synthetic: bool = False


class TextDelta(StreamEvent, type=_NS + "text-delta"):
    """A fragment of a text block: broadcast on the bus, never written."""

    part_id: str = Field(min_length=1)
    delta: str


class TextEnd(StreamEvent, type=_NS + "text-end"):
    """A text block ends: the part row is written with its whole text, trailing-trimmed.

    ``text`` is None when the runtime sends it: the writer fills in the text it joined
    from the deltas, and that settled event is what a journal stores.
    """

    part_id: str = Field(min_length=1)
    time: str
    text: str | None = None


class ReasoningStart(StreamEvent, type=_NS + "reasoning-start"):
    """A reasoning block begins: an empty reasoning part row is written."""

    part_id: str = Field(min_length=1)
    time: str


class ReasoningDelta(StreamEvent, type=_NS + "reasoning-delta"):
    """A fragment of a reasoning block: broadcast on the bus, never written."""

    part_id: str = Field(min_length=1)
    delta: str


class ReasoningEnd(StreamEvent, type=_NS + "reasoning-end"):
    """A reasoning block ends (see :class:`TextEnd` for ``text``)."""

    part_id: str = Field(min_length=1)
    time: str
    text: str | None = None


class ToolInputDelta(StreamEvent, type=_NS + "tool-input-delta"):
    """A fragment of a tool call's arguments: neither written nor broadcast."""

    part_id: str = Field(min_length=1)
    delta: str


class ToolStateChanged(StreamEvent, type=_NS + "tool-state"):
    """A tool call moved to ``state``: the whole tool part row is written each time.

    Only pending → running → completed | error: a move back, or any move after
    ``completed`` or ``error``, is refused and writes nothing.
    """

    part_id: str = Field(min_length=1)
    call_id: str
    tool: str
    state: ToolState
    time: str
    input: Mapping[str, Any] = Field(default_factory=dict)
    output: str | None = None
    error: str | None = None
    title: str | None = None


class StepStarted(StreamEvent, type=_NS + "step-start"):
    """A model step begins: a step-start row, apart from the step's step-finish row (their
    part ids must differ)."""

    part_id: str = Field(min_length=1)
    time: str
    snapshot: str | None = None


class StepFinished(StreamEvent, type=_NS + "step-finish"):
    """A model step ends, with the tokens it used and what it cost."""

    part_id: str = Field(min_length=1)
    time: str
    reason: str
    usage: Usage | None = Field(default_factory=Usage)
    """None: the model's server reported none."""
    cost: float = Field(default=0.0, ge=0, allow_inf_nan=False)
    snapshot: str | None = None


class PatchRecorded(StreamEvent, type=_NS + "patch"):
    """The files a step changed."""

    part_id: str = Field(min_length=1)
    hash: str
    files: tuple[str, ...] = ()


class CompactionRequested(StreamEvent, type=_NS + "compaction"):
    """A user message asks for the history before it to be compacted."""

    part_id: str = Field(min_length=1)
    auto: bool = False
    tail_start_id: str | None = Field(default=None, min_length=1)
    """The oldest message the summary leaves visible (see ``CompactionPart``)."""


class PartAdded(StreamEvent, type=_NS + "part-added"):
    """A part that is complete when it appears (a prompt's text, a file, an agent, a subtask)."""

    part: Part


DELTA_EVENTS: tuple[type[StreamEvent], ...] = (TextDelta, ReasoningDelta)
"""Broadcast on the bus only."""
DROPPED_EVENTS: tuple[type[StreamEvent], ...] = (ToolInputDelta,)
"""Kept in the vocabulary but not applied: neither written nor broadcast."""
BOUNDARY_EVENTS: tuple[type[StreamEvent], ...] = (
    MessageStarted,
    MessageFinished,
    TextStart,
    TextEnd,
    ReasoningStart,
    ReasoningEnd,
    ToolStateChanged,
    StepStarted,
    StepFinished,
    PatchRecorded,
    CompactionRequested,
    PartAdded,
)
"""Written as rows (and durable in a journal)."""
