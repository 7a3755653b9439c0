"""The worker pool: every stream of a namespace with pending triggers is claimed by lease
and answered, at most ``concurrency`` at a time and fairly; a stop finishes the step in
progress (or cancels it past the grace) and hands the lease back; provider errors back
off, store errors and lost leases never end the worker."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from contextfold.context.events import LlmResponse, ToolCallResult
from contextfold.errors import ConfigurationError, StoreUnavailableError
from contextfold.journal import Journal, open_journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.lease import StreamLeased, claim_lease, lease_table, read_lease
from contextfold.runtime.loop import Agent
from contextfold.runtime.worker import Worker
from contextfold.store.base import AppendResult, StreamInfo
from contextfold.store.memory import MemoryStore
from contextfold.testing import RecordingStore
from contextfold.wire import ModelOutput, NeutralRequest, ToolCall
from tests.runtime.helpers import (
    answered,
    echo_app,
    events_of,
    eventually,
    new_agent_stream,
    recorded_of,
    running,
    user,
)

FAST: dict[str, Any] = {"poll_interval": 0.02}


@pytest.fixture(params=["memory", "sqlite"])
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Journal]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'w.db'}"
    async with open_journal(url) as opened:
        yield opened


async def test_a_worker_answers_every_stream_with_pending_triggers(journal: Journal) -> None:
    streams = [f"chat/{n}" for n in range(6)]
    for stream in streams:
        await new_agent_stream(journal, stream)
    await journal.append("chat/unborn", user("no system prompt yet"))  # birth is pending
    await journal.append("notes", user("not an agent's stream"))
    worker = Worker(journal, echo_app(), concurrency=2, **FAST)
    async with running(worker):

        async def all_answered() -> bool:
            return all([await answered(journal, s) for s in streams])

        await eventually(all_answered, what="every stream answered")
        await journal.append(streams[0], user("and again"))  # a trigger arriving later
        await eventually(lambda: answered(journal, streams[0]), what="the later trigger")
    states = {r.stream: r.state for r in await lease_table(journal)}
    assert states == {s: "released" for s in streams}  # nothing to do elsewhere: unclaimed
    assert worker.stats.claims == 7 and worker.stats.steps == 7
    assert [e.text for _, e in await events_of(journal, streams[0], LlmResponse)] == ["ok"] * 2


async def test_without_the_lease_no_lease_is_written(journal: Journal) -> None:
    await new_agent_stream(journal, "chat")
    async with running(Worker(journal, echo_app(), lease=False, **FAST)):
        await eventually(lambda: answered(journal, "chat"), what="answered unleased")
    assert await lease_table(journal) == ()


async def test_concurrency_is_bounded(journal: Journal) -> None:
    active, peak, both = 0, 0, asyncio.Event()

    async def model(request: NeutralRequest) -> str:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        if active >= 2:
            both.set()
        await both.wait()  # holds the first one until a second is in flight
        active -= 1
        return "ok"

    streams = [f"chat/{n}" for n in range(5)]
    for stream in streams:
        await new_agent_stream(journal, stream)
    app = _app(FunctionModel(model))
    async with running(Worker(journal, app, concurrency=2, **FAST)):

        async def all_answered() -> bool:
            return all([await answered(journal, s) for s in streams])

        await eventually(all_answered, what="every stream answered")
    assert peak == 2


def _app(model: Any, **options: Any) -> Any:
    def app(journal: Journal, stream: str) -> Agent:
        return Agent(journal, stream, model, **options)

    return app


async def test_a_busy_stream_gives_its_slot_up_to_waiting_streams(journal: Journal) -> None:
    calls: list[str] = []
    busy_started, others_waiting = asyncio.Event(), asyncio.Event()

    async def model(request: NeutralRequest) -> ModelOutput | str:
        asked = next(m.content for m in request.messages if m.role == "user")
        calls.append(asked)
        rounds = sum(1 for m in request.messages if m.role == "tool")
        if "busy" in asked and rounds == 0:
            busy_started.set()
            await others_waiting.wait()
        if "busy" in asked and rounds < 8:
            return ModelOutput(tool_calls=(ToolCall(id=f"c{rounds}", name="noop", arguments="{}"),))
        return "done"

    def noop() -> str:
        """Do nothing."""
        return "nothing"

    await new_agent_stream(journal, "busy", "busy")
    app = _app(FunctionModel(model), tools=[noop])
    worker = Worker(journal, app, concurrency=1, quantum=2, **FAST)
    async with running(worker):
        await busy_started.wait()  # the one slot is taken by the busy stream
        for n in range(3):
            await new_agent_stream(journal, f"quick-{n}", f"quick {n}")

        async def queued() -> bool:
            return len(worker.waiting) == 3

        await eventually(queued, what="the quick streams wait")
        others_waiting.set()

        async def all_answered() -> bool:
            return all([await answered(journal, s) for s in ("busy", "quick-0", "quick-2")])

        await eventually(all_answered, what="every stream answered")
    busy = [i for i, asked in enumerate(calls) if "busy" in asked]
    quick = [i for i, asked in enumerate(calls) if "quick" in asked]
    assert busy[0] == 0 and len(busy) == 9 and len(quick) == 3
    assert max(quick) < busy[-1]  # the quick streams did not wait for the busy one's end


class Gate:
    """A model that blocks until ``open`` is set (and says when a call is in)."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.open = asyncio.Event()
        self.calls = 0

    async def __call__(self, request: NeutralRequest) -> str:
        self.calls += 1
        self.entered.set()
        await self.open.wait()
        return "finally"


