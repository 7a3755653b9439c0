"""Bounded cold starts: a running agent materializes its context in chunks with its
cursor, and a restarted agent starts from them, folding only what came after, while every
request it sends still rebuilds byte for byte from the events alone."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

from runtime_helpers import STREAM, user

from contextfold.context.materialized import ContextChunk, ContextMaterialized
from contextfold.context.projection import AgentContext
from contextfold.context.rebuild import rebuild_state, verify_requests
from contextfold.context.turns import Turns, turns_through
from contextfold.journal import Journal
from contextfold.runtime.local import LocalModel
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.scheduling import Scheduler
from contextfold.store.base import ReadResult
from contextfold.store.sqlite import SQLiteStore

WINDOW = 3_000  # tokens: the local model's requests cross half of it, so history compacts


class CountingStore(SQLiteStore):
    """The SQLite store, counting the events its reads return."""

    read_events = 0

    async def read(self, *args: Any, **kwargs: Any) -> ReadResult:
        page = await super().read(*args, **kwargs)
        self.read_events += len(page.events)
        return page


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
    agent.materialize_every = 15
    return agent


async def test_a_stream_restarted_at_several_points_verifies(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    questions = iter(f"Where is helper_{n} defined?" for n in range(40))
    restarted_reads: list[tuple[int, int]] = []
    for segment in range(5):  # a new process each time: nothing cached
        store = CountingStore(path)
        async with Journal(store) as journal:
            if segment == 0:
                await journal.append(STREAM, system_prompt("You answer about the workspace."))
            else:
                # The first reads of the new instance start from the stored state.
                manifests = await journal.latest(STREAM, [ContextMaterialized])
                assert manifests, "the previous instance materialized its context"
                store.read_events = 0
                context = await journal.fold(AgentContext, STREAM)
                sched = await journal.fold(Scheduler, STREAM)
                await journal.fold(Turns, STREAM)
                restarted_reads.append((store.read_events, await journal.version(STREAM)))
                assert context == await rebuild_state(journal, STREAM, 10**9)
                turns = await journal.fold(Turns, STREAM)
                assert turns == await turns_through(journal, STREAM, 10**9)
                assert sched == Scheduler.apply_all(
                    Scheduler.initial_state(),
                    [
                        e
                        for s in [s async for s in journal.read_all(STREAM)]
                        if (e := Scheduler.decode(s))
                    ],
                )
            agent = _agent(journal)
            for _ in range(3):
                await journal.append(STREAM, user(next(questions)))
                report = await agent.run_until_idle()
                assert report.status == "idle"
    async with Journal(SQLiteStore(path)) as journal:
        assert await verify_requests(journal, STREAM) == ()
        chunks = [s async for s in journal.read_all(STREAM, types=[ContextChunk])]
        manifests = [s async for s in journal.read_all(STREAM, types=[ContextMaterialized])]
        context = await journal.fold(AgentContext, STREAM)
    assert len(manifests) >= 5 and chunks
    assert context.compacted_through > 0  # compactions rewrote chunks along the way
    for read, version in restarted_reads:
        # Only what came after the newest materialization, never the whole stream.
        assert read < 40 < version, (read, version)


async def test_the_agent_materializes_only_when_due(tmp_path: Path) -> None:
    async with Journal(SQLiteStore(tmp_path / "a.db")) as journal:
        await journal.append(STREAM, system_prompt("You answer."))
        agent = _agent(journal)
        agent.materialize_every = 10_000
        for n in range(3):
            await journal.append(STREAM, user(f"Where is thing_{n}?"))
            await agent.run_until_idle()
        assert await journal.latest(STREAM, [ContextMaterialized]) == ()
        agent.materialize_every = 30
        for n in range(8):
            await journal.append(STREAM, user(f"Where is other_{n}?"))
            await agent.run_until_idle()
        found = [s async for s in journal.read_all(STREAM, types=[ContextMaterialized])]
        positions = [s.position for s in found]
        assert 2 <= len(positions) < 8
        assert all(b - a >= 30 for a, b in pairwise(positions))
