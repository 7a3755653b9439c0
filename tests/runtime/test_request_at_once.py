"""A request and its record go in one append: the record's body is built from the context
the request is made from, with the header and time the journal gives the request, so the
journal holds what two appends stored (the same events, order, actors, channels and clock
readings) and verifies; when the stream is not where the context was read, the two
appends go as before, after what landed."""

from __future__ import annotations

from typing import Any

import contextfold as cf
from contextfold.context.events import LlmRequestInterrupted, LlmRequestRequested
from contextfold.context.rebuild import RequestRecorded, verify_requests
from contextfold.journal import Journal
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.store.memory import MemoryStore
from tests.runtime.helpers import STREAM, events_of, fixed_clock


def lookup(path: str) -> str:
    """Read a file."""
    return f"contents of {path}"


def _model(request: cf.NeutralRequest) -> cf.ModelOutput | str:
    if request.messages[-2].role == "tool":
        return "done"
    return cf.ModelOutput(tool_calls=(cf.ToolCall(id="c1", name="lookup", arguments="{}"),))


class CountingStore(MemoryStore):
    appends = 0

    async def append(self, *args: Any, **options: Any) -> Any:
        self.appends += 1
        return await super().append(*args, **options)


async def test_a_request_and_its_record_are_one_append() -> None:
    store = CountingStore()
    journal = Journal(store, clock=fixed_clock())
    agent = Agent(journal, STREAM, cf.FunctionModel(_model), tools=[lookup])
    await journal.append(
        STREAM, [system_prompt("You read files."), cf.ContextAdded(role="user", content="go")]
    )
    before = store.appends
    report = await agent.run_until_idle()
    assert len(report.requests) == 2 and report.tool_calls == 1
    assert store.appends - before <= 6  # two appends fewer than a request and a record apart
    stored = [e async for e in journal.read_all(STREAM)]
    for offset in report.requests:
        request, record = stored[offset - 1], stored[offset]
        assert request.type == LlmRequestRequested.event_type
        assert RequestRecorded.model_validate_json(record.data).request_offset == offset
        assert (request.meta.actor, request.meta.channels) == ("agent", ("main",))
        assert (record.meta.actor, record.meta.channels) == ("agent", ())
        assert request.meta.time < record.meta.time  # a clock reading each, as apart
    assert await verify_requests(journal, STREAM) == ()


async def test_an_item_landing_while_a_sealed_request_is_replaced_is_in_the_new_one() -> None:
    """The context is read before the seal is appended: an item landing in between is
    after what the context holds, so the request cannot go at once at the seal's version
    (it would miss the item); it goes in two appends, built from the journal."""
    journal = cf.open_journal("memory://", clock=fixed_clock())
    await journal.append(
        STREAM, [system_prompt("You answer."), cf.ContextAdded(role="user", content="hi")]
    )
    await journal.append(STREAM, LlmRequestRequested(reason="not the agent's"), actor="webhook")
    append = journal.append
    landed: list[int] = []

    async def with_an_item_first(stream: str, events: Any, **options: Any) -> Any:
        if isinstance(events, LlmRequestInterrupted) and not landed:
            done = await append(stream, cf.ContextAdded(role="user", content="also this"))
            landed.append(done.first_position)
        return await append(stream, events, **options)

    journal.append = with_an_item_first  # type: ignore[method-assign]
    sent: list[cf.NeutralRequest] = []

    def answer(request: cf.NeutralRequest) -> str:
        sent.append(request)
        return "ok"

    report = await Agent(journal, STREAM, cf.FunctionModel(answer)).run_until_idle()
    assert report.interrupted and landed and sent
    offsets = [m.content.split("\n", 1)[0].split(" ")[0] for m in sent[0].messages]
    assert f"@{landed[0]}" in offsets
    assert await verify_requests(journal, STREAM) == ()
    recorded = await events_of(journal, STREAM, RequestRecorded)
    assert [r.request_offset for _, r in recorded] == report.requests
