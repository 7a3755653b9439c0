"""The worked example: a coding assistant whose conversation is a segmented fold.

A model agent reads :data:`Conversation` on every step, trims it with :func:`chat_view`
and renders it with :func:`to_messages`; a tools agent answers each :class:`ModelStep`
with one :class:`ToolResult` per call, then :class:`ToolsDone`. A segment is one atomic
unit (a prompt, a model step with all of its tool results, an answer), so a view never
separates a tool call from its result, and the rendered request answers every call.

Use it as a fixture in your own tests, or copy it as the start of your own fold::

    from contextfold.examples import coding_assistant as ca

    state = await journal.fold(ca.Conversation, "session-1")
    chat = ca.chat_view()(state, budget=30_000)
    messages = ca.to_messages(chat.state)

Event types are named under ``contextfold.examples/coding-assistant/``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field

import contextfold as cf
from contextfold.folds.segmented import OnMissing

__all__ = [
    "NO_RESULT",
    "AnswerEntry",
    "AssistantMessage",
    "Conversation",
    "ConversationState",
    "Entry",
    "EntryData",
    "Message",
    "ModelStep",
    "ResultEntry",
    "StepEntry",
    "ToolCall",
    "ToolResult",
    "ToolsDone",
    "UserEntry",
    "UserPrompt",
    "chat_view",
    "conversation_fold",
    "elide_outputs",
    "request_tokens",
    "segment_messages",
    "segment_tokens",
    "summarize_in_chunks",
    "summary_message",
    "summary_tokens",
    "to_messages",
]

_TYPE = "contextfold.examples/coding-assistant"

# --- Events ---------------------------------------------------------------------------------


class ToolCall(BaseModel):
    """One tool call a model step asks for."""

    model_config = ConfigDict(frozen=True)
    id: str
    """The call's id; its result names it as ``call_id``."""
    name: str
    """The tool to run."""
    arguments: str
    """The arguments as the JSON text the model wrote."""


class UserPrompt(cf.Event, type=f"{_TYPE}/user-prompt"):
    """The user's request: opens a turn."""

    text: str


class ModelStep(cf.Event, type=f"{_TYPE}/model-step"):
    """A model reply that calls tools; its results follow as :class:`ToolResult`."""

    step_id: str
    """Unique per step: the segment's id, which each result names."""
    text: str
    tool_calls: tuple[ToolCall, ...]


class ToolResult(cf.Event, type=f"{_TYPE}/tool-result"):
    """The output of one tool call of step ``step_id``."""

    step_id: str
    call_id: str
    output: str


class ToolsDone(cf.Event, type=f"{_TYPE}/tools-done"):
    """Every result of step ``step_id`` is in: the model's next step may run."""

    step_id: str


class AssistantMessage(cf.Event, type=f"{_TYPE}/assistant-message"):
    """The final answer of a turn: a model reply without tool calls."""

    text: str


# --- Segment data: a prompt, a model step with its tool results, or a final answer ----------


class UserEntry(BaseModel):
    """A user's prompt."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["user"] = "user"
    text: str


class ResultEntry(BaseModel):
    """The output of one tool call."""

    model_config = ConfigDict(frozen=True)
    call_id: str
    output: str


class StepEntry(BaseModel):
    """A model step and the results of its tool calls that have arrived so far."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["step"] = "step"
    text: str
    tool_calls: tuple[ToolCall, ...]
    results: tuple[ResultEntry, ...] = ()


class AnswerEntry(BaseModel):
    """A final answer."""

    model_config = ConfigDict(frozen=True)
    kind: Literal["answer"] = "answer"
    text: str


EntryData: TypeAlias = UserEntry | StepEntry | AnswerEntry
"""The data of one segment."""
Entry: TypeAlias = Annotated[EntryData, Field(discriminator="kind")]
"""The data schema of the fold: :data:`EntryData`, told apart by ``kind``."""
ConversationState: TypeAlias = cf.SegmentedState[EntryData, str]
"""The fold's state: a summary (what a compaction wrote) and the segments after it."""

# --- The fold ---------------------------------------------------------------------------------


def _turn_id(kind: str, ev: cf.Envelope[Any]) -> str:
    # One prompt and one answer per run, as the agent loop has it; outside a run the
    # stream position keeps the id unique.
    run_id = ev.meta.run_id
    return f"{kind}:{run_id}" if run_id is not None else f"{kind}:@{ev.position}"


def conversation_fold(
    name: str = "conversation", *, on_missing: OnMissing = "ignore"
) -> cf.SegmentedFold:
    """A new conversation fold: segments ``prompt:<run id>``, ``<step id>`` and
    ``answer:<run id>`` (``@<position>`` in place of the run id for events of no run).

    A :class:`ToolResult` attaches to the newest step with its ``step_id``; with no such
    step it is ignored by default (a late result of a step a compaction summarized away is
    expected) or reported with ``on_missing="report"``. Use :data:`Conversation`; build
    another only for a variant, under a name of its own (two folds of one name and version
    that take checkpoints would restore each other's).
    """
    fold = cf.SegmentedFold(name, data=Entry, summary=str, tag="kind")

    @fold.open(UserPrompt)
    def _prompt(ev: cf.Envelope[UserPrompt]) -> cf.Segment[UserEntry]:
        return cf.Segment(_turn_id("prompt", ev), UserEntry(text=ev.payload.text))

    @fold.open(ModelStep)
    def _step(ev: cf.Envelope[ModelStep]) -> cf.Segment[StepEntry]:
        data = StepEntry(text=ev.payload.text, tool_calls=ev.payload.tool_calls)
        return cf.Segment(ev.payload.step_id, data)

    @fold.attach(ToolResult, kind="step", to=lambda ev: ev.payload.step_id, on_missing=on_missing)
    def _result(step: StepEntry, ev: cf.Envelope[ToolResult]) -> StepEntry:
        result = ResultEntry(call_id=ev.payload.call_id, output=ev.payload.output)
        # A new entry rather than model_copy: validated, and cheaper (one attach per result).
        return StepEntry(
            text=step.text, tool_calls=step.tool_calls, results=(*step.results, result)
        )

    @fold.open(AssistantMessage)
    def _answer(ev: cf.Envelope[AssistantMessage]) -> cf.Segment[AnswerEntry]:
        return cf.Segment(_turn_id("answer", ev), AnswerEntry(text=ev.payload.text))

    return fold


