"""The projection: pure reducers from context events to :class:`AgentContextState`.

Keyed slots and the publication boundary (one slot per key per lane):

1. the first occurrence of a key creates a slot at the end of its lane;
2. updates before the next request replace the slot in place (its lane position and
   its ``updates`` stay; offset and value are the new event's);
3. ``LlmRequestRequested`` at offset R publishes everything through R;
4. the next update of a published key appends a new occurrence with ``updates`` set to
   the published occurrence's offset; further updates before a request coalesce into it.

Unkeyed items always append. A compaction summary is handed to
:func:`contextfold.context.compaction.apply_compaction`.

Tool results: an item is a verified result (``ContextItem.verified_result``) only when the
event just before it is a ``ToolCallResult`` with the same ``tool_call_id``, which is how
the runtime appends a result (both in one append). Any other item claiming a call id is
content, so an item appended ahead of the real result cannot take its place. The fold
remembers only the latest unfollowed ``ToolCallResult`` (position and id), nothing more.

``AgentContext`` is the ready fold; the ``reduce_*`` functions are the same handlers as
plain functions. They run once per event of every read and append, so each makes its new
item and state once, from values valid already (the payload's, the state's). Its cold
reads start from the newest materialization the runtime stored
(:mod:`~contextfold.context.materialized`) and fold only the events after its cursor.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from typing import Any

from ..events import Envelope
from ..folds._evolve import construct, evolve
from ..folds.fold import Fold
from ..store.base import Store
from .compaction import apply_compaction
from .events import ContextAdded, LlmRequestRequested, ToolCallResult
from .materialized import load_materialized
from .state import AGENT_WRITER, TOOL_WRITER, AgentContextState, ContextItem
from .trust import is_trusted

__all__ = [
    "AGENT_WRITER",
    "TOOL_WRITER",
    "AgentContext",
    "fold_context",
    "reduce_context_added",
    "reduce_request",
    "reduce_tool_result",
]


class _ContextFold(Fold[AgentContextState]):
    """The agent context fold: a cold read starts from its newest materialization
    (:mod:`contextfold.context.materialized`), which equals the fold of the events through
    its cursor, and folds only the events after it."""

    async def restore(
        self, store: Store, namespace: str, stream: str
    ) -> tuple[AgentContextState, str | None] | None:
        return await load_materialized(self, store, namespace, stream)


AgentContext: Fold[AgentContextState] = _ContextFold(
    "agent_context",
    state=AgentContextState,
    initial=AgentContextState,
    version=1,
    # It compacts by cutoff (a summary item), never by checkpoint: request rebuilds fold the
    # events alone, so a live request read from a state replaced by hand could differ from
    # its rebuild. A materialization is no such replacement: it is the fold itself, stored.
    checkpoints=False,
    compacted_by=(
        "cf.AgentContext compacts by cutoff: cf.Agent appends a summary item by itself when a "
        "response's input tokens cross its compaction_threshold (cf.Agent(..., "
        "compaction_threshold=0.5)); to compact by hand, have a model answer "
        "build_summary_request(state, through=offset) and append summary_item(answer, "
        "cutoff=offset), both from contextfold.context.compaction"
    ),
)
"""The agent context fold: ``ContextAdded`` and ``LlmRequestRequested`` into lanes
(``ToolCallResult`` only verifies the result item that follows it)."""


def _is_request(state: AgentContextState, offset: int) -> bool:
    offsets = state.request_offsets
    index = bisect_left(offsets, offset)
    return index < len(offsets) and offsets[index] == offset


# The item's fields as _item_values gives them to the item, in ContextItem's order: the
# constructor was given all but ``updates``, which placing a keyed item sets.
_GIVEN = frozenset(ContextItem.model_fields) - {"updates"}
_GIVEN_UPDATES = frozenset(ContextItem.model_fields)


def _item_values(state: AgentContextState, ev: Envelope[ContextAdded]) -> dict[str, Any]:
    """The new item's field values: the payload's own, validated with it, and what the state
    verifies. Raises pydantic's ValidationError for a position the item's schema refuses
    (below 1, in an envelope made by hand), as the item's constructor does."""
    payload = ev.payload.__dict__
    position = ev.position
    claimed = payload["llm_request_offset"]
    # A forged request offset executes nothing: the request must exist, and the item must
    # come from the agent itself, by its payload and by the journal's record of the writer.
    verified = (
        claimed
        if claimed is not None
        and is_trusted(payload["actor"])
        and ev.meta.actor == AGENT_WRITER
        and _is_request(state, claimed)
        else None
    )
    # Positions are consecutive within one append, and the runtime writes the evidence
    # first: nothing else can sit between a genuine result and its item.
    call_id = payload["tool_call_id"]
    verified_result = call_id is not None and state.tool_result == (position - 1, call_id)
    values = {
        "offset": position,
        "role": payload["role"],
        "content": payload["content"],
        "actor": payload["actor"],
        "key": payload["key"],
        "updates": None,
        "refs": payload["refs"],
        "files": payload["files"],
        "tool_calls": payload["tool_calls"],
        "llm_request_offset": verified,
        "tool_call_id": call_id,
        "verified_result": verified_result,
        "compaction": payload["compaction"],
    }
    if type(position) is not int or position < 1:
        # An envelope made by hand: its offset as the item's schema takes it, or its error.
        values["offset"] = ContextItem(**{name: values[name] for name in _GIVEN}).offset
    return values


