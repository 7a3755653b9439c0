"""One turn of the agent loop: record the request, send it (or re-send it byte for byte),
watch for interrupts meanwhile, and append the model's output.

A request and its record go in one append, expecting the stream at the version the
context was read at: the record's body is the one the journal rebuilds from the request
(built from the same items, header and time), so the pair lands only where it was made
for. When another writer appended meanwhile, the request goes alone and its record is
made from the journal after it (:func:`send`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace
from typing import Any, cast

from pydantic import ValidationError

from .._aio import CancelWatch, finish
from ..context.events import (
    ContextAdded,
    LlmRequestInterrupted,
    LlmRequestRequested,
    LlmResponse,
    RequestHeader,
    assistant_item,
)
from ..context.manifest import Manifest
from ..context.projection import AgentContext
from ..context.rebuild import RequestRecorded, rebuild_state
from ..context.request import prefix_snapshot
from ..context.state import AgentContextState
from ..context.trust import trusted_extensions
from ..context.turns import manifest_at
from ..errors import CorruptEventError, ModelError, RenderError, WrongExpectedVersionError
from ..events import NewEvent, StoredEvent
from ..wire import ModelOutput, NeutralRequest, RenderedRequest, ToolCall
from .clients import clock_of, developer_role_of
from .compacting import relieve_pressure
from .events import (
    DeltaReceived,
    RequestFailed,
    RequestInterrupted,
    RequestRetried,
    RequestSent,
    ResponseRecorded,
)
from .instance import Outgoing, Run
from .materializing import seen_through
from .scheduling import AGENT, Decision, behaviour_of

__all__ = ["request", "retry"]

log = logging.getLogger("contextfold.runtime")

# In-process appends wake the interrupt watcher at once (the store's wakeups); this is only
# how often it looks for an interrupt appended by another process during a model call.
_INTERRUPT_POLL = 0.25
# How long an answered request waits for its interrupt watcher's start-up read to end (a
# store that does not answer by then has the read cut short after all).
_STARTING_READ = 1.0


async def make_header(run: Run) -> RequestHeader:
    """The header of a request made now, from the agent's settings, its session prefix and
    the trust registry (process state: the header records it so rebuilds agree)."""
    settings = run.settings
    model = settings.model
    return RequestHeader(
        transport=model.transport,
        model=model.model,
        session_prefix=prefix_snapshot(await settings.prefix.get()),
        trusted_actor_types=trusted_extensions(),
        tools=settings.toolbox.definitions,
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        stream=settings.stream_responses,
        content_limit=settings.content_limit,
        developer_role=developer_role_of(model),
        layout=2,
        clock=clock_of(model),
    )


async def request(run: Run, context: AgentContextState, decision: Decision, known: int) -> None:
    """Request from ``context`` as ``decision`` says; ``known``: the newest stream version
    the agent knew before ``context`` was read (the context holds everything through it)."""
    header = await make_header(run)
    # The request event is made first: its time is the tail's, so the pressure gate
    # estimates, and renders, the body that goes out. After a summary the gate appends,
    # the request is made anew, from the context after it.
    stored = _request_event(run, context, header, decision)
    gated, outgoing = await relieve_pressure(run, context, header, stored.meta.time)
    if gated is not context:
        context, known = gated, run.state.version_seen
        stored = _request_event(run, context, header, decision)
    version = max(known, seen_through(context))
    sending = await _record_with_request(run, context, header, stored, outgoing, version)
    if sending is None:  # the stream moved on meanwhile: the request, then its record
        appended = run.saw(await run.journal.append(run.stream, stored))
        await send(run, appended.first_position)
        return
    await _deliver(run, version + 1, context, sending.request, sending.rendered)


def _request_event(
    run: Run, context: AgentContextState, header: RequestHeader, decision: Decision
) -> NewEvent:
    """The request event as it will be stored (its time taken now). An unchanged header is
    logged once: later requests carry None and reuse it."""
    logged = header if context.header != header else None
    event = LlmRequestRequested(header=logged, reason=decision.reason)
    [stored] = run.journal.encode(event, actor=AGENT)
    return stored


async def _record_with_request(
    run: Run,
    context: AgentContextState,
    header: RequestHeader,
    stored: NewEvent,
    outgoing: Outgoing | None,
    version: int,
) -> Outgoing | None:
    """Append the request ``stored`` and its record in one append, expecting the stream at
    ``version`` (where ``context`` is current). The record's body is built from
    ``context`` with the header the journal gives the request and its time, so it is
    what a rebuild gives; ``outgoing``: that request, built already (by the pressure
    gate) with ``header``. None, with nothing stored, when the stream is not at
    ``version`` (another writer appended, or ``context`` is further: the agent knew less)."""
    logged = LlmRequestRequested.model_validate_json(stored.data).header
    if logged is not None and logged != header:  # what a read gives: the stored bytes
        header, outgoing = logged, None
    if outgoing is None:
        outgoing = run.build(context, header, timestamp=stored.meta.time)
    offset = version + 1
    # The turns through @version are those through @offset: neither a tool result nor a
    # request is a turn record, nor answers one.
    manifest = await manifest_at(run.journal, run.stream, version)
    recorded = _recorded(offset, outgoing.rendered, manifest)
    record = run.journal.encode(recorded, actor=AGENT, channels=())
    try:
        appended = await run.journal.append(
            run.stream, [stored, *record], expected_version=version, actor=AGENT
        )
    except WrongExpectedVersionError:
        return None
    run.saw(appended)
    return outgoing


def _recorded(offset: int, rendered: RenderedRequest, manifest: Manifest | None) -> RequestRecorded:
    return RequestRecorded(
        request_offset=offset,
        transport=rendered.transport,
        sha256=rendered.sha256,
        size=len(rendered.body),
        manifest=manifest,
    )


async def retry(run: Run, offset: int, appended_by: str | None) -> None:
    """Re-send request @offset byte for byte, or seal it and request anew when it must not
    or cannot be sent through this agent's model."""
    known = run.state.version_seen
    context = await run.journal.fold(AgentContext, run.stream)
    header = context.header if context.request_offset == offset else None
    transport = run.settings.model.transport
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
    elif header.transport != transport:
        reason = (
            f"request @{offset} was recorded for the {header.transport} transport; "
            f"this agent's model speaks {transport}"
        )
    if reason:
        # It must not or cannot be re-sent byte for byte through this model (another
        # writer's, appended without a header, or the agent's model changed since): seal
        # it and request anew, with this instance's header logged, so its triggers are
        # still answered.
        sealed = LlmRequestInterrupted(request_offset=offset, reason=reason)
        run.saw(await run.journal.append(run.stream, sealed, actor=AGENT))
        run.report.interrupted.append(offset)
        await run.emit(RequestInterrupted(offset=offset))
        await request(run, context, Decision("request", reason), known)
        return
    await run.emit(RequestRetried(offset=offset))
    await send(run, offset)


