"""Leases: a claim is a runtime-only event landing at an expected version; the holder's
appends are fenced (a takeover after expiry refuses them, nothing is written, the agent
stops); a takeover resumes from the journal (the unanswered request re-sent byte for byte
as a recorded retry, a started side-effecting tool reported as possibly run)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold.context.events import ContextAdded, LlmResponse, ToolCallResult
from contextfold.errors import (
    ConfigurationError,
    LeaseHeldError,
    LeaseLostError,
    WrongExpectedVersionError,
)
from contextfold.events import runtime_only_types
from contextfold.journal import Journal, open_journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.lease import (
    StreamLease,
    StreamLeased,
    claim_lease,
    confirm_claim,
    hold_lease,
    lease_table,
    read_lease,
)
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.tool_runs import NOT_RERUN
from contextfold.runtime.tools import Tool, ToolContext
from contextfold.testing import RecordingStore
from contextfold.wire import NeutralRequest
from tests.runtime.helpers import (
    CALL,
    STREAM,
    Charges,
    charge_tool,
    charging_model,
    events_of,
    recorded_of,
    user,
)


class Clock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def journal(clock: Clock) -> AsyncIterator[Journal]:
    async with open_journal("memory://", clock=clock) as opened:
        yield opened


async def test_a_claim_is_a_runtime_only_event_naming_holder_and_expiry(
    journal: Journal, clock: Clock
) -> None:
    await journal.append(STREAM, user("hi"))
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=10)
    [(position, event)] = await events_of(journal, STREAM, StreamLeased)
    assert StreamLeased.event_type in runtime_only_types()
    assert (position, event.holder, event.state) == (2, "w1", "held")
    assert event.expires_at == clock.now + timedelta(seconds=10) == lease.expires_at
    record = await read_lease(journal, STREAM)
    assert record is not None and record.status(clock.now) == "held"
    assert await lease_table(journal) == (record,)


async def test_a_held_lease_refuses_another_claim_and_writes_nothing(
    journal: Journal, clock: Clock
) -> None:
    await claim_lease(journal, STREAM, holder="w1", ttl=10)
    version = await journal.version(STREAM)
    with pytest.raises(LeaseHeldError, match="leased to 'w1'") as caught:
        await claim_lease(journal, STREAM, holder="w2", ttl=10)
    assert caught.value.holder == "w1" and caught.value.stream == STREAM
    assert caught.value.expires_at == (clock.now + timedelta(seconds=10)).isoformat()
    assert await journal.version(STREAM) == version


async def test_the_holder_may_claim_its_own_lease_again(journal: Journal) -> None:
    await claim_lease(journal, STREAM, holder="w1", ttl=10)
    again = await claim_lease(journal, STREAM, holder="w1", ttl=10)
    assert again.active


@pytest.mark.parametrize("bad", [{"holder": ""}, {"ttl": 0}, {"ttl": float("nan")}])
async def test_bad_settings_are_refused(journal: Journal, bad: dict[str, Any]) -> None:
    settings: dict[str, Any] = {"holder": "w1", "ttl": 10.0, **bad}
    with pytest.raises(ConfigurationError, match=next(iter(bad))):
        await claim_lease(journal, STREAM, **settings)
    assert await journal.version(STREAM) == 0


async def test_after_expiry_a_takeover_fences_the_old_holder_off(
    journal: Journal, clock: Clock
) -> None:
    old = await claim_lease(journal, STREAM, holder="w1", ttl=10)
    await old.journal.append(STREAM, user("written while held"))
    clock.advance(11)
    new = await claim_lease(journal, STREAM, holder="w2", ttl=10)
    version = await journal.version(STREAM)
    with pytest.raises(LeaseLostError, match="leased by 'w2'") as caught:
        await old.journal.append(STREAM, user("too late"))
    assert caught.value.holder == "w1" and caught.value.position == new.version
    assert old.lost and not old.active
    assert await journal.version(STREAM) == version  # nothing written
    with pytest.raises(LeaseLostError):  # and every later append is refused at once
        await old.renew()
    await new.journal.append(STREAM, user("the new holder writes"))


async def test_other_writers_do_not_break_the_fence(journal: Journal) -> None:
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=10)
    for n in range(3):
        await journal.append(STREAM, user(f"someone else {n}"))
        done = await lease.journal.append(STREAM, user(f"holder {n}"))
        assert done.version == lease.version == await journal.version(STREAM)
    # appends to other streams pass through untouched
    await lease.journal.append("elsewhere", user("not leased"))
    assert await journal.version("elsewhere") == 1


async def test_an_expected_version_of_the_caller_still_goes_through_the_fence(
    journal: Journal, clock: Clock
) -> None:
    old = await claim_lease(journal, STREAM, holder="w1", ttl=10)
    clock.advance(11)
    await claim_lease(journal, STREAM, holder="w2", ttl=10)
    current = await journal.version(STREAM)
    with pytest.raises(LeaseLostError):
        await old.journal.append(STREAM, user("late"), expected_version=current)
    lease = await claim_lease(journal, "other", holder="w1", ttl=10)
    with pytest.raises(WrongExpectedVersionError):
        await lease.journal.append("other", user("stale"), expected_version=0)


async def test_a_holder_paused_past_its_expiry_renews_with_its_append(
    journal: Journal, clock: Clock
) -> None:
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=10)
    clock.advance(11)  # nobody took over meanwhile
    done = await lease.journal.append(STREAM, user("late but still the holder"))
    [_, renewal] = [e for _, e in await events_of(journal, STREAM, StreamLeased)]
    assert renewal.token == lease.token and renewal.expires_at == clock.now + timedelta(seconds=10)
    assert (done.first_position, done.last_position) == (2, 3)  # one append, the renewal last
    with pytest.raises(LeaseHeldError):
        await claim_lease(journal, STREAM, holder="w2", ttl=10)


async def test_an_append_carries_the_renewal_once_a_sixth_of_the_ttl_has_passed(
    journal: Journal, clock: Clock
) -> None:
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=12)
    clock.advance(1.9)  # not yet: less than a sixth of the ttl since the claim
    early = await lease.journal.append(STREAM, user("early"))
    assert early.first_position == early.last_position == 2
    clock.advance(0.2)
    due = await lease.journal.append(STREAM, [user("one"), user("two")])
    assert (due.first_position, due.last_position) == (3, 5)
    [_, renewal] = await events_of(journal, STREAM, StreamLeased)
    assert renewal[0] == 5 and renewal[1].token == lease.token
    assert renewal[1].expires_at == lease.expires_at == clock.now + timedelta(seconds=12)
    keyed = await lease.journal.append(STREAM, user("keyed"), idempotency_key="k")
    assert keyed.first_position == keyed.last_position  # a keyed batch is only its events
    assert (await lease.journal.append(STREAM, user("keyed"), idempotency_key="k")).deduplicated


class _Sleeps:
    """``asyncio`` as the fence sees it, but each ``sleep`` is noted and waits for the test
    to let it end (the test moves the clock by hand meanwhile)."""

    def __init__(self) -> None:
        self.asked: list[float] = []
        self.wake = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        await self.wake.wait()
        self.wake.clear()


async def test_the_background_renewal_writes_nothing_after_an_append_renewed(
    journal: Journal, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    from contextfold.runtime import fence

    sleeps = _Sleeps()
    monkeypatch.setattr(fence, "asyncio", sleeps)
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=9)
    async with lease.renewing():
        while not sleeps.asked:
            await asyncio.sleep(0)
        assert sleeps.asked == [3.0]  # due a third of the ttl after the claim
        clock.advance(3.5)  # past it, but an append comes first and renews
        await lease.journal.append(STREAM, user("busy"))
        assert [p for p, _ in await events_of(journal, STREAM, StreamLeased)] == [1, 3]
        sleeps.wake.set()
        while len(sleeps.asked) < 2:
            await asyncio.sleep(0)
        assert sleeps.asked[1] == 3.0  # woken, it saw the renewal and waits again
        assert [p for p, _ in await events_of(journal, STREAM, StreamLeased)] == [1, 3]
        clock.advance(3.0)  # no append this time: the background renewal writes it
        sleeps.wake.set()
        while len(await events_of(journal, STREAM, StreamLeased)) < 3:
            await asyncio.sleep(0)
    assert [p for p, _ in await events_of(journal, STREAM, StreamLeased)] == [1, 3, 4]


async def test_a_deleted_stream_loses_the_lease(journal: Journal) -> None:
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=10)
    await journal.delete_stream(STREAM)
    await journal.append(STREAM, [user("recreated"), user("and grown")])
    with pytest.raises(LeaseLostError, match="deleted"):
        await lease.journal.append(STREAM, user("into the new history"))


async def test_release_frees_the_stream_and_backoff_holds_it_back(
    journal: Journal, clock: Clock
) -> None:
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=10)
    await lease.release()
    with pytest.raises(LeaseLostError, match="released"):
        await lease.journal.append(STREAM, user("after release"))
    taken = await claim_lease(journal, STREAM, holder="w2", ttl=10)  # at once, no expiry wait
    await taken.release(backoff=5, failures=3)
    for holder in ("w2", "w3"):  # a backoff binds its own holder too
        with pytest.raises(LeaseHeldError, match="backoff"):
            await claim_lease(journal, STREAM, holder=holder, ttl=10)
    clock.advance(5)
    after = await claim_lease(journal, STREAM, holder="w3", ttl=10)
    assert after.failures == 3  # the next backoff goes on growing


async def test_hold_lease_renews_in_the_background_and_releases_at_the_end() -> None:
    async with open_journal("memory://") as journal:
        async with hold_lease(journal, STREAM, holder="w1", ttl=0.3) as lease:
            while len(await events_of(journal, STREAM, StreamLeased)) < 3:
                await asyncio.sleep(0.02)  # waits for the renewals, asserts no timing
            assert lease.active
        states = [e.state for _, e in await events_of(journal, STREAM, StreamLeased)]
        assert states[0] == "held" and states[-1] == "released"
        assert {e.token for _, e in await events_of(journal, STREAM, StreamLeased)} == {lease.token}


class Gate:
    """A model whose first call blocks until released: the holder "paused" mid-request."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.bodies: list[str] = []

    async def __call__(self, request: NeutralRequest) -> str:
        self.bodies.append(request.messages[-2].content)
        if len(self.bodies) == 1:
            self.entered.set()
            await self.release.wait()
        return "answer"


