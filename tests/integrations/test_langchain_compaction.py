"""Compaction under create_agent with ContextMiddleware: past the trigger a summary is
recorded as a CallCompacted and sent as a human message in place of the oldest messages,
the graph state keeps every message and the journal every original, every request verifies
and a tampered record does not; with JournalSaver as checkpointer the compaction holds
across invocations of the thread. Sync and async agents, SQLite and memory journals."""

from __future__ import annotations

import sqlite3
from typing import Any

import orjson
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

import contextfold as cf
from contextfold.context.call_records import Calls, read_calls, verify_calls
from contextfold.context.calls import CallCompacted
from contextfold.integrations.langchain import ContextMiddleware
from contextfold.integrations.langgraph import JournalSaver
from tests.integrations.langchain_scripted import Scripted, read_file, split_pairs

SUMMARY_HEAD = "Summary of the earlier conversation:"
TURNS, STEPS = 3, 10


def _json(message: BaseMessage) -> Any:
    return {"type": message.type, "data": message.model_dump(mode="json")}


def _check_session(model: Scripted, state: dict[str, Any], calls: Calls) -> None:
    """What every compacting session must show."""
    messages = state["messages"]
    assert len(messages) == TURNS * (2 * STEPS + 2)  # the graph state is not rewritten
    assert not [m for m in messages if SUMMARY_HEAD in str(m.content)]
    assert len(calls.compactions) >= 2 and len(model.prompts) == len(calls.compactions)
    assert all(isinstance(c, CallCompacted) for c in calls.compactions.values())
    summarized = 0
    for sent in model.seen:
        assert split_pairs(sent) == 0
        assert isinstance(sent[0], SystemMessage)
        if SUMMARY_HEAD in str(sent[1].content):
            assert isinstance(sent[1], HumanMessage)  # a summary goes out as user
            summarized += 1
    assert summarized > len(model.seen) // 2
    # Every original a summary replaced is on the stream, as LangChain's JSON.
    newest = calls.compactions[max(calls.compactions)]
    originals = [calls.messages[d][1].message for d in newest.summarized]
    assert originals == [_json(m) for m in messages[: len(originals)]]
    assert verify_calls(calls) == []
    assert len(calls.requests) == len(calls.answers) == len(model.seen)
    # Every request sent the summary the newest compaction before it recorded.
    for position, request in calls.requests.items():
        assert request.view is not None
        done = [p for p in calls.compactions if p < position]
        assert request.view.compaction == (max(done) if done else None)


def _middleware(journal: cf.Journal | cf.SyncJournal, **options: Any) -> ContextMiddleware:
    return ContextMiddleware(
        journal=journal, trigger=("tokens", 2_500), keep=("tokens", 800), **options
    )


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
async def test_an_async_agent_compacts_as_journal_events(backend: str, sqlite_path: str) -> None:
    url = f"sqlite:///{sqlite_path}" if backend == "sqlite" else "memory://"
    model = Scripted(steps=STEPS)
    async with cf.open_journal(url) as journal:
        middleware = _middleware(journal, stream="chat")
        agent: Any = create_agent(
            model, tools=[read_file], system_prompt="You read files.", middleware=[middleware]
        )
        state: dict[str, Any] = {"messages": []}
        for n in range(TURNS):
            question = ("user", f"read the files of part {n}")
            state = await agent.ainvoke({"messages": [*state["messages"], question]})
        calls = await read_calls(journal, "chat")
    _check_session(model, state, calls)


def test_a_sync_agent_compacts_with_another_summarizer(sqlite_path: str) -> None:
    model, summarizer = Scripted(steps=STEPS), Scripted()
    with cf.open_journal_sync(f"sqlite:///{sqlite_path}") as journal:
        middleware = _middleware(journal, stream="chat", summarizer=summarizer)
        agent: Any = create_agent(
            model, tools=[read_file], system_prompt="You read files.", middleware=[middleware]
        )
        state: dict[str, Any] = {"messages": []}
        for n in range(TURNS):
            question = ("user", f"read the files of part {n}")
            state = agent.invoke({"messages": [*state["messages"], question]})
        calls = journal.run(read_calls, "chat")
    assert not model.prompts and summarizer.prompts
    model.prompts.extend(summarizer.prompts)
    _check_session(model, state, calls)