async def send(run: Run, offset: int) -> None:
    """Record request @offset as the journal rebuilds it, then send it."""
    context = await run.journal.fold(AgentContext, run.stream)
    sending: Outgoing | None = None
    if context.request_offset == offset and context.header is not None:
        # The cached fold through the request: the per-turn cost stays flat, unless a
        # compaction after @offset removed items the request saw.
        with contextlib.suppress(RenderError):
            sending = run.build(context, through=offset)
    if sending is None:  # a retry after later requests or a compaction: fold through it
        sending = run.build(await rebuild_state(run.journal, run.stream, offset))
    neutral, rendered = sending.request, sending.rendered
    manifest = await manifest_at(run.journal, run.stream, offset)
    recorded = _recorded(offset, rendered, manifest)
    run.saw(await run.journal.append(run.stream, recorded, actor=AGENT, channels=()))
    await _deliver(run, offset, context, neutral, rendered)


async def _deliver(
    run: Run,
    offset: int,
    context: AgentContextState,
    neutral: NeutralRequest,
    rendered: RenderedRequest,
) -> None:
    """Send recorded request @offset and append the model's output; ``context``: a context
    holding every item the request holds (its calls are the agent's own so far)."""
    run.report.requests.append(offset)
    await run.emit(RequestSent(offset=offset, rendered=rendered, neutral=neutral))
    # Observers opened rows for the request (a transcript): until its outcome is recorded
    # (the journal appends included), an error or a cancel anywhere must close them.
    try:
        output = await _complete_interruptible(run, offset, neutral, rendered)
        if output is None:
            run.report.interrupted.append(offset)
            return
        # Its usage report is compacted, when over the threshold, by the loop's next step.
        await _record_output(run, offset, output, context)
    except Exception as exc:
        await run.emit(RequestFailed(offset=offset, error=exc))
        raise
    except asyncio.CancelledError:
        # The agent itself is cancelled (a shutdown): the closing runs to its end.
        await finish(run.emit(RequestInterrupted(offset=offset)))
        raise