async def test_a_takeover_resends_the_unanswered_request_as_a_recorded_retry(
    journal: Journal, clock: Clock
) -> None:
    await journal.append(STREAM, system_prompt("You answer."))
    await journal.append(STREAM, user("question"))
    gate = Gate()
    old = await claim_lease(journal, STREAM, holder="w1", ttl=10)
    paused = asyncio.create_task(Agent(old.journal, STREAM, FunctionModel(gate)).run_until_idle())
    await gate.entered.wait()
    clock.advance(11)  # the old holder stays paused past its expiry
    new = await claim_lease(journal, STREAM, holder="w2", ttl=10)
    report = await Agent(new.journal, STREAM, FunctionModel(gate)).run_until_idle()
    [offset] = report.requests
    gate.release.set()
    with pytest.raises(LeaseLostError):  # the old holder's answer is refused; it stops
        await paused
    recorded = await recorded_of(journal, STREAM)
    assert len(recorded[offset]) == 2 and recorded[offset][0] == recorded[offset][1]
    assert [r.request_offset for _, r in await events_of(journal, STREAM, LlmResponse)] == [offset]


def pausing_charge(marker: Path, entered: asyncio.Event, release: asyncio.Event) -> Tool:
    """``charge`` whose holder pauses right after the side effect."""
    inner = charge_tool(marker)

    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charge the customer's card."""
        inner.fn(amount, ctx)
        entered.set()
        await release.wait()
        return f"charged {amount}"

    return Tool.from_function(charge)


