"""Compaction by cutoff in the agent loop: summarize the newest request whose usage
crossed the threshold through the same model, and append the summary that replaces the
history through it."""

from __future__ import annotations

import logging

from ..context.compaction import build_summary_request, pick_compaction, summary_item
from ..context.projection import AgentContext
from ..context.rebuild import rebuild_state
from ..context.state import AgentContextState
from ..wire import render_request
from .events import CompactionFinished, CompactionStarted
from .instance import AgentInstance, RunReport
from .scheduling import SchedulerState

__all__ = ["CompactionSteps"]

log = logging.getLogger("contextfold.runtime")


class CompactionSteps(AgentInstance):
    """The agent's compaction steps (a base of :class:`~contextfold.runtime.loop.Agent`)."""

    async def _catch_up_compaction(
        self, context: AgentContextState, sched: SchedulerState, report: RunReport
    ) -> bool:
        """Summarize the newest request whose usage report crossed the threshold and is not
        summarized yet (several may have piled up, e.g. before a restart: only the newest is
        summarized, once). Waits while the latest request is unanswered. True when it did."""
        if not sched.answered:
            return False
        picked = pick_compaction(
            sched.reports,
            threshold=self.compaction_threshold,
            compacted_through=context.compacted_through,
        )
        if picked is None or picked.request_offset in self._not_compactable:
            return False
        self._set_status("busy")
        if await self._compact(picked.request_offset, report):
            return True
        self._not_compactable.add(picked.request_offset)
        return False

    async def _compact(self, offset: int, report: RunReport) -> bool:
        """Summarize the exact request @offset (plus the instruction) through the same model;
        the summary replaces history through @offset. False when it cannot or need not."""
        current = await self.journal.fold(AgentContext, self.stream)
        if offset <= current.compacted_through:
            return False  # already summarized (the summary comes after the request it replaces)
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
            return False
        neutral = build_summary_request(state, through=offset)
        rendered = render_request(neutral, self.model.transport)
        await self._emit(CompactionStarted(offset=offset))
        self._cancel.check()  # no summary call for a cancelled agent either
        output = await self.model.complete(neutral, rendered)
        summary = summary_item(output.text, cutoff=offset, usage=output.usage)
        await self.journal.append(self.stream, summary, actor="agent")
        report.compactions.append(offset)
        await self._emit(CompactionFinished(offset=offset, summary=output.text))
        return True
