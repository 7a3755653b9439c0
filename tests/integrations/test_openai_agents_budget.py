"""JournalModel's own budget and compaction: a long tool-heavy Runner conversation stays
within its budget through contextfold's compaction by cutoff (a note, or a summary the
model writes), never splits a tool call from its result, keeps each request's prefix until
the next compaction, keeps the originals in the journal, and verifies byte for byte."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, ModelSettings, Runner
from typer.testing import CliRunner

import contextfold as cf
from contextfold import telemetry as tm
from contextfold.cli import app
from contextfold.context.rebuild import rebuild_state
from contextfold.errors import InvalidInputError
from contextfold.integrations.openai_agents import JournalModel, JournalSession
from tests.integrations.helpers import BACKENDS, backend_url, decoded
from tests.integrations.openai_agents_worker import STEPS, Worker, read_file, split_pairs


@pytest.fixture(params=BACKENDS)
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[cf.Journal]:
    async with cf.open_journal(backend_url(request, tmp_path)) as opened:
        yield opened


async def converse(
    journal: cf.Journal, stream: str, tasks: int, session: Any = None, **options: Any
) -> Worker:
    worker = Worker()
    client = cf.FunctionModel(worker, transport="openai-responses", model="gpt-test")
    model = JournalModel(client, journal, stream, **options)
    agent = Agent(name="worker", instructions="Do the task.", model=model, tools=[read_file])
    for n in range(tasks):
        result = await Runner.run(agent, f"task {n}", session=session)
        assert str(result.final_output).startswith("done")
    return worker


async def records(journal: cf.Journal, stream: str) -> list[cf.RequestRecorded]:
    return [
        decoded(event, cf.RequestRecorded)
        async for event in journal.read_all(stream, types=[cf.RequestRecorded])
    ]


async def compactions(journal: cf.Journal, stream: str) -> list[cf.ContextAdded]:
    added = [
        decoded(event, cf.ContextAdded)
        async for event in journal.read_all(stream, types=[cf.ContextAdded])
    ]
    return [item for item in added if item.compaction is not None]


async def test_a_budget_leaves_the_oldest_steps_out_behind_a_note(journal: cf.Journal) -> None:
    worker = await converse(journal, "budget", 8, budget=3_000)
    sent = await records(journal, "budget")
    assert max(record.size // 4 for record in sent) <= 3_000
    notes = await compactions(journal, "budget")
    assert notes and all("left out" in note.content for note in notes)
    assert all(note.compaction and note.compaction.usage is None for note in notes)
    assert not worker.summaries  # a note costs no model call
    assert [split_pairs(request) for request in worker.requests] == [0] * len(worker.requests)
    # The note goes out as a user message, never with instruction precedence.
    last = worker.requests[-1]
    assert [m.role for m in last.messages if "left out" in m.content] == ["user"]
    # The originals stay in the journal: every task and every tool output.
    added = [
        decoded(event, cf.ContextAdded)
        async for event in journal.read_all("budget", types=[cf.ContextAdded])
    ]
    tasks = [item.content for item in added if item.role == "user" and item.compaction is None]
    assert tasks == [f"task {n}" for n in range(8)]
    results = [e async for e in journal.read_all("budget", types=[cf.ToolCallResult])]
    assert len(results) == 8 * STEPS
    assert await cf.verify_requests(journal, "budget") == ()


async def test_requests_keep_their_prefix_between_compactions(journal: cf.Journal) -> None:
    await converse(journal, "cache", 8, budget=3_000)
    offsets = [record.request_offset for record in await records(journal, "cache")]
    bodies = [(await cf.rebuild_request(journal, "cache", at)).body for at in offsets]
    cuts = [
        event.position
        async for event in journal.read_all("cache", types=[cf.ContextAdded])
        if decoded(event, cf.ContextAdded).compaction is not None
    ]
    assert cuts
    for n in range(2, len(offsets)):  # the second request is mostly new: skipped
        share = tm.prefix_share(bodies[n - 1], bodies[n])
        assert share is not None
        compacted = any(offsets[n - 1] < cut < offsets[n] for cut in cuts)
        # Only a compaction moves the prefix: every other request extends the one before.
        assert compacted or share > 0.6, (offsets[n], share)


async def test_compact_at_summarizes_through_the_model(journal: cf.Journal) -> None:
    worker = await converse(journal, "summary", 8, compact_at=3_000)
    assert worker.summaries
    summaries = await compactions(journal, "summary")
    assert [item.content for item in summaries] == [
        f"summary {n}: the files read so far" for n in range(1, len(summaries) + 1)
    ]
    # The summarizer got the exact request it summarizes, plus the instruction.
    first = summaries[0].compaction
    assert first is not None
    at = await rebuild_state(journal, "summary", first.replaces_history_through)
    assert worker.summaries[0].messages[:-1] == cf.build_request(at).messages
    # The summary goes out as a user message; the newest answer survives behind it.
    after = next(r for r in worker.requests if any("summary 1" in m.content for m in r.messages))
    [carrying] = [m for m in after.messages if "summary 1" in m.content]
    assert carrying.role == "user"
    assert [split_pairs(request) for request in worker.requests] == [0] * len(worker.requests)
    assert max(record.size // 4 for record in await records(journal, "summary")) <= 3_000
    assert await cf.verify_requests(journal, "summary") == ()


async def test_the_budget_composes_with_a_limited_session(journal: cf.Journal) -> None:
    session = JournalSession(journal, "limited", session_settings={"limit": 4})
    worker = await converse(journal, "limited", 6, session=session, budget=2_500)
    assert [split_pairs(request) for request in worker.requests] == [0] * len(worker.requests)
    # Every task reaches the journal once, though the session hands the Runner 4 items.
    added = [
        decoded(event, cf.ContextAdded)
        async for event in journal.read_all("limited", types=[cf.ContextAdded])
    ]
    assert [item.content for item in added if item.role == "user" and not item.compaction] == [
        f"task {n}" for n in range(6)
    ]
    assert await compactions(journal, "limited")
    assert await cf.verify_requests(journal, "limited") == ()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"budget": 0}, "budget must be positive"),
        ({"compact_at": -1}, "compact_at must be positive"),
        ({"budget": 100, "keep_tokens": -5}, "keep_tokens must be >= 0"),
        ({"budget": "big"}, "budget must be a positive number"),
    ],
)
def test_bad_options_are_refused(options: dict[str, Any], match: str) -> None:
    client = cf.FunctionModel(lambda request: "", transport="openai-chat", model="m")
    with pytest.raises(InvalidInputError, match=match):
        JournalModel(client, cf.open_journal("memory://"), "s", **options)


def test_the_cli_verifies_a_compacted_conversation(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agents.db'}"

    async def run() -> None:
        async with cf.open_journal(url) as journal:
            await converse(journal, "verified", 8, budget=3_500, compact_at=3_000)
            assert await compactions(journal, "verified")

    asyncio.run(run())
    shown = CliRunner().invoke(app, ["verify", "verified", "--url", url, "--json"])
    assert shown.exit_code == 0, shown.stdout
    report = json.loads(shown.stdout)
    assert report["ok"] is True and report["requests"] == 24 and report["drift_count"] == 0


def test_run_sync_compacts_on_a_sync_journal(tmp_path: Path) -> None:
    """Runner.run_sync over a SyncJournal: the journal's work runs on its own loop, the
    summarizer (the model) on the Runner's."""
    worker = Worker()
    client = cf.FunctionModel(worker, transport="anthropic", model="claude-test")
    loop = asyncio.new_event_loop()  # closed here: run_sync would leave its own open
    asyncio.set_event_loop(loop)
    try:
        with cf.open_journal_sync(f"sqlite:///{tmp_path / 'sync.db'}") as journal:
            model = JournalModel(client, journal, "sync", compact_at=3_000)
            settings = ModelSettings(max_tokens=256)
            agent = Agent(name="worker", model=model, tools=[read_file], model_settings=settings)
            for n in range(8):
                assert str(Runner.run_sync(agent, f"task {n}").final_output).startswith("done")
            assert worker.summaries
            assert journal.run(cf.verify_requests, "sync") == ()
    finally:
        asyncio.set_event_loop(None)
        loop.close()
