"""Scheduling: which items wake the model, turn budgets, the circuit breaker, birth.

The scheduler's state is itself a fold over the journal, so a restarted agent knows its
pending triggers, unanswered tool calls (and which of them were started) and autonomous
streak without any other store. :func:`decide` is a pure function of that state and the
context state.

Only the runtime's own records move a turn on: a tool call is answered by the
``ToolCallResult`` the runtime wrote for a call still outstanding from the verified
assistant item; a duplicate, an unknown id, another writer's result, or any context item
carrying a ``tool_call_id`` answers nothing (such an item is context like any other of its
role and actor).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..context.events import (
    ContextAdded,
    LlmRequestInterrupted,
    LlmRequestRequested,
    LlmResponse,
    ToolCallResult,
    ToolCallStarted,
)
from ..context.projection import AGENT_WRITER, TOOL_WRITER
from ..context.state import AgentContextState
from ..context.trust import is_external
from ..errors import ConfigurationError
from ..events import Envelope, Event
from ..folds._evolve import construct, evolve
from ..folds.fold import Fold
from ..wire import ToolCall

__all__ = [
    "AGENT",
    "TOOL_WRITER",
    "AgentHalted",
    "Behaviour",
    "Decision",
    "Scheduler",
    "SchedulerState",
    "Trigger",
    "TriggerKind",
    "TurnBudgets",
    "behaviour_of",
    "decide",
    "kind_of",
]

Behaviour = Literal["none", "after-current-request", "interrupt"]
TriggerKind = Literal["user", "integration", "feedback"]
_STRENGTH: dict[str, int] = {"feedback": 0, "integration": 1, "user": 2}


class AgentHalted(Event, type="contextfold.agent/halted", runtime_only=True):
    """The loop stopped itself: ``reason`` is ``"circuit-breaker"`` or ``"turn-budget"``."""

    reason: str
    detail: str = ""


def behaviour_of(item: ContextAdded) -> Behaviour:
    """The item's request policy; by default user items and developer items not written as
    the agent or a tool wake the model (after the current request); system, assistant,
    agent and tool items do not. A ``tool_call_id`` changes nothing: whoever appends an
    item can set it, so the item is judged by its role and actor like any other."""
    if item.llm_request_policy is not None:
        return item.llm_request_policy.behaviour
    if item.compaction is not None:
        return "none"
    if item.role == "user":
        return "after-current-request"
    if item.role == "developer" and not (
        item.actor is not None and item.actor.type in ("agent", "tool")
    ):
        return "after-current-request"
    return "none"


def kind_of(item: ContextAdded, trusted: Collection[str] = ()) -> TriggerKind:
    """Whose turn budget an item spends: a human's, an integration's, or the agent loop's own
    feedback (scripts, tools, agents, the platform). ``trusted``: the extension actor types
    trusted beyond the built-in ones (a request header's ``trusted_actor_types``); pure,
    the live registry is not consulted."""
    if item.role == "user" or (item.actor is not None and item.actor.type == "user"):
        return "user"
    if (
        is_external(item.actor, trusted)
        and item.actor is not None
        and item.actor.type not in ("script", "tool")
    ):
        return "integration"
    return "feedback"


class Trigger(BaseModel):
    model_config = ConfigDict(frozen=True)

    offset: int
    kind: TriggerKind
    behaviour: Behaviour


class SchedulerState(BaseModel):
    """What the loop must do next, derived from the journal."""

    model_config = ConfigDict(frozen=True)

    pending: tuple[Trigger, ...] = ()
    """Waking items after the latest request."""
    last_request: int | None = None
    request_actor: str | None = None
    """The journal meta actor of the latest request: the runtime re-sends only its own."""
    answered: bool = True
    """Whether the latest request got its verified assistant item (or was interrupted)."""
    response_at: int | None = None
    """Position of the agent-written ``LlmResponse`` to the latest, unanswered request: only
    the agent-written assistant item right after it (the same append) answers the request."""
    trusted: tuple[str, ...] = ()
    """The ``trusted_actor_types`` of the latest agent-written request header (a request
    without a header repeats the previous one): how later items are classified. Never the
    live registry, so a warm read and a cold rebuild agree."""
    outstanding: tuple[ToolCall, ...] = ()
    """Tool calls of the latest request's verified assistant item not yet answered by a
    result: the only calls the loop runs (an ``LlmResponse`` is evidence, never a command)."""
    started: tuple[str, ...] = ()
    """Ids of outstanding calls the runtime recorded as started (``ToolCallStarted``): each
    may already have run, so it is not run again silently."""
    continuation: bool = False
    """The latest response asked for tools: once they are answered, the turn goes on."""
    turn_kind: TriggerKind = "user"
    turn_steps: int = 0
    autonomous_streak: int = Field(default=0, ge=0)
    """Requests since the last user or integration trigger."""
    halted: str | None = None
    reports: tuple[LlmResponse, ...] = ()
    """Usage reports (responses without text and calls) of requests after the latest
    compaction cutoff that catch-up compaction may still pick (the newest over the
    threshold): none with at most the input tokens of a newer one of the same model."""


Scheduler: Fold[SchedulerState] = Fold("scheduler", state=SchedulerState, version=6)


AGENT = AGENT_WRITER
"""The journal meta actor the runtime appends with: the only writer whose answers count."""

_TRIGGER_FIELDS = frozenset(Trigger.model_fields)


def _answers(state: SchedulerState, ev: Envelope[ContextAdded]) -> bool:
    """Whether ``ev`` is the answer to the latest, unanswered request: an assistant item the
    agent appended (journal meta, not the payload's self-declared actor) right after the
    agent's ``LlmResponse`` to that request, i.e. in the same append. Anything else, an
    assistant item a token holder appended with any payload actor, answers nothing."""
    item = ev.payload
    return (
        item.role == "assistant"
        and not state.answered
        and state.last_request is not None
        and item.llm_request_offset == state.last_request
        and ev.meta.actor == AGENT
        and state.response_at is not None
        and state.response_at == ev.position - 1
    )


@Scheduler.on(ContextAdded)
def _added(state: SchedulerState, ev: Envelope[ContextAdded]) -> SchedulerState:
    meta = ev.payload.compaction
    if meta is not None and meta.replaces_history_through < ev.position:
        cutoff = meta.replaces_history_through
        reports = tuple(r for r in state.reports if r.request_offset > cutoff)
        state = evolve(state, {"reports": reports})
    if _answers(state, ev):
        calls = ev.payload.tool_calls
        state = evolve(
            state,
            {
                "answered": True,
                "response_at": None,
                "outstanding": calls,
                "started": (),
                "continuation": bool(calls),
            },
        )
    behaviour = behaviour_of(ev.payload)
    if behaviour == "none":
        return state
    kind = kind_of(ev.payload, state.trusted)
    position = ev.position
    if type(position) is int:
        # Every value is one the model keeps as it is (a stored int position, the literals
        # above): made without validating them again.
        values = {"offset": position, "kind": kind, "behaviour": behaviour}
        trigger = construct(Trigger, values, set(_TRIGGER_FIELDS))
    else:  # an envelope made by hand: its position as the model takes it, or its error
        trigger = Trigger(offset=position, kind=kind, behaviour=behaviour)
    halted = state.halted if kind == "feedback" else None
    return evolve(state, {"pending": (*state.pending, trigger), "halted": halted})


@Scheduler.on(LlmRequestRequested)
def _requested(state: SchedulerState, ev: Envelope[LlmRequestRequested]) -> SchedulerState:
    position, pending = ev.position, state.pending
    # Mostly nothing is pending (a request after tool results): no comprehensions then.
    consumed = [t for t in pending if t.offset < position] if pending else []
    if consumed:
        kind = max((t.kind for t in consumed), key=_STRENGTH.__getitem__)
        steps = 1
    else:
        kind, steps = state.turn_kind, state.turn_steps + 1
    human = bool(consumed) and any(t.kind != "feedback" for t in consumed)
    streak = 0 if human else state.autonomous_streak + 1
    header = ev.payload.header
    trusted = state.trusted
    actor = ev.meta.actor
    if header is not None and actor == AGENT:
        trusted = header.trusted_actor_types
    return evolve(
        state,
        {
            "pending": tuple(t for t in pending if t.offset > position) if pending else (),
            "last_request": position,
            "request_actor": actor,
            "answered": False,
            "response_at": None,
            "trusted": trusted,
            "outstanding": (),
            "started": (),
            "continuation": False,
            "turn_kind": kind,
            "turn_steps": steps,
            "autonomous_streak": streak,
        },
    )


@Scheduler.on(LlmResponse)
def _responded(state: SchedulerState, ev: Envelope[LlmResponse]) -> SchedulerState:
    """Note the agent's response to the latest, unanswered request and keep its usage report.
    A response answers nothing and runs nothing by itself: the agent-written assistant item
    right after it (the same append) does (see ``_added``). One another writer appended
    (a second response, a forged webhook event) is ignored, its usage report too."""
    response = ev.payload
    if response.request_offset != state.last_request or state.answered or ev.meta.actor != AGENT:
        return state
    update: dict[str, object] = {"response_at": ev.position}
    usage = response.usage
    if usage is not None:
        report = evolve(response, {"text": "", "tool_calls": ()})
        # Only reports that can still be picked (the newest over its model's threshold):
        # one whose input is at most a newer one's of the same model never is, whatever the
        # threshold, window or cutoff. An earlier report of this request is replaced.
        kept = tuple(
            r
            for r in state.reports
            if r.request_offset != response.request_offset
            and not (r.model == response.model and _input(r) <= usage.input_tokens)
        )
        update["reports"] = (*kept, report)
    return evolve(state, update)


def _input(report: LlmResponse) -> int:
    assert report.usage is not None  # only measured responses are reports
    return report.usage.input_tokens


@Scheduler.on(ToolCallStarted)
def _started(state: SchedulerState, ev: Envelope[ToolCallStarted]) -> SchedulerState:
    """Note that the runtime started an outstanding call (another writer's record, or one
    for a call not outstanding, is ignored)."""
    call_id = ev.payload.tool_call_id
    if (
        ev.meta.actor != AGENT
        or call_id in state.started
        or all(c.id != call_id for c in state.outstanding)
    ):
        return state
    return evolve(state, {"started": (*state.started, call_id)})


@Scheduler.on(ToolCallResult)
def _result(state: SchedulerState, ev: Envelope[ToolCallResult]) -> SchedulerState:
    """Answer an outstanding call with the result the runtime wrote for it. A duplicate, an
    unknown id or another writer's result changes nothing (it does not unblock the turn)."""
    if ev.meta.actor != TOOL_WRITER:
        return state
    call_id = ev.payload.tool_call_id
    left = tuple(c for c in state.outstanding if c.id != call_id)
    if left == state.outstanding:
        return state
    started = tuple(s for s in state.started if s != call_id)
    return evolve(state, {"outstanding": left, "started": started})


@Scheduler.on(LlmRequestInterrupted)
def _interrupted(state: SchedulerState, ev: Envelope[LlmRequestInterrupted]) -> SchedulerState:
    """Seal the latest request. Only the agent's own record counts: another writer cannot
    make the agent drop a request it owes an answer to (it interrupts with an item whose
    ``llm_request_policy`` is ``interrupt``, which the agent acts on and records)."""
    if ev.payload.request_offset != state.last_request or ev.meta.actor != AGENT:
        return state
    return evolve(
        state,
        {
            "answered": True,
            "response_at": None,
            "outstanding": (),
            "started": (),
            "continuation": False,
        },
    )


@Scheduler.on(AgentHalted)
def _halted(state: SchedulerState, ev: Envelope[AgentHalted]) -> SchedulerState:
    return evolve(state, {"halted": ev.payload.reason, "continuation": False, "pending": ()})


@dataclass(frozen=True, slots=True)
class TurnBudgets:
    """Model requests a turn may make, by what started it, and the circuit breaker: the most
    requests in a row with no user or integration input (script and tool results count as
    the agent's own feedback)."""

    user: int = 24
    integration: int = 8
    feedback: int = 4
    breaker: int = 12

    def __post_init__(self) -> None:
        for name in ("user", "integration", "feedback", "breaker"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"TurnBudgets.{name} must be >= 1")

    def of(self, kind: TriggerKind) -> int:
        return int(getattr(self, kind))


@dataclass(frozen=True, slots=True)
class Decision:
    """What the loop does next. ``action``: ``run-tools``, ``request``, ``queued``, ``halt``,
    ``idle``, ``retry`` (a request was appended but never answered: send it again)."""

    action: Literal["run-tools", "request", "queued", "halt", "idle", "retry"]
    reason: str = ""
    kind: TriggerKind | None = None


def decide(sched: SchedulerState, context: AgentContextState, budgets: TurnBudgets) -> Decision:
    """The next step of the loop, from the scheduler and context states (pure)."""
    if sched.last_request is not None and not sched.answered:
        return Decision("retry", f"request @{sched.last_request} has no response")
    if sched.outstanding:
        return Decision("run-tools", f"{len(sched.outstanding)} tool call(s) to answer")
    # Mostly nothing is pending (tool calls or a continuation): no comprehensions then.
    waking = [t for t in sched.pending if t.behaviour != "none"] if sched.pending else []
    human = [t for t in waking if t.kind != "feedback"] if waking else []
    if sched.halted is not None and not human:
        return Decision("idle", f"halted ({sched.halted}) until a user or integration item")
    if waking:
        if not context.has_system_prompt:
            return Decision(
                "queued", "waiting for the agent/system-prompt item (distributed birth)"
            )
        kind = max((t.kind for t in waking), key=_STRENGTH.__getitem__)
        if kind == "feedback" and sched.autonomous_streak >= budgets.breaker:
            return Decision(
                "halt",
                f"circuit breaker: {sched.autonomous_streak} autonomous requests in a row",
                kind,
            )
        return Decision("request", f"{len(waking)} new item(s), {kind}", kind)
    if sched.continuation:
        if sched.autonomous_streak >= budgets.breaker:
            return Decision(
                "halt", f"circuit breaker: {sched.autonomous_streak} autonomous requests in a row"
            )
        if sched.turn_steps >= budgets.of(sched.turn_kind):
            return Decision(
                "halt", f"turn budget: {sched.turn_steps} requests for one {sched.turn_kind} turn"
            )
        return Decision("request", "continuing after tool results", "feedback")
    return Decision("idle", "nothing to do")
