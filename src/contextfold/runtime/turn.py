"""One turn of the agent loop: record the request, send it (or re-send it byte for byte),
watch for interrupts meanwhile, and append the model's output."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, cast

from pydantic import ValidationError

from .._aio import CancelWatch
from ..context.events import (
    ContextAdded,
    LlmRequestInterrupted,
    LlmRequestRequested,
    LlmResponse,
    RequestHeader,
    ToolCallStarted,
    assistant_item,
)
from ..context.manifest import Manifest
from ..context.projection import AgentContext
from ..context.rebuild import RequestRecorded, rebuild_state
from ..context.request import build_request, prefix_snapshot
from ..context.state import AgentContextState, ContextItem
from ..context.trust import trusted_extensions
from ..context.turns import manifest_at
from ..errors import CorruptEventError, ModelError, RenderError, WrongExpectedVersionError
from ..events import Envelope, NewEvent, StoredEvent
from ..wire import ModelOutput, NeutralRequest, RenderedRequest, ToolCall, render_request
from .carried import Carried, Planned, RequestDue, ToolsStarted, seen_through
from .clients import clock_of, developer_role_of
from .compacting import CompactionSteps
from .events import (
    DeltaReceived,
    RequestFailed,
    RequestInterrupted,
    RequestRetried,
    RequestSent,
    ResponseRecorded,
)
from .instance import RunReport
from .scheduling import AGENT, TOOL_WRITER, Decision, behaviour_of
from .tool_runs import HeldResult

__all__ = ["TurnSteps"]

log = logging.getLogger("contextfold.runtime")

# In-process appends wake the interrupt watcher at once (the store's wakeups); this is only
# how often it looks for an interrupt appended by another process during a model call.
_INTERRUPT_POLL = 0.25
# How long an answered request waits for its interrupt watcher's start-up read to end (a
# store that does not answer by then has the read cut short after all).
_STARTING_READ = 1.0


class TurnSteps(CompactionSteps):
    """The agent's steps of one turn (a base of :class:`~contextfold.runtime.loop.Agent`)."""

    # The call ids of the newest history seen: (history, ids).
    _calls_seen: tuple[tuple[ContextItem, ...], frozenset[str]] | None = None
    # The newest header and what it was made of.
    _header_made: tuple[tuple[object, ...], RequestHeader] | None = None
    # The context's latest header and the one made, the last time they were equal.
    _same_headers: tuple[RequestHeader | None, RequestHeader] | None = None
    # Set by the loop around a fresh request step: whether the step after it will run
    # (steps left, no stop asked). None: the step may not carry into the next.
    _next_runs: Callable[[], bool] | None = None
    # What the step just taken leaves the next one (see ``carried``).
    _carried: Carried | None = None
    # False: every event goes out in its own step's append, none ahead (the journal is the
    # same either way: a test compares the two).
    _ahead: bool = True

    def _call_ids(self, history: tuple[ContextItem, ...]) -> frozenset[str]:
        """Every tool call id in ``history``, collected from the items after those of the
        previous history when it begins with them (items are immutable)."""
        start, ids = 0, frozenset[str]()
        seen = self._calls_seen
        # The same item objects: the prefix check compares them by identity.
        if seen is not None and history[: len(seen[0])] == seen[0]:
            start, ids = len(seen[0]), seen[1]
        added = {call.id for item in history[start:] for call in item.tool_calls}
        if added:
            ids = ids | added
        self._calls_seen = (history, ids)
        return ids

    def _logged(self, latest: RequestHeader | None, header: RequestHeader) -> RequestHeader | None:
        """``header`` when a request logs it (``latest``, the context's, differs), else None;
        told for the same two header objects once."""
        seen = self._same_headers
        if seen is not None and seen[0] is latest and seen[1] is header:
            return None
        if latest != header:
            return header
        self._same_headers = (latest, header)
        return None

    async def _header(self, context: AgentContextState) -> RequestHeader:
        """The header of a request made now: the previous one while nothing it is made from
        changed (the same settings, prefix, trust registry and tools)."""
        prefix = await self.prefix.get()
        # The registry is process state: the header records it so rebuilds agree.
        trusted = trusted_extensions()
        developer, clock = developer_role_of(self.model), clock_of(self.model)
        # repr: -0.0 == 0.0 and 1 == 1.0, but their bytes differ.
        made_of = (
            prefix,
            trusted,
            (self.model.transport, self.model.model, developer, clock),
            self.toolbox.definitions,
            self.max_tokens,
            repr(self.temperature),
            self.stream_responses,
            self.content_limit,
        )
        made = self._header_made
        if made is not None and made[0] == made_of:
            return made[1]
        header = RequestHeader(
            transport=self.model.transport,
            model=self.model.model,
            session_prefix=prefix_snapshot(prefix),
            trusted_actor_types=trusted,
            tools=self.toolbox.definitions,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            stream=self.stream_responses,
            content_limit=self.content_limit,
            developer_role=developer,
            layout=2,
            clock=clock,
        )
        self._header_made = (made_of, header)
        return header

    async def _request(
        self,
        context: AgentContextState,
        decision: Decision,
        report: RunReport,
        known: int,
        due: RequestDue | None = None,
    ) -> bool:
        """Request from ``context`` as ``decision`` says; ``known``: the newest stream
        version the agent knew before ``context`` was read (the context holds everything
        through it). ``due``: what the previous step left (the states it folded ahead and
        the tool result it held back, which goes first in the request's append). False,
        with the held result appended, when the stream moved on meanwhile: the step is to
        be looked at again from the journal."""
        held = None if due is None else due.held
        try:
            header = await self._header(context)

            async def flush() -> None:
                nonlocal held
                if held is not None:
                    await self._flush(held)
                    held = None

            # The request event is made first: its time is the tail's, so the pressure gate
            # estimates, and renders, the body that goes out. A summary the gate appends
            # comes after the held result, as it would on its own; the request is then made
            # anew, after it.
            before = context
            event, request = self._request_event(context, header, decision)
            context, planned, known = await self._relieve_pressure(
                context, header, report, known, flush, request.meta.time
            )
            if context is not before:
                event, request = self._request_event(context, header, decision)
            if due is not None and held is not None:
                version = due.version  # the held result's folded-ahead place
            else:
                version = max(known, seen_through(context))
            sending = None
            if self._ahead:
                sending = await self._record_at_once(
                    context, event, request, planned, version, held
                )
            if sending is not None:
                if held is not None:
                    finished, held = held.finished, None
                    await self._emit(finished)
            elif held is not None:
                await flush()  # decided on states the stream has moved past: look again
                return False
        except BaseException:
            if held is not None:  # a result recorded before the failure, as on its own
                await _finish(self._flush(held))
            raise
        if sending is None:  # the stream moved on meanwhile: the request, then its record
            appended = self._saw(await self.journal.append(self.stream, request))
            await self._send(appended.first_position, report, planned)
            return True
        await self._deliver(*sending, report)
        return True

    def _request_event(
        self, context: AgentContextState, header: RequestHeader, decision: Decision
    ) -> tuple[LlmRequestRequested, NewEvent]:
        """The request event, and it as it will be stored (its time taken now). An unchanged
        header is logged once: later requests carry None and reuse it."""
        logged = self._logged(context.header, header)
        event = LlmRequestRequested(header=logged, reason=decision.reason)
        [request] = self.journal.encode(event, actor=AGENT)
        return event, request

    async def _flush(self, held: HeldResult) -> None:
        """Append a held tool result on its own and tell the observers."""
        self._saw(await self.journal.append(self.stream, held.events, actor=TOOL_WRITER))
        await self._emit(held.finished)

    async def _record_at_once(
        self,
        context: AgentContextState,
        event: LlmRequestRequested,
        request: NewEvent,
        planned: Planned | None,
        version: int,
        held: HeldResult | None = None,
    ) -> tuple[int, AgentContextState, NeutralRequest, RenderedRequest] | None:
        """Append the request and its record in one append, expecting the stream at
        ``version``: where ``context`` is current, when the stream is still there. The
        record's body is rendered from ``context`` with the request folded in (not stored
        yet), so it is what the journal gives after it. ``held`` goes first (``context``
        includes it). Returns (offset, context through the request, request, body); None,
        with nothing stored, when the stream is not at ``version`` (another writer
        appended, or ``context`` is further: the agent knew less). ``request``: ``event`` as
        it is stored."""
        ahead = () if held is None else held.events
        offset = version + len(ahead) + 1
        if event.header is not None:  # what the journal's fold reads back: the stored bytes
            event = LlmRequestRequested.model_validate_json(request.data)
        folded = AgentContext.apply(
            context,
            # Never stored as such: the global position is the store's to give.
            Envelope(event, request.meta, self.stream, offset, 0, request.type),
        )
        assert folded.header is not None and folded.request_time is not None
        if planned is not None and planned.holds_for(folded):
            neutral, rendered = planned.request, planned.rendered
        else:
            neutral = build_request(folded, through=offset)
            rendered = render_request(neutral, folded.header.transport)
        # The turns through @version are those through @offset: neither a tool result
        # nor a request is a turn record, nor answers one.
        recorded = self._recorded(
            offset, rendered, await manifest_at(self.journal, self.stream, version)
        )
        encoded = self.journal.encode(recorded, actor=AGENT, channels=())
        try:
            appended = await self.journal.append(
                self.stream, [*ahead, request, *encoded], expected_version=version, actor=AGENT
            )
        except WrongExpectedVersionError:
            return None
        self._saw(appended)
        assert appended.first_position == version + 1
        return offset, folded, neutral, rendered

    @staticmethod
    def _recorded(
        offset: int, rendered: RenderedRequest, manifest: Manifest | None
    ) -> RequestRecorded:
        return RequestRecorded(
            request_offset=offset,
            transport=rendered.transport,
            sha256=rendered.sha256,
            size=len(rendered.body),
            manifest=manifest,
        )

    async def _retry(self, offset: int, appended_by: str | None, report: RunReport) -> None:
        known = self._version_seen
        context = await self.journal.fold(AgentContext, self.stream)
        header = context.header if context.request_offset == offset else None
        reason = ""
        if appended_by != AGENT:
            # Another writer's request (its header may carry any system prompt, model or
            # trust list) is never sent: only the agent decides what goes to the provider.
            reason = (
                f"request @{offset} was not appended by the agent "
                f"(actor {appended_by!r}) and is not sent"
            )
        elif header is None:
            reason = f"request @{offset} has no header snapshot and cannot be rendered"
        elif header.transport != self.model.transport:
            reason = (
                f"request @{offset} was recorded for the {header.transport} transport; "
                f"this agent's model speaks {self.model.transport}"
            )
        if reason:
            # It must not or cannot be re-sent byte for byte through this model (another
            # writer's, appended without a header, or the agent's model changed since):
            # seal it and request anew, with this instance's header logged, so its
            # triggers are still answered.
            sealed = LlmRequestInterrupted(request_offset=offset, reason=reason)
            self._saw(await self.journal.append(self.stream, sealed, actor=AGENT))
            report.interrupted.append(offset)
            await self._emit(RequestInterrupted(offset=offset))
            await self._request(context, Decision("request", reason), report, known)
            return
        await self._emit(RequestRetried(offset=offset))
        await self._send(offset, report)

    async def _send(self, offset: int, report: RunReport, planned: Planned | None = None) -> None:
        context = await self.journal.fold(AgentContext, self.stream)
        neutral: NeutralRequest | None = None
        rendered: RenderedRequest | None = None
        if context.request_offset == offset and context.header is not None:
            transport = context.header.transport
            if planned is not None and planned.holds_for(context):
                neutral, rendered = planned.request, planned.rendered
            else:
                # The cached fold through the request: the per-turn cost stays flat, unless
                # a compaction after @offset removed items the request saw.
                with contextlib.suppress(RenderError):
                    neutral = build_request(context, through=offset)
        if neutral is None:  # a retry after later requests or a compaction: fold through it
            state = await rebuild_state(self.journal, self.stream, offset)
            assert state.header is not None
            neutral, transport = build_request(state), state.header.transport
        if rendered is None:
            rendered = render_request(neutral, transport)
        manifest = await manifest_at(self.journal, self.stream, offset)
        recorded = self._recorded(offset, rendered, manifest)
        self._saw(await self.journal.append(self.stream, recorded, actor=AGENT, channels=()))
        await self._deliver(offset, context, neutral, rendered, report)

    async def _deliver(
        self,
        offset: int,
        context: AgentContextState,
        neutral: NeutralRequest,
        rendered: RenderedRequest,
        report: RunReport,
    ) -> None:
        """Send recorded request @offset and append the model's output; ``context``: the
        context folded through the request (or further)."""
        report.requests.append(offset)
        await self._emit(RequestSent(offset=offset, rendered=rendered, neutral=neutral))
        # Observers opened rows for the request (a transcript): until its outcome is recorded
        # (the journal appends included), an error or a cancel anywhere must close them.
        try:
            output = await self._complete_interruptible(offset, neutral, rendered)
            if output is None:
                report.interrupted.append(offset)
                return
            # Its usage report is compacted, when over the threshold, by the loop's next step.
            await self._record_output(offset, output, context)
        except Exception as exc:
            await self._emit(RequestFailed(offset=offset, error=exc))
            raise
        except asyncio.CancelledError:
            # The agent itself is cancelled (a shutdown): the closing runs to its end.
            await _finish(self._emit(RequestInterrupted(offset=offset)))
            raise

    async def _complete_interruptible(
        self, offset: int, neutral: NeutralRequest, rendered: RenderedRequest
    ) -> ModelOutput | None:
        """The model's output, or None when an ``interrupt`` item arrived meanwhile (the
        request is then recorded as interrupted)."""

        async def on_delta(kind: str, text: str) -> None:
            await self._emit(DeltaReceived(offset=offset, channel=kind, text=text))

        self._cancel.check()  # no model call (paid, maybe long) for a cancelled agent
        call = asyncio.create_task(self.model.complete(neutral, rendered, on_delta=on_delta))
        try:
            await asyncio.sleep(0)  # the call's first step: an instant model answers in it
        except BaseException:  # a cancel of the agent: its caller tells the observers
            await _cancel(call)
            raise
        if call.done():
            return self._answer(call)  # nothing can have interrupted it: nothing to watch
        answered, tailing = asyncio.Event(), asyncio.Event()
        watch = asyncio.create_task(self._watch_interrupts(offset, answered, tailing, call))
        try:
            done, _ = await asyncio.wait({call, watch}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            await _cancel(call, watch)
            raise
        if call in done:
            answered.set()
            await _stop_watch(watch, tailing)
            return self._answer(call)
        await _cancel(call)  # the provider call is over (its stream closed) before we go on
        interrupter = watch.result()
        assert interrupter is not None  # None only once answered
        interrupted = LlmRequestInterrupted(
            request_offset=offset, reason=f"interrupted by @{interrupter}"
        )
        self._saw(await self.journal.append(self.stream, interrupted, actor=AGENT))
        await self._emit(RequestInterrupted(offset=offset, by=interrupter))
        return None

    def _answer(self, call: asyncio.Task[ModelOutput]) -> ModelOutput:
        """The output of a model call that ended; raises what it raised."""
        if call.cancelled():
            # Only this loop cancels the call, and it has not: the model's own work was
            # cancelled (a future it awaited). A provider failure, not a shutdown.
            raise ModelError(
                f"{self.model.transport} request to model {self.model.model!r} failed: "
                "it was cancelled from inside the model call"
            )
        return call.result()

    async def _watch_interrupts(
        self,
        offset: int,
        answered: asyncio.Event,
        tailing: asyncio.Event,
        call: asyncio.Task[Any],
    ) -> int | None:
        """Return the offset of the first ``interrupt`` item appended after request @offset,
        or None when ``answered`` is set before its tail starts (``tailing``), or the model
        ``call`` ended before the watch began (an instant answer: nothing is read)."""
        if call.done():
            return None
        # Start the tail at the request, never by reading the stream from its start. When a
        # newer request has superseded @offset, only items from now on can interrupt it.
        cancel = CancelWatch()  # a cancel the connection pool swallowed still ends the watch
        latest = await self.journal.latest(self.stream, [LlmRequestRequested])
        here = bool(latest) and latest[0].position == offset
        cursor = latest[0].cursor if here else await self.journal.head(self.stream)
        cancel.check()  # else the tail below would wait forever and hold the turn with it
        if answered.is_set():
            return None
        tailing.set()
        tail = self.journal.subscribe(self.stream, after=cursor, poll_interval=_INTERRUPT_POLL)
        # Closed here on return (a PostgreSQL tail stops listening), not by the garbage
        # collector later in a task nobody awaits.
        async with contextlib.aclosing(cast(AsyncGenerator[StoredEvent, None], tail)) as events:
            async for stored in events:
                if stored.type != ContextAdded.event_type or stored.position <= offset:
                    continue
                try:
                    item = stored.decode(ContextAdded)
                except (ValidationError, CorruptEventError) as exc:
                    # The folds skip it too (and report it): one bad row must not stop the agent.
                    log.warning(
                        "interrupt watcher skipped %s@%s: %s", self.stream, stored.position, exc
                    )
                    continue
                assert isinstance(item, ContextAdded)
                if behaviour_of(item) == "interrupt":
                    return stored.position
        raise AssertionError("unreachable: subscribe never ends")

    async def _record_output(
        self, offset: int, output: ModelOutput, context: AgentContextState
    ) -> None:
        """Append the output of request @offset; ``context``: the context through it, whose
        calls the output's must not repeat (the agent's own calls are all in it)."""
        used = self._call_ids(context.history)
        kept, dropped = _split_calls(output.tool_calls)
        calls = _unique_calls(kept, used, offset)
        text = output.text
        if dropped:
            # e.g. a stream cut at max_tokens inside a call: recorded, its half-written
            # arguments would make every later request unrenderable. The model sees why.
            notes = "\n".join(
                f"[tool call {c.name} dropped: its arguments were not a JSON object]"
                for c in dropped
            )
            text = f"{text}\n{notes}" if text else notes
        response = LlmResponse(
            request_offset=offset,
            model=self.model.model,
            text=text,
            tool_calls=calls,
            usage=output.usage,
            stop_reason=output.finish_reason,
        )
        item = assistant_item(response)
        await self._append_output(response, item, context)
        recorded_output = replace(output, text=text, tool_calls=calls)
        await self._emit(ResponseRecorded(offset=offset, output=recorded_output))

    async def _append_output(
        self, response: LlmResponse, item: ContextAdded, context: AgentContextState
    ) -> None:
        """Append the response and its item; with the start of its first call when the next
        step is to run its calls, and then it does (:class:`ToolsStarted`)."""
        calls = response.tool_calls
        version = self._version_seen
        go_on = self._next_runs
        if (
            not calls
            or go_on is None
            or not go_on()
            or not self.toolbox.starts(calls[0])
            or self._crosses(response, context.compacted_through)
            # The item lands at @version + 2: the context is seen through it then.
            or self._materialization_due(version + 2)
        ):
            self._saw(await self.journal.append(self.stream, [response, item], actor=AGENT))
            return
        events = self.journal.encode([response, item], actor=AGENT)
        start = ToolCallStarted(tool_call_id=calls[0].id, name=calls[0].name)
        started = self.journal.encode(start, actor=AGENT)
        try:
            appended = await self.journal.append(
                self.stream, [*events, *started], expected_version=version, actor=AGENT
            )
        except WrongExpectedVersionError:  # another writer meanwhile: the response alone
            self._saw(await self.journal.append(self.stream, events, actor=AGENT))
            return
        self._saw(appended)
        self._carried = ToolsStarted(calls)


async def _cancel(*tasks: asyncio.Task[Any]) -> None:
    """Cancel the tasks and wait until each has finished (its cleanup run), whatever it
    raised: a cancelled model call must not outlive the loop step that started it."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def _stop_watch(watch: asyncio.Task[int | None], tailing: asyncio.Event) -> None:
    """Stop an interrupt watcher once the answer is in: one still reading where its tail
    starts ends after that read (a query cut short costs PostgreSQL a cancel request, a
    connection of its own); one tailing only waits, and is cancelled."""
    if not tailing.is_set() and not watch.done():
        try:
            await asyncio.wait({watch}, timeout=_STARTING_READ)
        except BaseException:
            await _cancel(watch)
            raise
    await _cancel(watch)  # done by now (its failure is nobody's), or waiting, or stuck


async def _finish(cleanup: Awaitable[None]) -> None:
    """Run ``cleanup`` to its end for a caller that is handling a cancel (and re-raises it),
    even when the task is cancelled again meanwhile. ``asyncio.shield`` alone returns at the
    next cancel and leaves the cleanup running on, unawaited, after the task ended.

    A failing cleanup is logged, never raised: it must not turn the cancel into an error
    (a task cancelled at shutdown still ends cancelled). Under an anyio cancel scope, which
    re-delivers its cancel at every await, this waits in a busy loop for the cleanup's
    length (observer writes: milliseconds).
    """
    task = asyncio.ensure_future(cleanup)
    while not task.done():
        # A cancel here does not reach the cleanup; the caller re-raises the one it handles.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task})
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("cleanup after a cancel failed: %s", error, exc_info=error)


def _split_calls(calls: Sequence[ToolCall]) -> tuple[list[ToolCall], list[ToolCall]]:
    """The calls whose arguments are empty or a JSON object, and the others (truncated or
    malformed arguments, which no tool can run and no provider accepts back)."""
    kept: list[ToolCall] = []
    dropped: list[ToolCall] = []
    for call in calls:
        if not call.arguments.strip():
            kept.append(call)
            continue
        try:
            parsed = json.loads(call.arguments)
        except ValueError:
            parsed = None
        (kept if isinstance(parsed, dict) else dropped).append(call)
    return kept, dropped


def _unique_calls(
    calls: Sequence[ToolCall], used: frozenset[str], offset: int
) -> tuple[ToolCall, ...]:
    """The calls of the response to request @offset, each with an id no other call in the
    context has (``used``) nor an earlier call of the same response.

    Providers may repeat ids (a local OpenAI-compatible server answering ``call_0`` every
    turn); a repeated id is neither sent as a call nor paired with its result, so a repeat
    gets the request offset as a suffix, ``call_0-12`` (``-``: Anthropic ids allow only
    ``[a-zA-Z0-9_-]``). Deterministic, and the journal records only the new ids.
    """
    taken = set(used)
    unique: list[ToolCall] = []
    for call in calls:
        base = call.id or "call"  # some servers send no id at all
        candidate, n = base, 1
        while candidate in taken:
            candidate = f"{base}-{offset}" if n == 1 else f"{base}-{offset}-{n}"
            n += 1
        taken.add(candidate)
        unique.append(call if candidate == call.id else call.model_copy(update={"id": candidate}))
    return tuple(unique)
