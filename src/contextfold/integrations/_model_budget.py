"""The budget and compaction of :class:`~contextfold.integrations.openai_agents.JournalModel`:
contextfold's compaction by cutoff, chosen for a token budget.

A request whose estimate (its body's bytes / 4, as the agent loop estimates) is over the
model's ``compact_at`` is preceded by a summary, over its ``budget`` by a note: either is
the agent context's compaction item (``context.compaction.summary_item``, sent as a user
message) replacing the history through a request offset, the cutoff. The originals stay
in the journal; a rebuild folds the same items, so every request still verifies.

The cutoff is a request offset: every answer to an earlier request, and every tool result
the next request took in, is at or below it, so no tool call is cut from its result. Of
the requests after the previous cutoff, it is the oldest whose later history fits
``keep_tokens`` (the newest whole steps stay verbatim), and never after the newest
request: its answer and what came after survive behind the summary. Keeping less than the
budget leaves room to grow, so the requests after a compaction share their prefix (the
prompt cache holds) until the next one. A compaction that cannot help is not made: when
the history besides the summary already fits ``keep_tokens`` (what is over the budget is
the system prompt, the tools or one step alone), or the cut would drop only a summary.

Pure but for :func:`summary_request`, which may fold the journal through the cutoff.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from dataclasses import replace

from ..context.compaction import build_summary_request
from ..context.rebuild import rebuild_state
from ..context.state import AgentContextState, ContextItem
from ..errors import RenderError
from ..journal import Journal
from ..wire import NeutralRequest, RenderedRequest, Transport

__all__ = [
    "body_tokens",
    "choose_cutoff",
    "item_tokens",
    "summary_request",
    "trim_note",
]

_ITEM_OVERHEAD = 32
"""Characters an item costs besides its content: its header line and the JSON around it."""


def body_tokens(rendered: RenderedRequest) -> int:
    """A request's input tokens, estimated as its body's bytes / 4."""
    return len(rendered.body) // 4


def item_tokens(item: ContextItem) -> int:
    """An item's tokens in a request, estimated as its characters / 4."""
    calls = sum(len(c.id) + len(c.name) + len(c.arguments) for c in item.tool_calls)
    return (len(item.content) + calls + _ITEM_OVERHEAD) // 4


def choose_cutoff(state: AgentContextState, *, keep_tokens: float) -> int | None:
    """The request offset a compaction of ``state`` cuts at (see the module), or None when
    compacting cannot help."""
    offsets = state.request_offsets
    candidates = offsets[bisect_right(offsets, state.compacted_through) :]
    if not candidates:
        return None
    items = [item for item in state.history if item.compaction is None]
    total = 0
    first_dropped: int | None = None
    for item in reversed(items):  # newest first: stops at the first that does not fit
        total += item_tokens(item)
        if total > keep_tokens:
            first_dropped = item.offset
            break
    if first_dropped is None:
        return None  # the history fits already: something else is over the budget
    at = bisect_left(candidates, first_dropped)
    cutoff = candidates[at] if at < len(candidates) else candidates[-1]
    if not items or items[0].offset > cutoff:
        return None  # it would drop only a summary
    return cutoff


def trim_note(state: AgentContextState, cutoff: int) -> str:
    """The text standing in for the history a budget leaves out (no model call)."""
    left = sum(1 for item in state.history if item.offset <= cutoff)
    return (
        f"[{left} earlier items of this conversation, through @{cutoff}, are left out of "
        "the requests from here on to fit their token budget. They stay in the journal.]"
    )


async def summary_request(
    journal: Journal, stream: str, state: AgentContextState, cutoff: int, transport: Transport
) -> NeutralRequest | None:
    """Request @``cutoff`` as it was sent, plus the summary instruction, free text (a
    structured output would bind the summary to the answer's schema); from ``state`` when
    @cutoff is its newest request, else from the journal folded through it. None when it
    was recorded for another transport than ``transport`` or cannot be built any more."""
    source = (
        state if state.request_offset == cutoff else await rebuild_state(journal, stream, cutoff)
    )
    if source.header is None or source.header.transport != transport:
        return None
    try:
        request = build_summary_request(source, through=cutoff)
    except RenderError:
        return None
    return replace(request, output_schema=None) if request.output_schema else request
