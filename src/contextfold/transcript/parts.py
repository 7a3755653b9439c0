"""Message and Part rows: the transcript a UI shows and the next turn is rebuilt from.

A :class:`Message` is the envelope (role, parent link, model, finish state); its body is
a sequence of :class:`Part` rows, one model per kind, told apart by the ``kind`` tag.
Every row is a frozen pydantic model; times are ISO-8601 strings given by the caller
(nothing here reads a clock). Writing a row with the id of an existing one overwrites it.

A row is *unfinished* while its block is still streaming: a message without ``completed``,
a text or reasoning part that has a ``start`` but no ``end``, a tool part in state pending
or running.
:func:`close_message` and :func:`close_part` finish such rows after a crash; they are pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from ..wire import Usage

__all__ = [
    "INTERRUPTED",
    "PART_TYPES",
    "AgentPart",
    "CompactionPart",
    "FilePart",
    "Message",
    "MessageWithParts",
    "Part",
    "PartKind",
    "PatchPart",
    "ReasoningPart",
    "Role",
    "StepFinishPart",
    "StepStartPart",
    "SubtaskPart",
    "TextPart",
    "ToolPart",
    "ToolState",
    "close_message",
    "close_part",
    "decode_part",
    "is_unfinished",
]

Role = Literal["user", "assistant"]
ToolState = Literal["pending", "running", "completed", "error"]
PartKind = Literal[
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
]

INTERRUPTED = "interrupted"
"""The finish reason and tool error cleanup writes into rows a dead process left open."""

_INTERRUPTED_MESSAGE = "interrupted: the process stopped before this message finished"


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)


class Message(_Row):
    """One user or assistant message: the envelope of its parts."""

    id: str = Field(min_length=1)
    """Unique id of the message within its session."""
    session: str = Field(min_length=1)
    """The session (conversation) the message belongs to."""
    role: Role
    """``user`` or ``assistant``."""
    created: str
    """ISO-8601 time the message was started, given by the caller."""
    parent_id: str | None = None
    """For an assistant message: the user message it answers."""
    model: str | None = None
    """The model that produced an assistant message (e.g. ``"anthropic/claude-sonnet"``)."""
    summary: bool = False
    """True for an assistant message that summarises the history before it (compaction)."""
    finish: str | None = None
    """Why the message ended (``"stop"``, ``"tool-calls"``, ``"length"``, ``"interrupted"``…)."""
    error: str | None = None
    """What went wrong, when the message ended in an error; None for a success."""
    completed: str | None = None
    """ISO-8601 time the message finished; None while it is still streaming."""

    @property
    def succeeded(self) -> bool:
        """Finished without an error (an interrupted message did not succeed)."""
        return self.completed is not None and self.error is None and self.finish != INTERRUPTED


class _PartBase(_Row):
    id: str = Field(min_length=1)
    """Unique id of the part within its session."""
    session: str = Field(min_length=1)
    """The session of the message holding the part."""
    message_id: str = Field(min_length=1)
    """The message holding the part."""


class TextPart(_PartBase):
    """Natural-language text of a message (synthetic prompts included)."""

    kind: Literal["text"] = "text"
    text: str = ""
    """The text; empty while streaming (the deltas travel on the bus only)."""
    synthetic: bool = False
    """True for text the system wrote on the user's behalf (not typed by a person)."""
    start: str | None = None
    """ISO-8601 time the block started streaming; None for text written whole."""
    end: str | None = None
    """ISO-8601 time the block ended; None while it streams (or when it never streamed)."""


class ReasoningPart(_PartBase):
    """Reasoning text the model emitted before answering."""

    kind: Literal["reasoning"] = "reasoning"
    text: str = ""
    """The reasoning; empty while streaming (the deltas travel on the bus only)."""
    start: str | None = None
    """ISO-8601 time the block started streaming; None for text written whole."""
    end: str | None = None
    """ISO-8601 time the block ended; None while it streams (or when it never streamed)."""


class ToolPart(_PartBase):
    """One tool call and its progress: pending → running → completed or error.

    States only move forward, and ``completed`` and ``error`` are final (the projector
    refuses any other move: :func:`~contextfold.transcript.projector.project`).
    """

    kind: Literal["tool"] = "tool"
    call_id: str
    """The provider's id of the tool call (pairs the call with its result)."""
    tool: str
    """The tool's name."""
    state: ToolState = "pending"
    """``pending`` (arguments streaming), ``running``, ``completed`` or ``error``."""
    input: Mapping[str, Any] = Field(default_factory=dict)
    """The call's arguments (JSON); empty until they are complete."""
    output: str | None = None
    """The result, once ``completed``."""
    error: str | None = None
    """What went wrong, in state ``error``."""
    title: str | None = None
    """A short human title of the call for UIs."""
    start: str | None = None
    """ISO-8601 time the call started running."""
    end: str | None = None
    """ISO-8601 time the call completed or failed."""


class FilePart(_PartBase):
    """An attached file."""

    kind: Literal["file"] = "file"
    mime: str
    """Its media type (``"image/png"``)."""
    url: str
    """Where its content is (``file://``, ``https://`` or a ``data:`` URL)."""
    filename: str | None = None
    """The file's name for display."""


class AgentPart(_PartBase):
    """An ``@agent`` reference in a user message."""

    kind: Literal["agent"] = "agent"
    name: str
    """The referenced agent's name."""


