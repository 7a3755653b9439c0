"""Compaction by cutoff in the agent loop: summarize the newest request whose usage
crossed the threshold through the same model, and append the summary that replaces the
history through it.

Two ways in: the catch-up (a response's usage report crossed the threshold) and the
pressure gate (the estimate of the request about to go out crosses it). Either way a
compaction whose next request is still over the threshold is tried once more, and then
the loop stops with a CompactionError (``still above threshold after 2 compaction
attempts``) instead of paying a summary call on every turn.
"""

from __future__ import annotations

import logging

from ..context.compaction import (
    MAX_COMPACTION_ATTEMPTS,
    build_summary_request,
    compaction_attempt,
    latest_summary,
    needs_compaction,
    pick_compaction,
    summary_item,
    threshold_tokens,
)
from ..context.events import LlmResponse, RequestHeader
from ..context.projection import AgentContext
from ..context.rebuild import rebuild_state
from ..context.request import build_request
from ..context.state import AgentContextState
from ..errors import CompactionError, RenderError
from ..wire import NeutralRequest, Transport, body_size, render_request
from .clients import developer_role_of
from .events import CompactionFinished, CompactionStarted
from .instance import Outgoing, Run
from .lease import confirm_claim
from .scheduling import SchedulerState

__all__ = ["catch_up", "relieve_pressure"]

log = logging.getLogger("contextfold.runtime")


async def catch_up(run: Run, context: AgentContextState, sched: SchedulerState) -> bool:
    """Summarize the newest request whose usage report crossed the threshold and is not
    summarized yet (several may have piled up, e.g. before a restart: only the newest is
    summarized, once). Waits while the latest request is unanswered. True when it did.

    Raises CompactionError when it would be the third compaction in a row that leaves the
    next request over the threshold."""
    picked = _due(run, context, sched)
    if picked is None:
        return False
    assert picked.usage is not None  # measured reports only
    attempt = _attempt(run, context, picked.request_offset, picked.usage.input_tokens, picked.model)
    run.busy()
    if await _compact(run, picked.request_offset, attempt=attempt):
        return True
    run.state.not_compactable.add(picked.request_offset)
    return False


def _due(run: Run, context: AgentContextState, sched: SchedulerState) -> LlmResponse | None:
    """The response whose usage the catch-up summarizes at a step from these states."""
    if not sched.answered:
        return None
    settings = run.settings
    picked = pick_compaction(
        sched.reports,
        threshold=settings.compaction_threshold,
        compacted_through=context.compacted_through,
        window=settings.context_window,
    )
    if picked is None or picked.request_offset in run.state.not_compactable:
        return None
    return picked