async def test_stop_finishes_the_step_in_progress_and_hands_the_lease_back(
    journal: Journal,
) -> None:
    await new_agent_stream(journal, "chat")
    gate = Gate()
    worker = Worker(journal, _app(FunctionModel(gate)), **FAST)
    task = asyncio.create_task(worker.run())
    await gate.entered.wait()
    worker.stop()
    for _ in range(20):
        await asyncio.sleep(0)
    assert not task.done()  # the step in progress is not cut
    gate.open.set()
    await asyncio.wait_for(task, 30)
    assert await answered(journal, "chat")
    lease = await read_lease(journal, "chat")
    assert lease is not None and lease.state == "released"


async def test_past_the_grace_a_step_is_cut_and_another_worker_takes_over_at_once(
    journal: Journal,
) -> None:
    await new_agent_stream(journal, "chat")
    gate = Gate()
    first = Worker(journal, _app(FunctionModel(gate)), ttl=600, grace=0.05, **FAST)
    task = asyncio.create_task(first.run())
    await gate.entered.wait()
    first.stop()
    await asyncio.wait_for(task, 30)
    lease = await read_lease(journal, "chat")
    assert lease is not None and lease.state == "released"  # not left to lapse (600 s)
    async with running(Worker(journal, echo_app(), **FAST)):
        await eventually(lambda: answered(journal, "chat"), what="taken over")
    [(offset, shas)] = (await recorded_of(journal, "chat")).items()
    assert len(shas) == 2 and shas[0] == shas[1]  # re-sent byte for byte, as a retry
    assert [r.request_offset for _, r in await events_of(journal, "chat", LlmResponse)] == [offset]


async def test_provider_errors_hand_the_lease_back_as_a_growing_backoff(journal: Journal) -> None:
    calls = 0

    def flaky(request: NeutralRequest) -> str:
        nonlocal calls
        calls += 1
        if calls <= 2:
            raise ConnectionError("provider down")
        return "back"

    await new_agent_stream(journal, "chat")
    worker = Worker(journal, _app(FunctionModel(flaky)), backoff=0.3, **FAST)
    async with running(worker):
        await eventually(lambda: answered(journal, "chat"), what="answered after the outage")
    held_back = [
        (lease.failures, lease.expires_at - datetime.fromisoformat(stored.meta.time))
        async for stored in journal.read_all("chat", types=[StreamLeased])
        if (lease := StreamLeased.model_validate_json(stored.data)).state == "backoff"
    ]
    assert [failures for failures, _ in held_back] == [1, 2]
    (_, first), (_, second) = held_back
    assert first <= timedelta(seconds=0.3) < second <= timedelta(seconds=0.6)
    assert worker.stats.backoffs == 2 and calls == 3


