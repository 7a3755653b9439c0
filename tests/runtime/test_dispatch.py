"""Event-driven turns: dispatch, coalescing, steers, backpressure, and the recorded manifest."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from contextfold.context.events import ContextAdded, LlmResponse
from contextfold.context.manifest import Manifest, manifest_of
from contextfold.context.rebuild import RequestRecorded, rebuild_manifest, verify_requests
from contextfold.context.turns import (
    SteerAccepted,
    TurnCompiled,
    TurnState,
    item_sha256,
    turn_state,
    turns_through,
)
from contextfold.errors import (
    BackpressureError,
    ConfigurationError,
    PayloadError,
    StoreUnavailableError,
)
from contextfold.events import runtime_only_types
from contextfold.journal import Journal
from contextfold.render.envelope import (
    RecentMessage,
    RecentThread,
    TurnBatch,
    TurnContext,
    TurnEvent,
    compile_turn,
)
from contextfold.runtime import dispatch as dispatch_module
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.dispatch import Receipt, TurnDispatcher, TurnEventQueued
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.wire import ModelOutput, NeutralRequest, ToolCall
from tests.runtime.helpers import STREAM, Observer, events_of, text_of

DELIVERY = TurnContext(delivery=(("scope", "thread"),))


def _event(
    event_id: str, actor: str = "pk-morgan", root: str | None = "t-1", content: str = "hi"
) -> TurnEvent:
    return TurnEvent(
        kind="mention",
        author=actor.removeprefix("pk-").title(),
        actor=actor,
        event_id=event_id,
        content=content,
        thread_root=root,
    )


async def _agent(
    journal: Journal,
    fn: Callable[[NeutralRequest], ModelOutput | str | Awaitable[ModelOutput | str]],
    **options: Any,
) -> Agent:
    await journal.append(STREAM, system_prompt("You help in chat."), actor="agent")
    return Agent(journal, STREAM, FunctionModel(fn), **options)


async def _recorded(journal: Journal) -> list[RequestRecorded]:
    return [record for _, record in await events_of(journal, STREAM, RequestRecorded)]


async def _manifests(journal: Journal) -> list[Manifest | None]:
    return [record.manifest for record in await _recorded(journal)]


def _done(_: NeutralRequest) -> str:
    return "done"


async def test_a_dispatched_turn_is_its_envelope_and_its_request_records_the_manifest(
    journal: Journal,
) -> None:
    observer = Observer()
    agent = await _agent(journal, _done, observer=observer)
    dispatcher = TurnDispatcher(journal, STREAM, context=DELIVERY)
    for event in (_event("t-1", root=None, content="The deploy fails."), _event("e-2")):
        assert (await dispatcher.receive(event)).status == "queued"
    turn = await dispatcher.dispatch()
    assert turn is not None and [e.event_id for e in turn.batch.events] == ["t-1", "e-2"]
    assert turn.compiled == compile_turn(turn.batch, DELIVERY)
    [(at, record)] = await events_of(journal, STREAM, TurnCompiled)
    [item] = [e for p, e in await events_of(journal, STREAM, ContextAdded) if p == at + 1]
    assert (at, item.content, item.role) == (turn.position, turn.compiled.text, "user")
    assert record.manifest == turn.compiled.manifest

    report = await agent.run_until_idle()
    [offset] = report.requests
    assert "<buzz-turn>" in text_of(observer.neutral[offset][0])
    assert await _manifests(journal) == [turn.compiled.manifest]
    assert await rebuild_manifest(journal, STREAM, offset) == turn.compiled.manifest
    assert await verify_requests(journal, STREAM) == ()
    assert not (await dispatcher.turn()).open  # the final answer settled the turn
    assert await dispatcher.dispatch() is None  # nothing waits


async def test_turns_split_by_actor_and_destination_each_with_its_manifest(
    journal: Journal,
) -> None:
    agent = await _agent(journal, _done)
    dispatcher = TurnDispatcher(journal, STREAM)
    events = [
        _event("e-1"),
        _event("e-2"),
        _event("e-3", actor="pk-alex"),
        _event("e-4", root="t-2"),
        _event("e-5"),
    ]
    for event in events:
        await dispatcher.receive(event)
    turns = await dispatcher.run(agent)
    assert [[e.event_id for e in t.batch.events] for t in turns] == [
        ["e-1", "e-2"],
        ["e-3"],
        ["e-4"],
        ["e-5"],
    ]
    assert await _manifests(journal) == [t.compiled.manifest for t in turns]
    assert len({t.compiled.manifest.hash for t in turns}) == 4
    assert await verify_requests(journal, STREAM) == ()


async def test_a_steer_is_journaled_before_it_is_acknowledged_and_changes_the_manifest(
    journal: Journal,
) -> None:
    dispatcher = TurnDispatcher(journal, STREAM)
    receipts: list[Receipt] = []
    seen: list[int] = []

    async def model(request: NeutralRequest) -> ModelOutput | str:
        if not receipts:  # the first request of the turn: a steer arrives meanwhile
            receipt = await dispatcher.receive(_event("s-1", content="Also check staging."))
            receipts.append(receipt)
            # Acknowledged means recorded: the record and its item are in the journal.
            steers = await events_of(journal, STREAM, SteerAccepted)
            seen.extend(p for p, _ in steers)
        return "done"

    agent = await _agent(journal, model)
    await dispatcher.receive(_event("e-1"))
    [turn] = await dispatcher.run(agent)
    assert [r.status for r in receipts] == ["injected"]
    assert seen == [receipts[0].position]
    first, second = await _recorded(journal)
    assert first.manifest == turn.compiled.manifest
    assert second.manifest is not None and second.manifest != first.manifest
    added = [x for x in second.manifest.layers if x.version == "s-1"]
    assert [(x.layer, x.order) for x in added] == [("current_instruction", 7)]
    assert second.manifest == manifest_of((*turn.compiled.manifest.layers, *added))
    assert await rebuild_manifest(journal, STREAM, second.request_offset) == second.manifest
    assert await verify_requests(journal, STREAM) == ()
    # The turn stayed open for the steer the first answer had not seen, then settled.
    assert not (await dispatcher.turn()).open


async def test_an_event_of_another_actor_or_thread_waits_for_its_own_turn(
    journal: Journal,
) -> None:
    dispatcher = TurnDispatcher(journal, STREAM)
    receipts: list[Receipt] = []

    async def model(request: NeutralRequest) -> str:
        if not receipts:
            receipts.append(await dispatcher.receive(_event("x-1", actor="pk-alex")))
            receipts.append(await dispatcher.receive(_event("x-2", root="t-9")))
        return "done"

    agent = await _agent(journal, model)
    await dispatcher.receive(_event("e-1"))
    turns = await dispatcher.run(agent)
    assert [r.status for r in receipts] == ["queued", "queued"]
    assert [[e.event_id for e in t.batch.events] for t in turns] == [["e-1"], ["x-1"], ["x-2"]]
    assert await _manifests(journal) == [t.compiled.manifest for t in turns]


def _refusing(
    journal: Journal, monkeypatch: pytest.MonkeyPatch, error: Exception, *, write: bool = False
) -> list[int]:
    """Make every append carrying a SteerAccepted raise ``error`` (after writing it, when
    ``write``); returns the list of attempts."""
    attempts: list[int] = []
    original = journal.append

    async def append(stream: str, events: Any, **options: Any) -> Any:
        batch = events if isinstance(events, list) else [events]
        if any(isinstance(e, SteerAccepted) for e in batch):
            attempts.append(len(attempts))
            if write and len(attempts) == 1:
                await original(stream, events, **options)
            if not write or len(attempts) == 1:
                raise error
        return await original(stream, events, **options)

    monkeypatch.setattr(journal, "append", append)
    return attempts


def _tool_then_done(steer: Callable[[], Awaitable[None]]) -> Any:
    """A model whose first answer calls a tool (so the turn has a second request) and which
    tries a steer during its first request."""
    state = {"calls": 0}

    async def model(request: NeutralRequest) -> ModelOutput | str:
        state["calls"] += 1
        if state["calls"] == 1:
            await steer()
            return ModelOutput(tool_calls=(ToolCall(id="c1", name="noop", arguments="{}"),))
        return "done"

    return model


def noop() -> str:
    """Do nothing."""
    return "ok"


@pytest.mark.parametrize(
    "error",
    [
        PayloadError("payload over the size limit"),
        StoreUnavailableError("the store could not be reached"),
    ],
    ids=["failed", "indeterminate"],
)
async def test_a_failed_or_indeterminate_steer_is_not_added(
    journal: Journal, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    dispatcher = TurnDispatcher(journal, STREAM)
    raised: list[BaseException] = []

    async def steer() -> None:
        with pytest.raises(type(error)) as caught:
            await dispatcher.receive(_event("s-1"))
        raised.append(caught.value)

    attempts = _refusing(journal, monkeypatch, error)
    agent = await _agent(journal, _tool_then_done(steer), tools=[noop])
    await dispatcher.receive(_event("e-1"))
    [turn] = await dispatcher.run(agent)
    assert raised == [error]
    # An indeterminate append is retried once under its key; a refused one is not.
    assert len(attempts) == (2 if isinstance(error, StoreUnavailableError) else 1)
    assert await events_of(journal, STREAM, SteerAccepted) == []
    assert await _manifests(journal) == [turn.compiled.manifest] * 2
    assert "s-1" not in [e.event_id for e in await dispatcher.pending()]
    assert await verify_requests(journal, STREAM) == ()


async def test_an_indeterminate_steer_that_was_written_is_injected_once(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher = TurnDispatcher(journal, STREAM)
    receipts: list[Receipt] = []

    async def steer() -> None:
        receipts.append(await dispatcher.receive(_event("s-1")))

    _refusing(journal, monkeypatch, StoreUnavailableError("connection lost"), write=True)
    agent = await _agent(journal, _tool_then_done(steer), tools=[noop])
    await dispatcher.receive(_event("e-1"))
    [turn] = await dispatcher.run(agent)
    assert [(r.status, r.deduplicated) for r in receipts] == [("injected", True)]
    assert len(await events_of(journal, STREAM, SteerAccepted)) == 1
    first, second = await _manifests(journal)
    assert first == turn.compiled.manifest and second != first
    assert await verify_requests(journal, STREAM) == ()


async def test_a_turn_that_settles_before_the_steer_lands_starts_a_new_turn(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    dispatcher = TurnDispatcher(journal, STREAM)
    await dispatcher.receive(_event("e-1"))
    turn = await dispatcher.dispatch()
    assert turn is not None
    original = turn_state
    settled: list[int] = []

    async def looked(journal: Journal, stream: str) -> TurnState:
        state = await original(journal, stream)
        if state.open and state.turn_at is not None and not settled:
            # The agent's final answer lands after the dispatcher saw the turn open.
            answer = LlmResponse(request_offset=state.turn_at + 2, model="m", text="done")
            settled.append((await journal.append(stream, answer, actor="agent")).first_position)
        return state

    monkeypatch.setattr(dispatch_module, "turn_state", looked)
    receipt = await dispatcher.receive(_event("s-1"))
    assert receipt.status == "started-new-turn"
    assert await events_of(journal, STREAM, SteerAccepted) == []
    assert [e.event_id for e in await dispatcher.pending()] == ["s-1"]
    state = await dispatcher.turn()
    assert not state.open and state.event_ids == ("e-1",)


async def test_backpressure_past_500_pending_events_for_a_destination(
    journal: Journal,
) -> None:
    dispatcher = TurnDispatcher(journal, STREAM)
    events = [_event(f"e-{n}") for n in range(500)]
    for event in events:
        await dispatcher.receive(event)
    before = await journal.version(STREAM)
    with pytest.raises(BackpressureError, match="500 events already wait") as caught:
        await dispatcher.receive(_event("e-500"))
    assert (caught.value.destination, caught.value.limit) == ("t-1", 500)
    assert await journal.version(STREAM) == before  # refused: nothing recorded
    other = await dispatcher.receive(_event("u-1", root="t-2"))  # another destination
    assert other.status == "queued"

    agent = await _agent(journal, _done)
    turns = await dispatcher.run(agent)
    # At most 50 per batch; the rest wait for the next turn: nothing dropped, order kept.
    assert [len(t.batch.events) for t in turns] == [50] * 10 + [1]
    taken = [e.event_id for t in turns for e in t.batch.events]
    assert taken == [e.event_id for e in events] + ["u-1"]
    assert await dispatcher.pending() == ()


async def test_a_full_turn_takes_no_more_steers(journal: Journal) -> None:
    dispatcher = TurnDispatcher(journal, STREAM, max_batch=2)
    for n in (1, 2):
        await dispatcher.receive(_event(f"e-{n}"))
    assert await dispatcher.dispatch() is not None
    receipt = await dispatcher.receive(_event("e-3"))
    assert receipt.status == "started-new-turn"
    assert [e.event_id for e in await dispatcher.pending()] == ["e-3"]


async def test_waiting_events_survive_the_dispatcher_and_repeats_are_deduplicated(
    journal: Journal,
) -> None:
    first = TurnDispatcher(journal, STREAM)
    for n in (1, 2):
        await first.receive(_event(f"e-{n}"))
    again = await first.receive(_event("e-1"))
    assert again.deduplicated and again.status == "queued"
    assert len(await events_of(journal, STREAM, TurnEventQueued)) == 2
    restarted = TurnDispatcher(journal, STREAM)
    assert [e.event_id for e in await restarted.pending()] == ["e-1", "e-2"]
    turn = await restarted.dispatch()
    assert turn is not None and len(turn.batch.events) == 2


async def test_the_context_may_be_resolved_per_batch(journal: Journal) -> None:
    seen: list[TurnBatch] = []

    async def resolve(batch: TurnBatch) -> TurnContext:
        seen.append(batch)
        message = RecentMessage("t-1", "pk-alex", "2026-01-01T00:00:00Z", "It broke.", "Alex")
        return TurnContext(recent=RecentThread((message,), total=1))

    dispatcher = TurnDispatcher(journal, STREAM, context=resolve)
    await dispatcher.receive(_event("e-1"))
    turn = await dispatcher.dispatch()
    assert turn is not None and seen == [turn.batch]
    assert "Alex: It broke." in turn.compiled.text
    assert "recent_thread_delta" in [x.layer for x in turn.compiled.manifest.layers]


async def test_verify_reports_a_turn_record_whose_item_is_not_its_envelope(
    journal: Journal,
) -> None:
    agent = await _agent(journal, _done)
    compiled = compile_turn(_event("e-1"))
    record = TurnCompiled(
        actor="pk-morgan",
        destination="t-1",
        event_ids=("e-1",),
        manifest=compiled.manifest,
        item_sha256=item_sha256(compiled.text),
    )
    forged = ContextAdded(role="user", content="something else")
    await journal.append(STREAM, [record, forged], actor="agent")
    await agent.run_until_idle()
    [drift] = await verify_requests(journal, STREAM)
    assert drift.error is not None and "is not the envelope its record compiled" in drift.error


async def test_verify_reports_a_recorded_manifest_the_turn_records_do_not_give(
    journal: Journal,
) -> None:
    agent = await _agent(journal, _done)
    dispatcher = TurnDispatcher(journal, STREAM)
    await dispatcher.receive(_event("e-1"))
    await dispatcher.run(agent)
    [record] = await _recorded(journal)
    assert record.manifest is not None
    other = manifest_of(record.manifest.layers[1:])
    await journal.append(STREAM, record.model_copy(update={"manifest": other}), actor="agent")
    [drift] = await verify_requests(journal, STREAM)
    assert drift.request_offset == record.request_offset
    assert drift.error is not None and f"recorded manifest {other.hash}" in drift.error


async def test_a_request_outside_a_turn_records_no_manifest(journal: Journal) -> None:
    agent = await _agent(journal, _done)
    await journal.append(STREAM, ContextAdded(role="user", content="plain"), actor="user")
    await agent.run_until_idle()
    [record] = await _recorded(journal)
    assert record.manifest is None
    assert b"manifest" not in record.to_json()  # stored exactly as before manifests


def test_the_dispatch_records_are_runtime_only() -> None:
    names = {TurnCompiled.event_type, SteerAccepted.event_type, TurnEventQueued.event_type}
    assert names <= runtime_only_types()


@pytest.mark.parametrize(
    "options", [{"max_pending": 0}, {"max_batch": 51}, {"max_batch": True}], ids=str
)
def test_limits_are_checked(journal: Journal, options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError, match="TurnDispatcher max_"):
        TurnDispatcher(journal, STREAM, **options)


async def test_the_turn_state_reads_from_the_newest_turn_and_equals_the_whole_fold(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await turn_state(journal, STREAM) == TurnState()  # no turn: one look-up
    agent = await _agent(journal, _done)
    dispatcher = TurnDispatcher(journal, STREAM)
    for n, root in enumerate(("t-1", "t-2", "t-3")):
        await dispatcher.receive(_event(f"e-{n}", root=root))
    await dispatcher.run(agent)
    for position in range(1, await journal.version(STREAM) + 1):
        assert await turn_state(journal, STREAM, position) == await turns_through(
            journal, STREAM, position
        )
    reads: list[str | None] = []
    original = journal.read_all

    def read_all(stream: str, **options: Any) -> Any:
        reads.append(options.get("after"))
        return original(stream, **options)

    monkeypatch.setattr(journal, "read_all", read_all)
    [newest] = await journal.latest(STREAM, [TurnCompiled])
    await turn_state(journal, STREAM)
    assert reads == [newest.cursor]  # nothing before the newest turn is read


async def test_an_event_id_longer_than_a_key_is_queued_dispatched_and_deduplicated(
    journal: Journal,
) -> None:
    # Keys made from an external event id stay within the journal's 200-character limit.
    long_id = "webhook-" + "x" * 400
    dispatcher = TurnDispatcher(journal, STREAM)
    queued = await dispatcher.receive(_event(long_id))
    assert queued.status == "queued" and not queued.deduplicated
    again = await TurnDispatcher(journal, STREAM).receive(_event(long_id))
    assert again.deduplicated
    turn = await dispatcher.dispatch()
    assert turn is not None and [e.event_id for e in turn.batch.events] == [long_id]
