"""The session prefix in the loop: composed once per Agent instance, logged in the header,
placed right after the system slot, recomposed by a new instance, never cached when cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from contextfold.context.events import ContextAdded, LlmRequestRequested, PrefixMessage
from contextfold.context.projection import AgentContext
from contextfold.context.rebuild import rebuild_request, verify_requests
from contextfold.journal import Journal, open_journal
from contextfold.render.prefix import Next, SessionPrefix
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.wire import ModelOutput, NeutralMessage, NeutralRequest, ToolCall
from tests.runtime.helpers import STREAM, Observer, events_of, fixed_clock, user


def note(text: str) -> str:
    """Take a note."""
    return f"noted: {text}"


def tool_once(request: NeutralRequest) -> ModelOutput:
    """Calls the note tool once per question, then answers."""
    if request.messages[-2].role == "tool":
        return ModelOutput(text="done")
    n = len(request.messages)
    return ModelOutput(
        text="noting", tool_calls=(ToolCall(id=f"c{n}", name="note", arguments='{"text": "x"}'),)
    )


class Catalog:
    """Two contributors (registered A then B) reading a mutable catalog, counting compositions."""

    def __init__(self) -> None:
        self.version = "v1"
        self.calls = {"a": 0, "b": 0}
        self.prefix = SessionPrefix()

        @self.prefix.contributor
        async def skills(next_: Any) -> tuple[NeutralMessage, ...]:
            self.calls["a"] += 1
            mine = NeutralMessage(role="user", content=f"<skills>{self.version}</skills>")
            return (mine, *await next_())

        @self.prefix.contributor
        async def agents_md(next_: Any) -> tuple[NeutralMessage, ...]:
            self.calls["b"] += 1
            mine = NeutralMessage(role="developer", content="AGENTS.md digest")
            return (mine, *await next_())


def body_messages(body: bytes) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = json.loads(body)["messages"]
    return messages


async def headers(journal: Journal) -> list[Any]:
    return [e.header for _, e in await events_of(journal, STREAM, LlmRequestRequested)]


async def test_composed_once_per_instance_in_registration_order(journal: Journal) -> None:
    catalog = Catalog()
    observer = Observer()
    await journal.append(STREAM, system_prompt("Agent."))
    agent = Agent(
        journal,
        STREAM,
        FunctionModel(tool_once),
        tools=[note],
        prefix=catalog.prefix,
        observer=observer,
    )
    for n in range(3):
        await journal.append(STREAM, user(f"question {n}"))
        catalog.version = f"v-changed-{n}"  # not re-read mid-instance
        await agent.run_until_idle()
    assert catalog.calls == {"a": 1, "b": 1}
    assert agent.settings.prefix.compositions == 1
    logged = await headers(journal)
    assert len(logged) == 6
    # One header snapshot for the instance, later requests repeat it (None).
    assert logged[0] is not None and logged[1:] == [None] * 5
    assert logged[0].session_prefix == (
        PrefixMessage(role="user", content="<skills>v-changed-0</skills>"),
        PrefixMessage(role="developer", content="AGENTS.md digest"),
    )
    for bodies in observer.sent.values():
        messages = body_messages(bodies[0].body)
        # protocol system text, the system lane (the prompt), then the prefix in order.
        assert messages[0]["role"] == "system"
        assert messages[1]["content"].endswith("\nAgent.")
        assert messages[2] == {"role": "user", "content": "<skills>v-changed-0</skills>"}
        assert messages[3] == {"role": "developer", "content": "AGENTS.md digest"}
        assert messages[4]["content"].endswith("question 0")
    # The prefix is request-only: never in the derived history.
    context = await journal.fold(AgentContext, STREAM)
    assert all("<skills>" not in item.content for item in context.items)
    assert context.header is not None and context.header.session_prefix == logged[0].session_prefix


async def test_rebuilds_include_the_prefix_and_a_new_instance_recomposes(journal: Journal) -> None:
    catalog = Catalog()
    observer = Observer()
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("first"))
    await Agent(
        journal,
        STREAM,
        FunctionModel(tool_once),
        tools=[note],
        prefix=catalog.prefix,
        observer=observer,
    ).run_until_idle()
    catalog.version = "v2"
    await journal.append(STREAM, user("second"))
    await Agent(
        journal,
        STREAM,
        FunctionModel(tool_once),
        tools=[note],
        prefix=catalog.prefix,
        observer=observer,
    ).run_until_idle()
    assert catalog.calls == {"a": 2, "b": 2}
    logged = [h for h in await headers(journal) if h is not None]
    assert [h.session_prefix[0].content for h in logged] == [
        "<skills>v1</skills>",
        "<skills>v2</skills>",
    ]
    for offset, bodies in observer.sent.items():
        rebuilt = await rebuild_request(journal, STREAM, offset)
        assert rebuilt.body == bodies[0].body
    texts = [body_messages(b[0].body)[2]["content"] for _, b in sorted(observer.sent.items())]
    assert texts == ["<skills>v1</skills>"] * 2 + ["<skills>v2</skills>"] * 2
    assert await verify_requests(journal, STREAM) == ()


async def _bodies_and_headers(prefix: SessionPrefix | None) -> tuple[list[bytes], list[bytes]]:
    async with open_journal("memory://", clock=fixed_clock()) as journal:
        observer = Observer()
        await journal.append(STREAM, system_prompt("Agent."))
        await journal.append(STREAM, user("hello"))
        await Agent(
            journal,
            STREAM,
            FunctionModel(tool_once),
            tools=[note],
            prefix=prefix,
            observer=observer,
        ).run_until_idle()
        stored = [
            s.data
            async for s in journal.read_all(STREAM)
            if s.type == LlmRequestRequested.event_type
        ]
        return [b[0].body for _, b in sorted(observer.sent.items())], stored


async def test_an_empty_composition_adds_nothing() -> None:
    empty = SessionPrefix()
    calls = []

    @empty.contributor
    async def passthrough(next_: Next) -> tuple[NeutralMessage, ...]:
        calls.append(1)
        return await next_()

    bare_bodies, bare_headers = await _bodies_and_headers(None)
    bodies, stored_headers = await _bodies_and_headers(empty)
    assert calls == [1]
    assert bodies == bare_bodies  # the bare derivation, byte for byte
    assert stored_headers == bare_headers  # no extra header bytes
    for body in bodies:
        assert len([m for m in body_messages(body) if m["role"] == "system"]) == 2


async def cancel_while_composing(
    journal: Journal, prefix: SessionPrefix, entered: asyncio.Event
) -> tuple[Agent, list[NeutralRequest]]:
    """A turn cancelled once ``entered`` is set (its prefix composing): the agent, and the
    list of the requests its model is sent from then on."""
    seen: list[NeutralRequest] = []

    def model(request: NeutralRequest) -> str:
        seen.append(request)
        return "ok"

    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("hi"))
    agent = Agent(journal, STREAM, FunctionModel(model), prefix=prefix)
    run = asyncio.create_task(agent.run_until_idle())
    await asyncio.wait_for(entered.wait(), 5)
    run.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await run
    return agent, seen


async def test_a_cancelled_composition_is_discarded_and_recomposed(journal: Journal) -> None:
    gate = asyncio.Event()
    entered = asyncio.Event()
    calls: list[str] = []
    prefix = SessionPrefix()

    @prefix.contributor
    async def slow(next_: Any) -> tuple[NeutralMessage, ...]:
        calls.append("slow")
        if len(calls) == 1:
            entered.set()
            await gate.wait()  # cancelled here
        return (NeutralMessage(role="user", content=f"catalog #{len(calls)}"), *await next_())

    agent, seen = await cancel_while_composing(journal, prefix, entered)
    assert agent.settings.prefix.composed is None
    assert await headers(journal) == []  # nothing was requested
    report = await agent.run_until_idle()  # the next turn composes under a live task
    assert len(report.requests) == 1
    assert calls == ["slow", "slow"]
    [header] = await headers(journal)
    assert header.session_prefix == (PrefixMessage(role="user", content="catalog #2"),)
    assert "catalog #2" in seen[0].messages[1].content


async def test_a_degraded_fallback_of_a_cancelled_composition_is_not_cached(
    journal: Journal,
) -> None:
    """An abort-aware contributor that swallows the cancel and returns a fallback: the
    fallback must reach neither this request nor a later one."""
    gate = asyncio.Event()
    entered = asyncio.Event()
    calls: list[str] = []
    prefix = SessionPrefix()

    @prefix.contributor
    async def abort_aware(next_: Any) -> tuple[NeutralMessage, ...]:
        calls.append("call")
        if len(calls) == 1:
            entered.set()
            try:
                await gate.wait()
            except asyncio.CancelledError:
                return (NeutralMessage(role="user", content="DEGRADED"), *await next_())
        return (NeutralMessage(role="user", content="full catalog"), *await next_())

    agent, seen = await cancel_while_composing(journal, prefix, entered)
    await agent.run_until_idle()
    assert seen, "the next turn sends the request"
    for request in seen:
        assert all("DEGRADED" not in m.content for m in request.messages)
    assert all("DEGRADED" not in repr(h) for h in await headers(journal))
    assert "full catalog" in seen[-1].messages[1].content


async def test_the_pressure_gate_counts_a_grown_prefix_of_a_new_instance(journal: Journal) -> None:
    """Composition precedes the gate: a resumed instance whose contributor grew compacts
    before its first request instead of shipping an over-window request."""
    summaries: list[NeutralRequest] = []

    def model(request: NeutralRequest) -> ModelOutput:
        if request.messages[-1].content.startswith("Summarize the conversation"):
            summaries.append(request)
            return ModelOutput(text="summary")
        return ModelOutput(text="ok")

    size = {"chars": 10}
    prefix = SessionPrefix()

    @prefix.contributor
    async def catalog(next_: Any) -> tuple[NeutralMessage, ...]:
        return (NeutralMessage(role="user", content="c" * size["chars"]), *await next_())

    def instance() -> Agent:
        local = FunctionModel(model, model="contextfold-local")  # an 8k-token window
        return Agent(journal, STREAM, local, prefix=prefix, compaction_threshold=0.5)

    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("first"))
    first = await instance().run_until_idle()
    assert first.compactions == []
    size["chars"] = 20_000  # ~5k tokens: over half the window with the prefix alone
    await journal.append(STREAM, user("second"))
    second = await instance().run_until_idle()
    # The gate summarized the previous request before this instance's first one went out
    # (after it, the measured usage of the big request compacts again: the prefix alone
    # is over the threshold).
    assert second.compactions[0] == first.requests[0]
    context = await journal.fold(AgentContext, STREAM)
    [summary_at] = [i.offset for i in context.history if i.compaction is not None]
    assert summary_at > second.requests[0] > first.requests[0]
    gate = [
        p for p, e in await events_of(journal, STREAM, ContextAdded) if e.compaction is not None
    ]
    assert gate[0] < second.requests[0]
    # The summarizer got the previous instance's exact request (its small prefix).
    assert all(len(m.content) < 1000 for m in summaries[0].messages)