async def test_a_takeover_reports_a_started_side_effect_as_possibly_run(
    journal: Journal, clock: Clock, tmp_path: Path
) -> None:
    marker = tmp_path / "charges"
    await journal.append(STREAM, system_prompt("You charge cards."))
    await journal.append(STREAM, user("charge 100"))
    entered, release = asyncio.Event(), asyncio.Event()
    tool = pausing_charge(marker, entered, release)
    old = await claim_lease(journal, STREAM, holder="w1", ttl=10)
    model = FunctionModel(charging_model)
    paused = asyncio.create_task(Agent(old.journal, STREAM, model, tools=[tool]).run_until_idle())
    await entered.wait()
    clock.advance(11)
    new = await claim_lease(journal, STREAM, holder="w2", ttl=10)
    report = await Agent(new.journal, STREAM, model, tools=[tool]).run_until_idle()
    release.set()
    with pytest.raises(LeaseLostError):
        await paused
    assert report.not_rerun == [CALL.id]
    assert len(Charges(marker).lines()) == 1  # ran once, and the record says it may have
    [(_, result)] = await events_of(journal, STREAM, ToolCallResult)
    assert (result.content, result.is_error) == (NOT_RERUN, True)
    answers = [e.content for _, e in await events_of(journal, STREAM, ContextAdded)]
    assert answers[-1].startswith("tool said: error: this tool call may already have run")


