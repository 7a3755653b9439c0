"""Bounded cold starts: a running agent materializes its context in chunks with its
cursor, and a restarted agent starts from them, folding only what came after, while every
request it sends still rebuilds byte for byte from the events alone."""

from __future__ import annotations

import logging
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path
from typing import Any, cast

import pytest

from contextfold.context.materialized import ContextChunk, ContextMaterialized
from contextfold.context.projection import AgentContext
from contextfold.context.rebuild import rebuild_state, verify_requests
from contextfold.context.turns import Turns, turns_through
from contextfold.journal import Journal
from contextfold.runtime.local import LocalModel
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.materializing import materialize_context
from contextfold.runtime.scheduling import Scheduler
from contextfold.store.base import ReadResult, Store
from contextfold.store.postgres import PostgresStore
from contextfold.store.sqlite import SQLiteStore
from tests.runtime.helpers import STREAM, user

WINDOW = 3_000  # tokens: the local model's requests cross half of it, so history compacts


class _Counting:
    """Counts the events a store's reads return (mixed into a real store class)."""

    read_events = 0

    async def read(self, *args: Any, **kwargs: Any) -> ReadResult:
        page: ReadResult = await super().read(*args, **kwargs)  # type: ignore[misc]
        self.read_events += len(page.events)
        return page


class CountingSQLite(_Counting, SQLiteStore):
    pass


class CountingPostgres(_Counting, PostgresStore):
    pass


def search_files(query: str) -> str:
    """Search the workspace for a word."""
    return f"src/{query}.py:3: def {query}(): ...\nsrc/{query}_test.py:9: {query}()"


def read_file(path: str) -> str:
    """Read a file of the workspace."""
    return f"# {path}\n" + "\n".join(f"line {n} of {path}" for n in range(12))


def _agent(journal: Journal) -> Agent:
    agent = Agent(
        journal, STREAM, LocalModel(), tools=[search_files, read_file], context_window=WINDOW
    )
    agent.settings.materialize_every = 15
    return agent


async def _restarted_at_several_points(open_store: Callable[[], _Counting]) -> None:
    """Five instances in turn, each a new process (nothing cached), three questions each;
    each restart's first reads start from what the previous one materialized."""
    questions = iter(f"Where is helper_{n} defined?" for n in range(40))
    restarted_reads: list[tuple[int, int]] = []
    for segment in range(5):
        store = open_store()
        async with Journal(cast(Store, store)) as journal:
            if segment == 0:
                await journal.append(STREAM, system_prompt("You answer about the workspace."))
            else:
                assert await journal.latest(STREAM, [ContextMaterialized])
                store.read_events = 0
                context = await journal.fold(AgentContext, STREAM)
                sched = await journal.fold(Scheduler, STREAM)
                turns = await journal.fold(Turns, STREAM)
                restarted_reads.append((store.read_events, await journal.version(STREAM)))
                assert context == await rebuild_state(journal, STREAM, 10**9)
                assert turns == await turns_through(journal, STREAM)
                stored = [s async for s in journal.read_all(STREAM)]
                envelopes = [e for s in stored if (e := Scheduler.decode(s)) is not None]
                assert sched == Scheduler.apply_all(Scheduler.initial_state(), envelopes)
            agent = _agent(journal)
            for _ in range(3):
                await journal.append(STREAM, user(next(questions)))
                assert (await agent.run_until_idle()).status == "idle"
    async with Journal(cast(Store, open_store())) as journal:
        assert await verify_requests(journal, STREAM) == ()
        chunks = [s async for s in journal.read_all(STREAM, types=[ContextChunk])]
        manifests = [s async for s in journal.read_all(STREAM, types=[ContextMaterialized])]
        context = await journal.fold(AgentContext, STREAM)
    assert len(manifests) >= 5 and chunks
    assert context.compacted_through > 0  # compactions rewrote chunks along the way
    for read, version in restarted_reads:
        # Only what came after the newest materialization, never the whole stream.
        assert read < 40 < version, (read, version)


async def test_a_stream_restarted_at_several_points_verifies(tmp_path: Path) -> None:
    await _restarted_at_several_points(lambda: CountingSQLite(tmp_path / "agent.db"))


async def test_restarts_verify_on_postgresql(pg_dsn: str) -> None:
    await _restarted_at_several_points(lambda: CountingPostgres(pg_dsn))


async def test_the_agent_materializes_only_when_due(tmp_path: Path) -> None:
    async with Journal(SQLiteStore(tmp_path / "a.db")) as journal:
        await journal.append(STREAM, system_prompt("You answer."))
        agent = _agent(journal)
        agent.settings.materialize_every = 10_000
        for n in range(3):
            await journal.append(STREAM, user(f"Where is thing_{n}?"))
            await agent.run_until_idle()
        assert await journal.latest(STREAM, [ContextMaterialized]) == ()
        agent.settings.materialize_every = 30
        for n in range(8):
            await journal.append(STREAM, user(f"Where is other_{n}?"))
            await agent.run_until_idle()
        found = [s async for s in journal.read_all(STREAM, types=[ContextMaterialized])]
        positions = [s.position for s in found]
        assert 2 <= len(positions) < 8
        assert all(b - a >= 30 for a, b in pairwise(positions))


async def test_chunks_fit_the_payload_limit_or_are_left_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Chunks are cut to half the journal's payload limit; an item too big for any chunk
    leaves the context unmaterialized (logged), and the agent goes on."""
    async with Journal(SQLiteStore(tmp_path / "a.db"), max_payload_bytes=8_192) as journal:
        await journal.append(STREAM, system_prompt("You answer."))
        agent = Agent(journal, STREAM, LocalModel(), context_window=100_000)  # no compaction
        agent.settings.materialize_every = 5
        for n in range(15):
            await journal.append(STREAM, user(f"Where is part_{n}? " + "x" * 600))
            await agent.run_until_idle()
        await journal.append(STREAM, user("One more?"))
        done = await materialize_context(journal, STREAM)  # a history of over 8 KB
        assert done is not None and done.referenced > 3
        sizes = [len(s.data) async for s in journal.read_all(STREAM, types=[ContextChunk])]
        assert max(sizes) <= 8_192
        count = len([m async for m in journal.read_all(STREAM, types=[ContextMaterialized])])
        await journal.append(STREAM, user("And this? " + "y" * 7_900))
        with caplog.at_level(logging.WARNING, logger="contextfold.runtime"):
            report = await agent.run_until_idle()
        assert report.status == "idle" and report.requests
        assert "did not materialize its context" in caplog.text
        after = len([m async for m in journal.read_all(STREAM, types=[ContextMaterialized])])
        assert after == count
