"""Workers on PostgreSQL: woken by LISTEN/NOTIFY (not by polling), several sharing one
namespace with one holder per stream at a time, each request sent once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from contextfold.context.events import LlmResponse
from contextfold.context.rebuild import verify_requests
from contextfold.journal import Journal, open_journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.lease import StreamLeased, lease_table, read_lease
from contextfold.runtime.loop import Agent
from contextfold.runtime.worker import Worker
from contextfold.wire import NeutralRequest
from tests.runtime.helpers import (
    answered,
    events_of,
    eventually,
    new_agent_stream,
    recorded_of,
    running,
    user,
)

NEVER_POLLS: dict[str, Any] = {"poll_interval": 600.0, "rescan_interval": 600.0}


async def test_a_notification_wakes_a_worker_that_does_not_poll(pg_dsn: str) -> None:
    async with open_journal(pg_dsn) as journal:
        await new_agent_stream(journal, "chat/old")
        worker = Worker(journal, _echo(), **NEVER_POLLS)
        async with running(worker):
            await eventually(lambda: answered(journal, "chat/old"), what="the first scan")

            async def listening() -> bool:
                return worker.listening

            await eventually(listening, what="the worker listens")
            # A stream born now (the worker learns its name by a rescan a notification
            # asks for) and a trigger on a known one: no poll would come for 600 s.
            await new_agent_stream(journal, "chat/new")
            await journal.append("chat/old", user("again"))
            await eventually(lambda: answered(journal, "chat/new"), what="chat/new woken")
            await eventually(lambda: answered(journal, "chat/old"), what="chat/old woken")


def _echo() -> Any:
    model = FunctionModel(lambda request: "ok")

    def app(journal: Journal, stream: str) -> Agent:
        return Agent(journal, stream, model)

    return app


async def test_two_workers_share_a_namespace_and_send_each_request_once(pg_dsn: str) -> None:
    sent: dict[str, list[str]] = {}

    def counting(name: str) -> Any:
        async def model(request: NeutralRequest) -> str:
            sent.setdefault(name, []).append(request.messages[-2].content.splitlines()[-1])
            await asyncio.sleep(0.01)  # long enough for the other worker to look in
            return "ok"

        fn = FunctionModel(model)

        def app(journal: Journal, stream: str) -> Agent:
            return Agent(journal, stream, fn)

        return app

    streams = [f"chat/{n:02d}" for n in range(20)]
    async with open_journal(pg_dsn) as first, open_journal(pg_dsn) as second:
        for stream in streams:
            await new_agent_stream(first, stream, f"question for {stream}")
        a = Worker(first, counting("a"), concurrency=3, poll_interval=0.05)
        b = Worker(second, counting("b"), concurrency=3, poll_interval=0.05)
        async with running(a), running(b):

            async def all_answered() -> bool:
                return all([await answered(first, s) for s in streams])

            await eventually(all_answered, what="every stream answered")
        assert a.stats.claims + b.stats.claims >= len(streams)
        for stream in streams:
            recorded = await recorded_of(first, stream)
            assert [len(shas) for shas in recorded.values()] == [1]  # no request sent twice
            assert len(await events_of(first, stream, LlmResponse)) == 1
            assert await verify_requests(first, stream) == ()
        asked = [q for name in sent for q in sent[name]]
        assert sorted(asked) == sorted(f"question for {s}" for s in streams)
        assert {r.state for r in await lease_table(first)} == {"released"}


async def test_a_turn_reads_no_version_and_its_own_notifications_read_nothing(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The versions a worker needs come with the scan and the notifications: it reads the
    lease of a stream it looks at (with its version and head), and the notifications of
    its own appends, heard after its run handed the stream back idle, read nothing at all."""
    async with open_journal(pg_dsn) as journal, open_journal(pg_dsn) as observer:
        calls: list[tuple[str, str, tuple[str, ...]]] = []
        store = journal.store
        for name in ("version", "latest", "latest_at_head", "head", "read"):

            def recording(method: Any, name: str = name) -> Any:
                async def call(namespace: str, stream: str, *args: Any, **kwargs: Any) -> Any:
                    types = kwargs.get("types") or (args[0] if args else ())
                    calls.append((name, stream, tuple(types or ())))
                    return await method(namespace, stream, *args, **kwargs)

                return call

            monkeypatch.setattr(store, name, recording(getattr(store, name)))
        worker = Worker(journal, _echo(), **NEVER_POLLS)
        async with running(worker):

            async def listening() -> bool:
                return worker.listening

            await eventually(listening, what="the worker listens")
            await new_agent_stream(observer, "chat/a")
            await eventually(lambda: answered(observer, "chat/a"), what="chat/a answered")
            # Appended after chat/a's hand-back: once it is answered, the worker has heard
            # every notification of chat/a's turn (they are sent in order).
            await new_agent_stream(observer, "chat/marker")
            await eventually(lambda: answered(observer, "chat/marker"), what="the marker")
        record = await read_lease(observer, "chat/a")
        assert record is not None and record.idle
        mine = [(name, types) for name, stream, types in calls if stream == "chat/a"]
        assert ("version", ()) not in mine and ("head", ()) not in mine
        # The look reads the lease with the version and the head, in one statement.
        assert mine.count(("latest_at_head", (StreamLeased.event_type,))) == 1
        assert ("latest", (StreamLeased.event_type,)) not in mine