@pytest.fixture(params=["sqlite", "postgres"])
def shared_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'leases.db'}"
    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn


async def test_the_fence_holds_between_journals_of_separate_connections(
    shared_url: str, clock: Clock
) -> None:
    """Two journals on one database, as two processes have: the takeover through one
    refuses the old holder's appends through the other."""
    async with (
        open_journal(shared_url, clock=clock) as first,
        open_journal(shared_url, clock=clock) as second,
    ):
        old = await claim_lease(first, STREAM, holder="w1", ttl=10)
        with pytest.raises(LeaseHeldError):
            await claim_lease(second, STREAM, holder="w2", ttl=10)
        await second.append(STREAM, user("an external write"))
        await old.journal.append(STREAM, user("the holder catches up"))
        clock.advance(11)
        await claim_lease(second, STREAM, holder="w2", ttl=10)
        version = await second.version(STREAM)
        with pytest.raises(LeaseLostError):
            await old.journal.append(STREAM, user("fenced off"))
        assert await first.version(STREAM) == version


Op = tuple[str, int]
OPS = st.lists(
    st.sampled_from(
        [
            *[(op, n) for op in ("claim", "append", "release") for n in (0, 1)],
            ("append", 0),
            ("append", 1),
            ("external", 0),
            ("advance", 4),
            ("advance", 11),  # past the ttl of 10
        ]
    ),
    min_size=4,
    max_size=30,
)


@settings(max_examples=600, deadline=None)
@given(ops=OPS)
def test_an_append_lands_exactly_while_its_instance_holds_the_newest_claim(ops: list[Op]) -> None:
    """Any interleaving of claims, holder appends, releases, other writers and time: a
    holder's append lands if and only if its claim is the stream's newest lease event (and
    was not released), and then right after it in lease order."""

    async def run() -> None:
        clock = Clock()
        async with open_journal("memory://", clock=clock) as journal:
            leases: dict[int, StreamLease] = {}
            for op, arg in ops:
                if op == "claim":
                    with contextlib.suppress(LeaseHeldError):
                        leases[arg] = await claim_lease(journal, STREAM, holder=f"w{arg}", ttl=10)
                elif op == "advance":
                    clock.advance(arg)
                elif op == "external":
                    await journal.append(STREAM, user("someone else"))
                elif arg in leases:
                    lease = leases[arg]
                    current = await read_lease(journal, STREAM)
                    holds = (
                        current is not None
                        and current.token == lease.token
                        and current.state == "held"
                    )
                    if op == "release":
                        await lease.release()
                        continue
                    try:
                        await lease.journal.append(STREAM, user(f"by {lease.token}"))
                        landed = True
                    except LeaseLostError:
                        landed = False
                    assert landed == holds, (op, arg, current, lease.token)
            token = None
            async for stored in journal.read_all(STREAM):
                event = stored.decode()
                if isinstance(event, StreamLeased):
                    token = event.token
                elif isinstance(event, ContextAdded) and event.content.startswith("by "):
                    assert event.content == f"by {token}"

    asyncio.run(run())