def _item(values: dict[str, Any]) -> ContextItem:
    return construct(ContextItem, values, set(_GIVEN))


def _place(
    lane: tuple[ContextItem, ...], values: dict[str, Any], published_through: int
) -> tuple[ContextItem, ...]:
    key = values["key"]
    if key is not None:
        for index in range(len(lane) - 1, -1, -1):
            current = lane[index]
            if current.key != key:
                continue
            if current.offset > published_through:
                # Unpublished slot: settle in place, keeping position and what it supersedes.
                values["updates"] = current.updates
                replaced = construct(ContextItem, values, set(_GIVEN_UPDATES))
                return (*lane[:index], replaced, *lane[index + 1 :])
            values["updates"] = current.offset
            return (*lane, construct(ContextItem, values, set(_GIVEN_UPDATES)))
    # A concatenation copies the lane once; (*lane, item) builds a list, then the tuple.
    return lane + (construct(ContextItem, values, set(_GIVEN)),)  # noqa: RUF005


@AgentContext.on(ContextAdded)
def reduce_context_added(state: AgentContextState, ev: Envelope[ContextAdded]) -> AgentContextState:
    """Add one item: keyed slot rules, or compaction for a summary."""
    values = _item_values(state, ev)
    # Only this position could match the remembered result.
    changes: dict[str, Any] = {} if state.tool_result is None else {"tool_result": None}
    if values["compaction"] is not None:
        return apply_compaction(evolve(state, changes) if changes else state, _item(values))
    if values["role"] == "system":
        changes["system"] = _place(state.system, values, state.published_through)
    else:
        changes["history"] = _place(state.history, values, state.published_through)
    return evolve(state, changes)


@AgentContext.on(LlmRequestRequested)
def reduce_request(
    state: AgentContextState, ev: Envelope[LlmRequestRequested]
) -> AgentContextState:
    """Publish the projection through the request's offset and log its header snapshot."""
    offset = ev.position
    header = ev.payload.header
    return evolve(
        state,
        {
            "published_through": max(state.published_through, offset),
            "header": header if header is not None else state.header,
            "request_offset": offset,
            "request_time": ev.meta.time,
            "request_offsets": state.request_offsets + (offset,),  # noqa: RUF005 (one copy)
        },
    )


@AgentContext.on(ToolCallResult)
def reduce_tool_result(state: AgentContextState, ev: Envelope[ToolCallResult]) -> AgentContextState:
    """Remember the result, so the item appended with it can be verified as its record.
    Only the runtime's own results count (journal meta actor ``tool``, as the scheduler
    decides): another writer's result verifies nothing."""
    if ev.meta.actor != TOOL_WRITER:
        return state
    return evolve(state, {"tool_result": (ev.position, ev.payload.tool_call_id)})


def fold_context(
    envelopes: Iterable[Envelope[Any]], state: AgentContextState | None = None
) -> AgentContextState:
    """Fold envelopes purely (``AgentContext.apply_all``), from the empty state by default."""
    return AgentContext.apply_all(
        state if state is not None else AgentContext.initial_state(), envelopes
    )
