"""What one step of the agent loop leaves the next, when the next is certain.

A step whose next step is known (the response it recorded makes calls that will run; the
tools it ran leave a continuation request due) appends what it must with the next step's
first append, and the next step starts from what this one left instead of reading the
journal again:

- :class:`ToolsStarted`: the response was appended with the ``ToolCallStarted`` of its
  first call, which runs in the next step whatever else happens (it is recorded as
  started: the step is under way);
- :class:`RequestDue`: the last tool result is held back (encoded, not appended) and goes
  out in the next request's append; the context and scheduler states include it.

The journal holds the same events in the same order as when each step appends on its own:
a step carries only when the next step would do exactly that first (the same checks, on
the same states), and an append at once lands only at the position it was made for
(:func:`seen_through`, with a version known before the states were read). Within a step,
the request the pressure gate estimated is the one sent, as it rendered it
(:class:`Planned`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from ..context.events import RequestHeader
from ..context.state import AgentContextState
from ..events import Envelope, NewEvent
from ..folds.fold import FoldBase
from ..wire import NeutralRequest, RenderedRequest, ToolCall
from .scheduling import Decision, SchedulerState
from .tool_runs import HeldResult

__all__ = ["Carried", "Planned", "RequestDue", "ToolsStarted", "folded_ahead", "seen_through"]

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class ToolsStarted:
    """The next step runs ``calls``; the first one's start is recorded already."""

    calls: tuple[ToolCall, ...]

    @property
    def recorded(self) -> str:
        return self.calls[0].id


@dataclass(frozen=True, slots=True)
class RequestDue:
    """The next step requests (``decision``) from ``context``; ``held`` is not appended yet:
    it goes first in the request's append, at the position after ``version``, and the
    states include it as folded there."""

    context: AgentContextState
    sched: SchedulerState
    decision: Decision
    held: HeldResult
    version: int


Carried = ToolsStarted | RequestDue


def folded_ahead(
    fold: FoldBase[S], state: S, events: Sequence[NewEvent], stream: str, first: int
) -> S:
    """``state`` with encoded, not yet appended ``events`` folded in as they will read when
    appended at position ``first`` on: decoded from their bytes, as a read folds them."""
    for index, new in enumerate(events):
        event = fold.handler_event(new.type)
        if event is None:
            continue
        payload = event.model_validate_json(new.data)
        # Not stored yet: the global position is the store's to give (no handler reads it).
        state = fold.apply(state, Envelope(payload, new.meta, stream, first + index, 0, new.type))
    return state


def seen_through(context: AgentContextState) -> int:
    """The newest stream position ``context`` shows: its latest request, result record or
    the last item of a lane (a slot settled in place may be newer: then the stream is taken
    to be further than that, and the append at once finds it is not)."""
    newest = [context.request_offset or 0]
    newest += [lane[-1].offset for lane in (context.system, context.history) if lane]
    if context.tool_result is not None:
        newest.append(context.tool_result[0])
    return max(newest)


@dataclass(frozen=True, slots=True)
class Planned:
    """The request the pressure gate estimated, rendered: built from ``context`` with
    ``header`` and timed at ``time``, the time of the request event made before the gate
    (so the estimate is of the body that goes out, and it is rendered once)."""

    context: AgentContextState
    header: RequestHeader
    request: NeutralRequest
    rendered: RenderedRequest
    time: str

    def holds_for(self, folded: AgentContextState) -> bool:
        """Whether ``folded``, the context through the request event, holds what the plan
        was built from: the same lanes (states share unchanged tuples, so nothing was added
        in between), header and time. Then the request and its body are the plan's."""
        # The same header object: the request logged none, as it was equal to the plan's.
        same = folded.header is self.context.header or folded.header == self.header
        return (
            folded.system is self.context.system
            and folded.history is self.context.history
            and same
            and folded.request_time == self.time
        )