Conversation = conversation_fold()
"""The conversation fold: define it once and share this object (it identifies the cache)."""

# --- Rendering for a chat API -----------------------------------------------------------------

Message: TypeAlias = dict[str, Any]
"""One chat message, in the OpenAI chat format."""
NO_RESULT = "No result: the turn was interrupted."
"""What a tool message says for a call whose result never came."""


def summary_message(summary: str) -> Message:
    """The message that carries the summary of what came before: a user message, never
    system, since a faithful summary can quote untrusted tool output and must not gain
    instruction precedence from it."""
    return {"role": "user", "content": f"Earlier in this conversation: {summary}"}


def segment_messages(data: EntryData) -> list[Message]:
    """The messages of one segment. A step renders as its assistant message with its tool
    calls, each followed by its tool message (:data:`NO_RESULT` when missing)."""
    if isinstance(data, UserEntry):
        return [{"role": "user", "content": data.text}]
    if isinstance(data, AnswerEntry):
        return [{"role": "assistant", "content": data.text}]
    messages: list[Message] = [
        {
            "role": "assistant",
            "content": data.text,
            "tool_calls": [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in data.tool_calls
            ],
        }
    ]
    for call in data.tool_calls:
        result = next((r for r in data.results if r.call_id == call.id), None)
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call.id,
                "content": result.output if result else NO_RESULT,
            }
        )
    return messages


def to_messages(state: ConversationState) -> list[Message]:
    """The state as chat messages: the summary first (when there is one), then each
    segment's. Every tool call is answered, right after its assistant message."""
    messages = [summary_message(state.summary)] if state.summary is not None else []
    for segment in state.segments:
        messages.extend(segment_messages(segment.data))
    return messages


def request_tokens(messages: Sequence[Message]) -> int:
    """Tokens of a request, message by message (:func:`contextfold.approx_tokens`)."""
    return sum(cf.approx_tokens(m) for m in messages)


def segment_tokens(segment: cf.Segment[EntryData]) -> int:
    """Tokens of a segment as :func:`to_messages` renders it: a view ``count``."""
    return request_tokens(segment_messages(segment.data))


def summary_tokens(summary: str) -> int:
    """Tokens of the summary as rendered: a view ``count_summary``."""
    return request_tokens([summary_message(summary)])


# --- The view ---------------------------------------------------------------------------------


def elide_outputs(data: EntryData) -> EntryData:
    """A step with each tool output over 200 characters cut to its first 200 and marked
    ``… [elided]``; any other data as it is."""
    if not isinstance(data, StepEntry):
        return data
    results = tuple(
        r.model_copy(update={"output": f"{r.output[:200]}… [elided]"}) if len(r.output) > 200 else r
        for r in data.results
    )
    return data.model_copy(update={"results": results})


def chat_view(
    *,
    count: Callable[[cf.Segment[Any]], float] | None = None,
    count_summary: Callable[[Any], float] | None = None,
) -> cf.ContextView[cf.SegmentedState[Any, Any]]:
    """The chat view of :data:`Conversation`: over budget, it first elides the tool outputs
    of all but the newest four segments, then drops whole segments, oldest first, but never
    the current turn (from the newest prompt on).

    ``count`` and ``count_summary`` size a segment and the summary (default
    :func:`contextfold.approx_tokens` of each); pass :func:`segment_tokens` and
    :func:`summary_tokens` to count what :func:`to_messages` sends.
    """
    return cf.ContextView(
        Conversation,
        count=count,
        count_summary=count_summary,
        strategies=[
            cf.elide(keep_newest=4, map=elide_outputs),
            cf.drop_oldest(keep_from=cf.from_newest(Conversation, "user")),
        ],
    )


# --- Chunked summaries ------------------------------------------------------------------------


async def summarize_in_chunks(
    summarize: Callable[[list[Message]], str | Awaitable[str]],
    *,
    view: cf.ContextView[Any],
    summary: str | None,
    older: Sequence[cf.Segment[Any]],
    tokens: float,
) -> str | None:
    """The summary of ``summary`` and ``older``, written by ``summarize`` (sync or async)
    in one request per chunk of at most ``tokens`` of segments (as ``view`` counts them, one
    segment at least; :func:`contextfold.chunks_of`), oldest first. Each request renders
    (:func:`to_messages`) the summary written so far and one chunk, so leave room for the
    summary in ``tokens``.

    A compaction's ``older`` comes with its tool outputs in full, often more than a budget:
    this keeps every request within one. Returns ``summary`` when ``older`` is empty;
    raises ValueError when ``tokens`` is not a positive number.
    """
    written = summary
    for chunk in cf.chunks_of(older, tokens, count=view.count):
        reply = summarize(to_messages(cf.SegmentedState(chunk, written)))
        written = reply if isinstance(reply, str) else await reply
    return written
