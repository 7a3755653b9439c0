"""``cf.render``: the exact request body for an agent context state."""

from __future__ import annotations

from ..context.events import RequestHeader
from ..context.request import build_request
from ..context.state import AgentContextState
from ..errors import RenderError
from .neutral import RenderedRequest, Transport, render_request

__all__ = ["render"]


def render(
    state: AgentContextState,
    *,
    transport: Transport | None = None,
    header: RequestHeader | None = None,
) -> RenderedRequest:
    """Render ``state`` (its latest header snapshot unless ``header`` is given) for
    ``transport`` (the header's unless given). Pure: the same state gives the same bytes."""
    chosen = header if header is not None else state.header
    if chosen is None:
        raise RenderError("the state has no request header: pass header=RequestHeader(...)")
    if transport is not None and transport != chosen.transport:
        chosen = chosen.model_copy(update={"transport": transport})
    return render_request(build_request(state, chosen), chosen.transport)
