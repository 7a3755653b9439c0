"""JournalCompactionSession: the SDK's compaction-session shape with contextfold's compaction,
a summary recorded as a journal event whose originals stay readable, under the Runner."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, Runner, function_tool, is_openai_responses_compaction_aware_session
from agents.memory import Session

import contextfold as cf
from contextfold.errors import InvalidInputError
from contextfold.integrations.openai_agents import (
    JournalCompactionSession,
    JournalModel,
    JournalSession,
    SessionSummarized,
)
from tests.integrations.helpers import (
    BACKENDS,
    ScriptedModel,
    backend_url,
    decoded,
    function_call,
    text_message,
)
from tests.integrations.openai_agents_worker import Worker, read_file

SUMMARY = "Summary of the earlier conversation:\n"


@pytest.fixture(params=BACKENDS)
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[cf.Journal]:
    async with cf.open_journal(backend_url(request, tmp_path)) as opened:
        yield opened


@function_tool
def look(path: str) -> str:
    """Look at a file."""
    return f"{path}: " + "y" * 800


class Summarizer:
    """A deterministic summarizer: it counts what it was asked to summarize."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, request: cf.NeutralRequest) -> str:
        self.prompts.append(request.messages[-1].content)
        return f"summary {len(self.prompts)}"


def script(turns: int) -> ScriptedModel:
    """Per turn: a call of ``look``, then an answer (the model gives response ids)."""
    model = ScriptedModel()
    for n in range(turns):
        model.enqueue([function_call("look", f'{{"path": "f{n}"}}', call_id=f"call_{n}")])
        model.enqueue([text_message(f"done {n}", id=f"msg_{n}")])
    return model


def compacting(journal: cf.Journal, name: str, summarizer: Summarizer, **options: Any) -> Any:
    client = cf.FunctionModel(summarizer, transport="openai-chat", model="summarizer")
    return JournalCompactionSession(
        JournalSession(journal, name), summarizer=client, **{"compact_at": 1_000, **options}
    )


def orphans(items: list[Any]) -> int:
    calls = {item["call_id"] for item in items if item.get("type") == "function_call"}
    outputs = {item["call_id"] for item in items if item.get("type") == "function_call_output"}
    return len(calls ^ outputs)


async def test_it_is_an_sdk_compaction_session(journal: cf.Journal) -> None:
    session = compacting(journal, "shape", Summarizer())
    assert isinstance(session, Session)
    assert is_openai_responses_compaction_aware_session(session)
    assert session.session_id == "shape"


async def test_a_runner_conversation_is_compacted_and_its_originals_stay(
    journal: cf.Journal,
) -> None:
    summarizer = Summarizer()
    session = compacting(journal, "long", summarizer)
    model = script(8)
    agent = Agent(name="reader", model=model, tools=[look])
    for n in range(8):
        result = await Runner.run(agent, f"task {n}", session=session)
        assert result.final_output == f"done {n}"
    assert summarizer.prompts
    items = await session.get_items()
    assert items[0] == {"role": "user", "content": f"{SUMMARY}summary {len(summarizer.prompts)}"}
    assert orphans(items[1:]) == 0
    assert items[-1]["content"][0]["text"] == "done 7"  # the newest answer survives
    # The model was handed the summary, not the items it replaced.
    assert model.calls[-1].input[0] == items[0]
    # Every item the Runner gave the session is still in the journal, in order.
    plain = JournalSession(journal, "plain")
    again = script(8)
    for n in range(8):
        await Runner.run(
            Agent(name="reader", model=again, tools=[look]), f"task {n}", session=plain
        )
    assert await session.history() == await plain.get_items()
    # Each compaction names the items it replaced; they are readable where they were added.
    records = [
        (event.position, decoded(event, SessionSummarized))
        async for event in journal.read_all(session.stream, types=[SessionSummarized])
    ]
    assert len(records) == len(summarizer.prompts)
    replaced = [
        event.payload
        async for event in journal.read_all(session.stream)
        if event.position in set(records[0][1].replaced)
    ]
    assert [payload["item"] for payload in replaced] == (await plain.get_items())[: len(replaced)]
    # A summary extends the one before it, which the summarizer is given.
    if len(summarizer.prompts) > 1:
        assert "summary 1" in summarizer.prompts[1]


async def test_run_compaction_is_the_sdk_hook(journal: cf.Journal) -> None:
    summarizer = Summarizer()
    session = compacting(journal, "manual", summarizer, compact_at=100_000, keep_tokens=0)
    model = script(2)
    for n in range(2):
        await Runner.run(Agent(name="r", model=model, tools=[look]), f"task {n}", session=session)
    await session.run_compaction({"response_id": "resp_1"})
    assert summarizer.prompts == []  # under the threshold
    await session.run_compaction({"force": True})
    items = await session.get_items()
    assert [item.get("content") for item in items[:1]] == [f"{SUMMARY}summary 1"]
    assert items[1:] == [(await session.history())[-1]]  # the newest answer alone is kept
    # Nothing older than the summary and the answer: a forced compaction does nothing more.
    await session.run_compaction({"force": True})
    assert len(summarizer.prompts) == 1


async def test_it_composes_with_journal_model(journal: cf.Journal) -> None:
    summarizer = Summarizer()
    session = compacting(journal, "both", summarizer, compact_at=1_500)
    worker = Worker()
    client = cf.FunctionModel(worker, transport="openai-responses", model="gpt-test")
    agent = Agent(name="w", model=JournalModel(client, journal, "both/model"), tools=[read_file])
    for n in range(5):
        await Runner.run(agent, f"task {n}", session=session)
    assert summarizer.prompts  # the session compacted under JournalModel (no response ids)
    # The model's context is its stream: every task, once; its requests verify.
    said = [m.content.splitlines()[-1] for m in worker.requests[-1].messages if m.role == "user"]
    assert [line for line in said if line.startswith("task")] == [f"task {n}" for n in range(5)]
    assert await cf.verify_requests(journal, "both/model") == ()


def test_bad_arguments_are_refused() -> None:
    journal = cf.open_journal("memory://")
    client = cf.FunctionModel(lambda request: "", model="m")
    with pytest.raises(InvalidInputError, match="wraps a JournalSession"):
        JournalCompactionSession(object(), summarizer=client, compact_at=10)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="model client"):
        JournalCompactionSession(
            JournalSession(journal, "x"),
            summarizer=object(),  # type: ignore[arg-type]
            compact_at=10,
        )
    with pytest.raises(InvalidInputError, match="compact_at"):
        JournalCompactionSession(JournalSession(journal, "x"), summarizer=client, compact_at=0)