def _record_calls(store: Any, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every store call of these methods, as (method, stream), in order."""
    calls: list[tuple[str, str]] = []
    for name in ("version", "latest", "latest_at_head", "head", "read", "append"):

        def recording(method: Any, name: str = name) -> Any:
            async def call(namespace: str, stream: str, *args: Any, **kwargs: Any) -> Any:
                calls.append((name, stream))
                return await method(namespace, stream, *args, **kwargs)

            return call

        monkeypatch.setattr(store, name, recording(getattr(store, name)))
    return calls


async def test_a_turn_woken_by_a_notification_reads_each_fold_once(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A notification names the stream's head: a worker's look at the stream and its
    agent's first step take it for the head, so each fold reads what came (the trigger)
    once, with no head check, and a fold already at it reads nothing."""
    async with open_journal(pg_dsn) as journal, open_journal(pg_dsn) as observer:
        worker = Worker(journal, _echo(), **NEVER_POLLS)
        async with running(worker):

            async def listening() -> bool:
                return worker.listening

            await eventually(listening, what="the worker listens")
            await new_agent_stream(observer, "chat/a")
            await eventually(lambda: answered(observer, "chat/a"), what="the first turn")
            await new_agent_stream(observer, "chat/marker")  # chat/a's notifications heard
            await eventually(lambda: answered(observer, "chat/marker"), what="the marker")
            calls = _record_calls(journal.store, monkeypatch)
            await observer.append("chat/a", user("again"))
            await eventually(lambda: answered(observer, "chat/a"), what="the second turn")
        mine = [name for name, stream in calls if stream == "chat/a"]
        looked = mine[: mine.index("append")]
        # The lease (with the version and head), then the scheduler (the worker's look) and
        # the context (the agent's first step) each read the trigger; the scheduler read
        # again: nothing. Then the turn records the request's manifest names (the request
        # and its record go in one append, made after it).
        assert looked == ["latest_at_head", "read", "read", "latest"], looked


async def test_a_leased_turns_folds_read_nothing_after_its_own_first_append(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its appends fold into the cached states (PostgreSQL says which event each batch
    follows and where its events landed, whatever other streams drew in between) and its
    lease knows the head they left: its folds after them read nothing, and check no head."""
    streams = [f"chat/{n}" for n in range(4)]  # served at once: their appends interleave
    async with open_journal(pg_dsn) as journal, open_journal(pg_dsn) as observer:
        worker = Worker(journal, _echo(), concurrency=4, **NEVER_POLLS)
        calls = _record_calls(journal.store, monkeypatch)
        async with running(worker):

            async def listening() -> bool:
                return worker.listening

            await eventually(listening, what="the worker listens")
            for stream in streams:
                await new_agent_stream(observer, stream)

            async def all_answered() -> bool:
                return all([await answered(observer, s) for s in streams])

            await eventually(all_answered, what="every stream answered")
    for stream in streams:
        mine = [name for name, s in calls if s == stream]
        after = mine[mine.index("append") :]
        assert "read" not in after and "head" not in after, (stream, after)


async def test_a_turn_on_a_stream_a_scan_found_reads_each_fold_once(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan names each stream's version: the claim is made at it, and the agent's first
    step takes the scheduler the worker's look read at that version as current."""
    async with open_journal(pg_dsn) as journal, open_journal(pg_dsn) as observer:
        await new_agent_stream(observer, "chat/a")
        calls = _record_calls(journal.store, monkeypatch)
        worker = Worker(journal, _echo(), **NEVER_POLLS)
        async with running(worker):
            await eventually(lambda: answered(observer, "chat/a"), what="the turn")
    mine = [name for name, stream in calls if stream == "chat/a"]
    looked = mine[: mine.index("append")]
    # The lease (with the version and head), then each fold's first read (its checkpoint or
    # materialization, then its events): the scheduler's at the look, the context's at the
    # agent's first step.
    assert looked.count("read") == 2 and "head" not in looked and "version" not in looked
    assert looked[0] == "latest_at_head", looked