async def test_an_async_agent_on_a_sync_journal_summarizes_on_its_own_loop(
    sqlite_path: str,
) -> None:
    model = Scripted(steps=STEPS)
    with cf.open_journal_sync(f"sqlite:///{sqlite_path}") as journal:
        agent: Any = create_agent(
            model,
            tools=[read_file],
            system_prompt="You read files.",
            middleware=[_middleware(journal, stream="chat")],
        )
        state: dict[str, Any] = {"messages": []}
        for n in range(TURNS):
            question = ("user", f"read the files of part {n}")
            state = await agent.ainvoke({"messages": [*state["messages"], question]})
    with cf.open_journal_sync(f"sqlite:///{sqlite_path}") as journal:
        calls = journal.run(read_calls, "chat")
    _check_session(model, state, calls)


@pytest.mark.parametrize("backend", ["sqlite", "memory"])
def test_with_journal_saver_the_compaction_holds_across_invocations(
    backend: str, sqlite_path: str
) -> None:
    url = f"sqlite:///{sqlite_path}" if backend == "sqlite" else "memory://"
    model = Scripted(steps=STEPS)
    with cf.open_journal_sync(url) as journal:
        agent: Any = create_agent(
            model,
            tools=[read_file],
            system_prompt="You read files.",
            middleware=[_middleware(journal)],
            checkpointer=JournalSaver(journal),
        )
        config = {"configurable": {"thread_id": "t1"}}
        for n in range(TURNS):
            first = len(model.seen)
            state = agent.invoke({"messages": [("user", f"read the files of part {n}")]}, config)
            if n:  # the thread's compaction is applied from the new invocation's first call
                assert SUMMARY_HEAD in str(model.seen[first][1].content)
        calls = journal.run(read_calls, "langgraph/t1")
        # The thread's checkpoints and its calls share the thread's stream.
        types = {e.type for e in journal.read_all("langgraph/t1")}
        assert (
            "contextfold.calls/compaction" in types
            and "contextfold.langgraph/checkpoint-put" in types
        )
        assert agent.get_state(config).values["messages"] == state["messages"]
    _check_session(model, state, calls)


def test_a_tampered_record_is_caught(sqlite_path: str) -> None:
    model = Scripted(steps=STEPS)
    with cf.open_journal_sync(f"sqlite:///{sqlite_path}") as journal:
        agent: Any = create_agent(
            model, tools=[read_file], middleware=[_middleware(journal, stream="chat")]
        )
        agent.invoke({"messages": [("user", "read the files")]})
        assert verify_calls(journal.run(read_calls, "chat")) == []
    # Someone rewrites a recorded tool output in the file.
    with sqlite3.connect(sqlite_path) as db:
        position, data = db.execute(
            "SELECT position, data FROM cf_events WHERE type = 'contextfold.calls/message' "
            "AND CAST(data AS TEXT) LIKE '%f3.py: xxx%'"
        ).fetchone()
        payload = orjson.loads(data)
        payload["message"]["data"]["content"] = "f3.py: nothing to see"
        db.execute(
            "UPDATE cf_events SET data = ? WHERE type = 'contextfold.calls/message' "
            "AND position = ?",
            (orjson.dumps(payload), position),
        )
    with cf.open_journal_sync(f"sqlite:///{sqlite_path}") as journal:
        problems = verify_calls(journal.run(read_calls, "chat"))
    assert [p.position for p in problems][:1] == [position]
    assert problems[0].problem == "the message's JSON does not have its digest"
    assert any("does not have its recorded digest" in p.problem for p in problems[1:])


def test_an_answer_is_never_summarized_away_mid_turn() -> None:
    """The newest answer survives behind the summary with everything after it."""
    model = Scripted(steps=STEPS)
    with cf.open_journal_sync("memory://") as journal:
        agent: Any = create_agent(
            model, tools=[read_file], middleware=[_middleware(journal, stream="chat")]
        )
        state: dict[str, Any] = {"messages": []}
        for n in range(TURNS):
            question = ("user", f"part {n}")
            state = agent.invoke({"messages": [*state["messages"], question]})
    assert len(state["messages"]) == TURNS * (2 * STEPS + 2)
    for sent in model.seen[STEPS + 1 :]:  # every call after the first answer
        answers = [m for m in sent if isinstance(m, AIMessage) and not m.tool_calls]
        assert answers, "the newest answer before the call was sent"