async def _complete_interruptible(
    run: Run, offset: int, neutral: NeutralRequest, rendered: RenderedRequest
) -> ModelOutput | None:
    """The model's output, or None when an ``interrupt`` item arrived meanwhile (the
    request is then recorded as interrupted)."""

    async def on_delta(kind: str, text: str) -> None:
        await run.emit(DeltaReceived(offset=offset, channel=kind, text=text))

    model = run.settings.model
    run.cancel.check()  # no model call (paid, maybe long) for a cancelled agent
    call = asyncio.create_task(model.complete(neutral, rendered, on_delta=on_delta))
    try:
        await asyncio.sleep(0)  # the call's first step: an instant model answers in it
    except BaseException:  # a cancel of the agent: its caller tells the observers
        await _cancel(call)
        raise
    if call.done():
        return _answer(run, call)  # nothing can have interrupted it: nothing to watch
    answered, tailing = asyncio.Event(), asyncio.Event()
    watch = asyncio.create_task(_watch_interrupts(run, offset, answered, tailing, call))
    try:
        done, _ = await asyncio.wait({call, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        await _cancel(call, watch)
        raise
    if call in done:
        answered.set()
        await _stop_watch(watch, tailing)
        return _answer(run, call)
    await _cancel(call)  # the provider call is over (its stream closed) before we go on
    interrupter = watch.result()
    assert interrupter is not None  # None only once answered
    interrupted = LlmRequestInterrupted(
        request_offset=offset, reason=f"interrupted by @{interrupter}"
    )
    run.saw(await run.journal.append(run.stream, interrupted, actor=AGENT))
    await run.emit(RequestInterrupted(offset=offset, by=interrupter))
    return None


def _answer(run: Run, call: asyncio.Task[ModelOutput]) -> ModelOutput:
    """The output of a model call that ended; raises what it raised."""
    if call.cancelled():
        # Only this loop cancels the call, and it has not: the model's own work was
        # cancelled (a future it awaited). A provider failure, not a shutdown.
        model = run.settings.model
        raise ModelError(
            f"{model.transport} request to model {model.model!r} failed: "
            "it was cancelled from inside the model call"
        )
    return call.result()


async def _watch_interrupts(
    run: Run,
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
    journal, stream = run.journal, run.stream
    latest = await journal.latest(stream, [LlmRequestRequested])
    here = bool(latest) and latest[0].position == offset
    cursor = latest[0].cursor if here else await journal.head(stream)
    cancel.check()  # else the tail below would wait forever and hold the turn with it
    if answered.is_set():
        return None
    tailing.set()
    tail = journal.subscribe(stream, after=cursor, poll_interval=_INTERRUPT_POLL)
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
                log.warning("interrupt watcher skipped %s@%s: %s", stream, stored.position, exc)
                continue
            assert isinstance(item, ContextAdded)
            if behaviour_of(item) == "interrupt":
                return stored.position
    raise AssertionError("unreachable: subscribe never ends")


async def _record_output(
    run: Run, offset: int, output: ModelOutput, context: AgentContextState
) -> None:
    """Append the output of request @offset with its item; ``context``: one holding the
    request's items, whose calls the output's must not repeat (the agent's own calls are
    all in it)."""
    used = frozenset(call.id for item in context.history for call in item.tool_calls)
    kept, dropped = _split_calls(output.tool_calls)
    calls = _unique_calls(kept, used, offset)
    text = output.text
    if dropped:
        # e.g. a stream cut at max_tokens inside a call: recorded, its half-written
        # arguments would make every later request unrenderable. The model sees why.
        notes = "\n".join(
            f"[tool call {c.name} dropped: its arguments were not a JSON object]" for c in dropped
        )
        text = f"{text}\n{notes}" if text else notes
    response = LlmResponse(
        request_offset=offset,
        model=run.settings.model.model,
        text=text,
        tool_calls=calls,
        usage=output.usage,
        stop_reason=output.finish_reason,
    )
    item = assistant_item(response)
    run.saw(await run.journal.append(run.stream, [response, item], actor=AGENT))
    recorded_output = replace(output, text=text, tool_calls=calls)
    await run.emit(ResponseRecorded(offset=offset, output=recorded_output))


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