async def test_a_lazy_claim_lands_with_the_first_append_and_is_dropped_unused(
    journal: Journal,
) -> None:
    await journal.append(STREAM, user("hi"))
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=10, lazy=True)
    assert lease.pending and await read_lease(journal, STREAM) is None  # nothing written
    done = await lease.journal.append(STREAM, user("the holder's first append"))
    assert done.first_position == 2 and done.last_position == 3  # the claim goes last
    record = await read_lease(journal, STREAM)
    assert record is not None and (record.token, record.position) == (lease.token, 3)
    assert not lease.pending
    unused = await claim_lease(journal, "other", holder="w1", ttl=10, lazy=True)
    await unused.release()
    assert await journal.version("other") == 0  # a claim nothing used leaves no trace


async def test_of_two_lazy_claimants_only_the_first_to_append_holds_the_stream(
    journal: Journal,
) -> None:
    await journal.append(STREAM, user("hi"))
    first = await claim_lease(journal, STREAM, holder="w1", ttl=10, lazy=True)
    second = await claim_lease(journal, STREAM, holder="w2", ttl=10, lazy=True)  # both free
    await journal.append(STREAM, user("someone else"))  # not a lease: no loss by itself
    await second.journal.append(STREAM, user("w2 was first"))
    version = await journal.version(STREAM)
    with pytest.raises(LeaseLostError, match="leased by 'w2'"):
        await first.journal.append(STREAM, user("w1 too late"))
    assert await journal.version(STREAM) == version


async def test_a_lazy_claim_lands_before_a_summary_call(journal: Journal) -> None:
    """A compaction's summary call is the one model call no append precedes: the claim
    lands before it, so two instances never both summarize."""
    from contextfold.context.compaction import COMPACTION_INSTRUCTION
    from contextfold.wire import ModelOutput, Usage

    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("question"))

    def heavy(request: NeutralRequest) -> ModelOutput:
        return ModelOutput(text="answer", usage=Usage(input_tokens=100_000, output_tokens=10))

    await Agent(journal, STREAM, FunctionModel(heavy), compaction_threshold=1.0).run_until_idle()
    lease = await claim_lease(journal, STREAM, holder="w1", ttl=10, lazy=True)
    seen: list[str | None] = []

    async def summarizer(request: NeutralRequest) -> ModelOutput:
        assert request.messages[-1].content == COMPACTION_INSTRUCTION
        record = await read_lease(journal, STREAM)
        seen.append(record.token if record is not None else None)
        return ModelOutput(text="SUMMARY", usage=Usage(input_tokens=900, output_tokens=5))

    agent = Agent(lease.journal, STREAM, FunctionModel(summarizer), compaction_threshold=0.5)
    report = await agent.run_until_idle()
    assert len(report.compactions) == 1 and seen == [lease.token]
    await confirm_claim(journal)  # a plain journal: nothing to land


async def test_the_lease_table_looks_at_every_page_of_streams() -> None:
    """Past one page of the listing (here of 2) the streams of the next pages are read too."""
    store = RecordingStore()
    journal = Journal(store)
    streams = [f"chat/{n}" for n in range(5)]
    for stream in streams:
        await claim_lease(journal, stream, holder="w1", ttl=10)
    assert [r.stream for r in await lease_table(journal, page_size=2)] == streams
    assert [c.args["after"] for c in store.of("list_streams")] == [None, "chat/1", "chat/3"]