class ShiftedClock:
    """The real time, moved forward by hand (a pause the holder does not notice)."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


async def test_a_lost_lease_ends_the_run_not_the_worker() -> None:
    clock = ShiftedClock()
    async with open_journal("memory://", clock=clock) as journal:
        await new_agent_stream(journal, "chat")
        gate = Gate()
        worker = Worker(journal, _app(FunctionModel(gate)), ttl=60, **FAST)
        async with running(worker) as task:
            await gate.entered.wait()
            clock.offset = timedelta(seconds=61)  # the worker's lease lapses meanwhile
            intruder = await claim_lease(journal, "chat", holder="intruder", ttl=600)
            gate.open.set()
            await eventually(lambda: _true(worker.stats.lost == 1), what="the loss noticed")
            assert not task.done()
            current = await read_lease(journal, "chat")
            assert current is not None and current.holder == "intruder"  # not released by it
            assert await events_of(journal, "chat", LlmResponse) == []  # its answer refused
            await intruder.release()
            await journal.append("chat", user("anyone there?"))
            await eventually(lambda: answered(journal, "chat"), what="served again")


async def _true(value: bool) -> bool:
    return value


async def test_an_app_building_on_another_journal_is_refused(journal: Journal) -> None:
    await new_agent_stream(journal, "chat")
    async with open_journal("memory://") as other:

        def app(given: Journal, stream: str) -> Agent:
            return Agent(other, stream, FunctionModel(lambda request: "unfenced"))

        worker = Worker(journal, app, **FAST)
        async with running(worker):
            await eventually(lambda: _true(worker.stats.backoffs >= 2), what="refused")
        # Refused before its claim landed: the worker rests alone, the journal untouched.
        assert await read_lease(journal, "chat") is None
        assert await events_of(other, "chat", LlmResponse) == []


class Flaky(MemoryStore):
    """A store that is unreachable while ``down`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.down = True
        self.refused = 0

    def _check(self) -> None:
        if self.down:
            self.refused += 1
            raise StoreUnavailableError("the test's store is down")

    async def list_streams(self, *args: Any, **kwargs: Any) -> tuple[StreamInfo, ...]:
        self._check()
        return await super().list_streams(*args, **kwargs)

    async def append(self, namespace: str, stream: str, events: Any, **kwargs: Any) -> AppendResult:
        self._check()
        return await super().append(namespace, stream, events, **kwargs)


async def test_store_errors_pause_the_worker_and_it_resumes() -> None:
    store = Flaky()
    journal = Journal(store)
    store.down = False
    await new_agent_stream(journal, "chat")
    store.down = True
    worker = Worker(journal, echo_app(), **FAST)
    async with running(worker):
        await eventually(lambda: _true(store.refused >= 3), what="the worker kept trying")
        store.down = False
        await eventually(lambda: answered(journal, "chat"), what="answered once it is back")
    assert worker.stats.store_errors >= 3


@pytest.mark.parametrize(
    "bad",
    [{"concurrency": 0}, {"quantum": 1.5}, {"ttl": -1}, {"grace": float("inf")}, {"app": 3}],
)
async def test_bad_settings_are_refused(bad: dict[str, Any]) -> None:
    async with open_journal("memory://") as journal:
        options: dict[str, Any] = {"app": echo_app(), **bad}
        with pytest.raises(ConfigurationError, match=next(iter(bad))):
            Worker(journal, **options)


async def test_tool_calls_are_answered_under_the_worker(journal: Journal) -> None:
    def model(request: NeutralRequest) -> ModelOutput | str:
        if request.messages[-2].role == "tool":
            return "the sum is " + request.messages[-2].content.splitlines()[-1]
        return ModelOutput(tool_calls=(ToolCall(id="c1", name="add", arguments='{"a":2,"b":3}'),))

    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    await new_agent_stream(journal, "chat")
    async with running(Worker(journal, _app(FunctionModel(model), tools=[add]), **FAST)):
        await eventually(lambda: answered(journal, "chat"), what="answered with the tool")
    [(_, result)] = await events_of(journal, "chat", ToolCallResult)
    assert result.content == "5"
    assert [e.text for _, e in await events_of(journal, "chat", LlmResponse)][-1] == "the sum is 5"


class Swallowing(MemoryStore):
    """A store whose ``latest`` swallows a cancel landing in it, as a connection pool's
    ``wait_for`` does on Python 3.11 when a connection frees up at that moment."""

    async def latest(self, *args: Any, **kwargs: Any) -> Any:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)
        return await super().latest(*args, **kwargs)


async def test_a_cancel_the_store_swallowed_does_not_hold_a_turn_forever() -> None:
    """The interrupt watcher of a request is cancelled once the answer is in; a cancel
    swallowed under it must still end it (a worker's agent would hang there, renewing its
    lease for ever)."""
    journal = Journal(Swallowing())
    await new_agent_stream(journal, "chat")
    agent = Agent(journal, "chat", FunctionModel(lambda request: "ok"))
    report = await asyncio.wait_for(agent.run_until_idle(), 30)  # a bound against the hang
    assert len(report.requests) == 1 and await answered(journal, "chat")


class SlowLatest(MemoryStore):
    """A store whose ``latest`` takes a moment, counting the calls cut short by a cancel."""

    def __init__(self) -> None:
        super().__init__()
        self.cut = self.finished = 0

    async def latest(self, *args: Any, **kwargs: Any) -> Any:
        try:
            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            self.cut += 1
            raise
        self.finished += 1
        return await super().latest(*args, **kwargs)


async def test_an_answered_request_lets_its_watcher_end_the_read_it_began() -> None:
    """An instant answer comes while the interrupt watcher still reads where its tail
    starts: the read is let end, not cut short (on PostgreSQL a cancelled query costs a
    cancel request, a connection of its own, for every turn)."""
    store = SlowLatest()
    journal = Journal(store)
    await new_agent_stream(journal, "chat")
    await Agent(journal, "chat", FunctionModel(lambda request: "ok")).run_until_idle()
    assert await answered(journal, "chat")
    assert store.cut == 0 and store.finished >= 1


async def test_a_scan_serves_the_streams_of_every_page_of_the_listing() -> None:
    """Past one page of the listing (here of 2) the streams of the next pages are served."""
    store = RecordingStore()
    journal = Journal(store)
    streams = [f"chat/{n}" for n in range(5)]
    for stream in streams:
        await new_agent_stream(journal, stream)
    worker = Worker(journal, echo_app(), **FAST)
    worker.scan_page_size = 2
    async with running(worker):

        async def all_answered() -> bool:
            return all([await answered(journal, s) for s in streams])

        await eventually(all_answered, what="every stream answered")
    first_scan = [c.args["after"] for c in store.of("list_streams")][:3]
    assert first_scan == [None, "chat/1", "chat/3"]
