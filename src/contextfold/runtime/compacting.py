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
from collections.abc import Awaitable, Callable

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
from .carried import Planned
from .clients import developer_role_of
from .events import CompactionFinished, CompactionStarted
from .instance import RunReport
from .lease import confirm_claim
from .materializing import MaterializingSteps
from .scheduling import SchedulerState

__all__ = ["CompactionSteps"]

log = logging.getLogger("contextfold.runtime")

_Pick = tuple[tuple[LlmResponse, ...], tuple[float, int, int | None], LlmResponse | None]


class CompactionSteps(MaterializingSteps):
    """The agent's compaction steps (a base of :class:`~contextfold.runtime.loop.Agent`)."""

    # The newest pick: (reports, (threshold, cutoff, window), picked).
    _picked: _Pick | None = None

    async def _catch_up_compaction(
        self, context: AgentContextState, sched: SchedulerState, report: RunReport
    ) -> bool:
        """Summarize the newest request whose usage report crossed the threshold and is not
        summarized yet (several may have piled up, e.g. before a restart: only the newest is
        summarized, once). Waits while the latest request is unanswered. True when it did.

        Raises CompactionError when it would be the third compaction in a row that leaves
        the next request over the threshold."""
        if not self._compaction_due(context, sched):
            return False
        picked = self._pick(sched.reports, context.compacted_through)
        assert picked is not None and picked.usage is not None  # measured reports only
        attempt = self._attempt(
            context, picked.request_offset, picked.usage.input_tokens, picked.model
        )
        self._set_status("busy")
        if await self._compact(picked.request_offset, report, attempt=attempt):
            return True
        self._not_compactable.add(picked.request_offset)
        return False

    def _compaction_due(self, context: AgentContextState, sched: SchedulerState) -> bool:
        """Whether the catch-up summarizes at a step from these states."""
        if not sched.answered:
            return False
        picked = self._pick(sched.reports, context.compacted_through)
        return picked is not None and picked.request_offset not in self._not_compactable

    def _crosses(self, response: LlmResponse, compacted_through: int) -> bool:
        """Whether the usage report of ``response`` would be picked for a catch-up (the
        newest over the threshold): the reports before it were looked at already."""
        picked = pick_compaction(
            (response,),
            threshold=self.compaction_threshold,
            compacted_through=compacted_through,
            window=self.context_window,
        )
        return picked is not None and picked.request_offset not in self._not_compactable

    def _pick(self, reports: tuple[LlmResponse, ...], compacted_through: int) -> LlmResponse | None:
        """``pick_compaction`` of ``reports``, picking only among the reports after those of
        the previous pick when they begin with those (they grow one response at a time)."""
        settings = (self.compaction_threshold, compacted_through, self.context_window)
        start, best = 0, None
        seen = self._picked
        # The same report objects: the prefix check compares them by identity.
        if seen is not None and seen[1] == settings and reports[: len(seen[0])] == seen[0]:
            start, best = len(seen[0]), seen[2]
        newer = pick_compaction(
            reports[start:],
            threshold=self.compaction_threshold,
            compacted_through=compacted_through,
            window=self.context_window,
        )
        if newer is not None and (best is None or newer.request_offset > best.request_offset):
            best = newer  # as max() over all of them: the first of the newest offset
        self._picked = (reports, settings, best)
        return best

    async def _relieve_pressure(
        self,
        context: AgentContextState,
        header: RequestHeader,
        report: RunReport,
        known: int,
        before: Callable[[], Awaitable[None]] | None = None,
        time: str | None = None,
    ) -> tuple[AgentContextState, Planned | None, int]:
        """The pressure gate before a request goes out: estimate it with ``header``
        (session prefix included: a new instance's prefix may have grown) and, when it
        crosses the threshold, summarize the previous request first (``before`` awaited
        ahead of that). ``time``: the time of the request event about to be appended (the
        request is built and rendered as it goes out, and estimated by that body); None
        times it at the previous request. Returns the context the request is built from,
        the plan that was estimated (None when there was none to estimate, or a compaction
        changed the context), and the newest version known before that context was read
        (``known``, for the context given). Raises CompactionError like the catch-up."""
        previous = context.request_offset
        if previous is None or previous <= context.compacted_through:
            return context, None, known
        timestamp = time if time is not None else context.request_time
        request = build_request(context, header, timestamp=timestamp)
        rendered = render_request(request, header.transport)
        planned = None
        if timestamp is not None:
            planned = Planned(context, header, request, rendered, timestamp)
        # The estimate of a body is its bytes / 4 (see _estimate): here, of the rendered one.
        if not self._over(len(rendered.body) // 4, header.model):
            return context, planned, known
        # Measured like the request about to go: an estimate of previous's own body.
        attempt = self._attempt(context, previous, _estimate_of(context), header.model)
        if before is not None:
            await before()
        if await self._compact(previous, report, attempt=attempt):
            known = self._version_seen
            return await self.journal.fold(AgentContext, self.stream), None, known
        return context, planned, known

    def _over(self, tokens: int, model: str) -> bool:
        return needs_compaction(
            tokens, model, threshold=self.compaction_threshold, window=self.context_window
        )

    def _attempt(
        self, context: AgentContextState, offset: int, size: int | None, model: str
    ) -> int:
        """The attempt a compaction of request @offset (``size`` input tokens) would be;
        raises CompactionError, storing nothing, past :data:`MAX_COMPACTION_ATTEMPTS`."""
        over = size is not None and self._over(size, model)
        attempt = compaction_attempt(context, offset, over=over)
        if attempt <= MAX_COMPACTION_ATTEMPTS:
            return attempt
        limit = threshold_tokens(
            model, threshold=self.compaction_threshold, window=self.context_window
        )
        summary = latest_summary(context)
        where = f"; the latest summary is @{summary.offset}" if summary is not None else ""
        raise CompactionError(
            f"request @{offset} of stream {self.stream!r} is {size:,} input tokens, still above "
            f"threshold after {MAX_COMPACTION_ATTEMPTS} compaction attempts (threshold "
            f"{self.compaction_threshold} of {model!r}'s context window: {limit:,.0f} "
            f"tokens{where}); no further summary is requested. What compaction keeps is too "
            "big (the system lane, the session prefix, tools, the newest items): shrink it, "
            "or give the agent a larger cf.Agent(context_window=...) or compaction_threshold",
            reason="still-over-threshold",
        )

    async def _compact(self, offset: int, report: RunReport, *, attempt: int = 1) -> bool:
        """Summarize the exact request @offset (plus the instruction) through the same model;
        the summary replaces history through @offset. False when it cannot or need not."""
        current = await self.journal.fold(AgentContext, self.stream)
        if offset <= current.compacted_through:
            return False  # already summarized (the summary comes after the request it replaces)
        neutral = await self._summary_request(current, offset)
        if neutral is None:
            return False
        rendered = render_request(neutral, self.model.transport)
        await self._emit(CompactionStarted(offset=offset))
        self._cancel.check()  # no summary call for a cancelled agent either
        await confirm_claim(self.journal)  # no append precedes this call: a lazy lease lands
        output = await self.model.complete(neutral, rendered)
        summary = summary_item(output.text, cutoff=offset, usage=output.usage, attempt=attempt)
        self._saw(await self.journal.append(self.stream, summary, actor="agent"))
        report.compactions.append(offset)
        await self._emit(CompactionFinished(offset=offset, summary=output.text))
        return True

    async def _summary_request(
        self, current: AgentContextState, offset: int
    ) -> NeutralRequest | None:
        """Request @offset plus the instruction, or None when this model cannot send it.

        From the live context when @offset is its latest request (what ``_send`` sends
        from too: no refold of the journal), else from the journal folded through it."""
        state: AgentContextState | None = current if current.request_offset == offset else None
        neutral: NeutralRequest | None = None
        if state is not None:
            try:
                neutral = build_summary_request(state, through=offset)
            except RenderError:  # a compaction after @offset removed items it saw
                state = None
        if state is None:
            state = await rebuild_state(self.journal, self.stream, offset)
        recorded_for = state.header.transport if state.header is not None else None
        if recorded_for != self.model.transport:
            # The exact request can only go through the model it was recorded for (and one
            # without a header cannot be rendered): the next request, logged with this
            # model's header, is measured and compacted instead.
            log.warning(
                "not compacting request @%s of %r: recorded for %s, the model speaks %s",
                offset,
                self.stream,
                recorded_for,
                self.model.transport,
            )
            return None
        assert state.header is not None  # its transport matched
        mine = state.header.model_copy(update={"developer_role": developer_role_of(self.model)})
        if state.header.has_developer_role and not mine.has_developer_role:
            # Its developer messages would reach a server not known to take them (one that
            # answers 500 to the role): the next request, in this model's terms, is instead.
            log.warning(
                "not compacting request @%s of %r: recorded with the developer role, which "
                "this model's server is not confirmed to take",
                offset,
                self.stream,
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