async def relieve_pressure(
    run: Run, context: AgentContextState, header: RequestHeader, time: str
) -> tuple[AgentContextState, Outgoing | None]:
    """The pressure gate before a request goes out: build and render it from ``context``
    with ``header`` at ``time`` (the request event's) and estimate that body (session
    prefix included: a new instance's prefix may have grown); when it crosses the
    threshold, summarize the previous request first. Returns the context the request is
    to be built from and the request built and rendered from it (None when a compaction
    changed the context). Raises CompactionError like the catch-up."""
    built = run.build(context, header, timestamp=time)
    previous = context.request_offset
    if previous is None or previous <= context.compacted_through:
        return context, built
    # The estimate of a body is its bytes / 4 (see _estimate): here, of the one to be sent.
    if not _over(run, len(built.rendered.body) // 4, header.model):
        return context, built
    # Measured like the request about to go: an estimate of previous's own body.
    attempt = _attempt(run, context, previous, _estimate_of(context), header.model)
    if await _compact(run, previous, attempt=attempt):
        return await run.journal.fold(AgentContext, run.stream), None
    return context, built


def _over(run: Run, tokens: int, model: str) -> bool:
    settings = run.settings
    return needs_compaction(
        tokens, model, threshold=settings.compaction_threshold, window=settings.context_window
    )


def _attempt(
    run: Run, context: AgentContextState, offset: int, size: int | None, model: str
) -> int:
    """The attempt a compaction of request @offset (``size`` input tokens) would be;
    raises CompactionError, storing nothing, past :data:`MAX_COMPACTION_ATTEMPTS`."""
    over = size is not None and _over(run, size, model)
    attempt = compaction_attempt(context, offset, over=over)
    if attempt <= MAX_COMPACTION_ATTEMPTS:
        return attempt
    settings = run.settings
    threshold = settings.compaction_threshold
    limit = threshold_tokens(model, threshold=threshold, window=settings.context_window)
    summary = latest_summary(context)
    where = f"; the latest summary is @{summary.offset}" if summary is not None else ""
    raise CompactionError(
        f"request @{offset} of stream {run.stream!r} is {size:,} input tokens, still above "
        f"threshold after {MAX_COMPACTION_ATTEMPTS} compaction attempts (threshold "
        f"{threshold} of {model!r}'s context window: {limit:,.0f} "
        f"tokens{where}); no further summary is requested. What compaction keeps is too "
        "big (the system lane, the session prefix, tools, the newest items): shrink it, "
        "or give the agent a larger cf.Agent(context_window=...) or compaction_threshold",
        reason="still-over-threshold",
    )


async def _compact(run: Run, offset: int, *, attempt: int = 1) -> bool:
    """Summarize the exact request @offset (plus the instruction) through the same model;
    the summary replaces history through @offset. False when it cannot or need not."""
    current = await run.journal.fold(AgentContext, run.stream)
    if offset <= current.compacted_through:
        return False  # already summarized (the summary comes after the request it replaces)
    model = run.settings.model
    neutral = await _summary_request(run, current, offset)
    if neutral is None:
        return False
    rendered = render_request(neutral, model.transport)
    await run.emit(CompactionStarted(offset=offset, rendered=rendered))
    run.cancel.check()  # no summary call for a cancelled agent either
    await confirm_claim(run.journal)  # no append precedes this call: a lazy lease lands
    output = await model.complete(neutral, rendered)
    summary = summary_item(output.text, cutoff=offset, usage=output.usage, attempt=attempt)
    run.saw(await run.journal.append(run.stream, summary, actor="agent"))
    run.report.compactions.append(offset)
    await run.emit(CompactionFinished(offset=offset, summary=output.text, usage=output.usage))
    return True


async def _summary_request(
    run: Run, current: AgentContextState, offset: int
) -> NeutralRequest | None:
    """Request @offset plus the instruction, or None when this model cannot send it.

    From the live context when @offset is its latest request (what ``send`` sends from
    too: no refold of the journal), else from the journal folded through it."""
    state: AgentContextState | None = current if current.request_offset == offset else None
    neutral: NeutralRequest | None = None
    if state is not None:
        try:
            neutral = build_summary_request(state, through=offset)
        except RenderError:  # a compaction after @offset removed items it saw
            state = None
    if state is None:
        state = await rebuild_state(run.journal, run.stream, offset)
    model = run.settings.model
    recorded_for = state.header.transport if state.header is not None else None
    if recorded_for != model.transport:
        # The exact request can only go through the model it was recorded for (and one
        # without a header cannot be rendered): the next request, logged with this
        # model's header, is measured and compacted instead.
        log.warning(
            "not compacting request @%s of %r: recorded for %s, the model speaks %s",
            offset,
            run.stream,
            recorded_for,
            model.transport,
        )
        return None
    assert state.header is not None  # its transport matched
    mine = state.header.model_copy(update={"developer_role": developer_role_of(model)})
    if state.header.has_developer_role and not mine.has_developer_role:
        # Its developer messages would reach a server not known to take them (one that
        # answers 500 to the role): the next request, in this model's terms, is instead.
        log.warning(
            "not compacting request @%s of %r: recorded with the developer role, which "
            "this model's server is not confirmed to take",
            offset,
            run.stream,
        )
        return None
    return neutral if neutral is not None else build_summary_request(state, through=offset)


def _estimate(request: NeutralRequest, transport: Transport) -> int:
    """Input tokens of a request, estimated as its wire body's bytes / 4."""
    return body_size(request, transport) // 4


def _estimate_of(context: AgentContextState) -> int | None:
    """The estimate of the context's latest request, as it was sent; None when the context
    cannot give it any more."""
    if context.request_offset is None or context.header is None:
        return None
    try:
        request = build_request(context, through=context.request_offset)
    except RenderError:
        return None
    return _estimate(request, context.header.transport)