class CompactionPart(_PartBase):
    """Marks the user message that asked for a compaction of the history before it."""

    kind: Literal["compaction"] = "compaction"
    auto: bool = False
    """True when the runtime started the compaction (context full), False when a user asked."""
    tail_start_id: str | None = Field(default=None, min_length=1)
    """The oldest message the summary does not replace: it and the messages after it, up to
    this one, stay visible behind the summary (the retained tail). None: no tail."""


class SubtaskPart(_PartBase):
    """A subtask handed to another agent."""

    kind: Literal["subtask"] = "subtask"
    agent: str
    """The agent doing the subtask."""
    prompt: str
    """What it was asked to do."""
    description: str = ""
    """A short description for UIs."""


class StepStartPart(_PartBase):
    """Start of one model step (one provider request)."""

    kind: Literal["step-start"] = "step-start"
    time: str
    """ISO-8601 time the step started."""
    snapshot: str | None = None
    """Id of the workspace snapshot taken before the step, if any."""


_LEGACY_USAGE = {
    "input": "input_tokens",
    "output": "output_tokens",
    "reasoning": "reasoning_tokens",
    "cache_read": "cached_input_tokens",
    "cache_write": "cache_write_tokens",
}


class StepFinishPart(_PartBase):
    """End of one model step: the billing and troubleshooting anchor."""

    kind: Literal["step-finish"] = "step-finish"
    time: str
    """ISO-8601 time the step finished."""
    reason: str
    """Why the step ended (``"stop"``, ``"tool-calls"``, ``"length"``…)."""
    usage: Usage | None = Field(default_factory=Usage)
    """Tokens the step used, as the model call reported them (``contextfold.wire.Usage``);
    None when the model's server reported none."""
    cost: float = Field(default=0.0, ge=0)
    """What the step cost, in US dollars."""
    snapshot: str | None = None
    """Id of the workspace snapshot taken after the step, if any."""

    @field_validator("usage", mode="before")
    @classmethod
    def _legacy_usage(cls, value: Any) -> Any:
        # Rows written before the transcript used the wire model's usage: the same counts
        # under the old names (their ``input`` already held the whole prompt).
        if isinstance(value, Mapping) and not _LEGACY_USAGE.keys().isdisjoint(value):
            return {_LEGACY_USAGE.get(name, name): count for name, count in value.items()}
        return value

    @field_validator("cost")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError(f"cost must be a finite number, got {value!r}")
        return value


class PatchPart(_PartBase):
    """Summary of the files one step changed."""

    kind: Literal["patch"] = "patch"
    hash: str
    """Id of the snapshot the changes are relative to."""
    files: tuple[str, ...] = ()
    """Paths of the changed files."""


Part = Annotated[
    TextPart
    | ReasoningPart
    | ToolPart
    | FilePart
    | AgentPart
    | CompactionPart
    | SubtaskPart
    | StepStartPart
    | StepFinishPart
    | PatchPart,
    Field(discriminator="kind"),
]
"""Any part row, told apart by its ``kind``."""

PART_TYPES: tuple[type[_PartBase], ...] = (
    TextPart,
    ReasoningPart,
    ToolPart,
    FilePart,
    AgentPart,
    CompactionPart,
    SubtaskPart,
    StepStartPart,
    StepFinishPart,
    PatchPart,
)
"""Every part class, for ``isinstance`` checks."""

_PART: TypeAdapter[Part] = TypeAdapter(Part)


def decode_part(data: bytes | str | Mapping[str, Any]) -> Part:
    """A part row from its JSON (bytes, text or decoded). Raises pydantic's ValidationError."""
    if isinstance(data, Mapping):
        return _PART.validate_python(data)
    return _PART.validate_json(data)


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageWithParts:
    """A message and its parts in the order they were created."""

    message: Message
    parts: tuple[Part, ...] = ()


def is_unfinished(row: Message | Part) -> bool:
    """Whether the row is still streaming (see the module docstring)."""
    if isinstance(row, Message):
        return row.completed is None
    if isinstance(row, (TextPart, ReasoningPart)):
        return row.start is not None and row.end is None
    if isinstance(row, ToolPart):
        return row.state in ("pending", "running")
    return False


def close_part(part: Part, *, now: str, confirmed: str | None = None) -> Part:
    """The part finished as it stands: text and reasoning end with ``confirmed`` text (the
    writer's buffer, when known) or their stored text, trailing whitespace trimmed; a pending
    or running tool becomes an ``error`` "interrupted". A finished part is returned as is."""
    if not is_unfinished(part):
        return part
    if isinstance(part, (TextPart, ReasoningPart)):
        text = part.text if confirmed is None else confirmed
        return part.model_copy(update={"text": text.rstrip(), "end": now})
    if isinstance(part, ToolPart):
        return part.model_copy(update={"state": "error", "error": INTERRUPTED, "end": now})
    return part  # pragma: no cover - only the kinds above can be unfinished


def close_message(message: Message, *, now: str) -> Message:
    """The message finished with ``finish="interrupted"`` (and an error saying why)."""
    if not is_unfinished(message):
        return message
    return message.model_copy(
        update={
            "completed": now,
            "finish": INTERRUPTED,
            "error": message.error or _INTERRUPTED_MESSAGE,
        }
    )
