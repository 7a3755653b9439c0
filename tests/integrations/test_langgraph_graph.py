"""A real LangGraph agent on JournalSaver: it runs a tool loop, resumes in a new saver (a new
process), forks from an earlier checkpoint, and its storage grows linearly with turns."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.channels.delta import DeltaChannel
from langgraph.graph import START, StateGraph

import contextfold as cf
from contextfold.integrations.langgraph import JournalSaver
from tests.integrations.helpers import build_agent, turn


def _id(config: RunnableConfig) -> str:
    return str(config["configurable"]["checkpoint_id"])


def _texts(state: dict[str, Any]) -> list[str]:
    return [str(m.content) for m in state["messages"]]


def test_a_graph_runs_resumes_in_a_new_saver_and_forks(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'agent.db'}"
    config: RunnableConfig = {"configurable": {"thread_id": "chat"}}
    with cf.open_journal_sync(url) as journal:
        graph = build_agent(JournalSaver(journal))
        graph.invoke({"messages": [HumanMessage("hello")]}, config)
        out = graph.invoke({"messages": [HumanMessage("add 3 4")]}, config)
        assert _texts(out)[-1] == "The sum is 7."
        kinds = [type(m) for m in out["messages"]]
        assert kinds == [HumanMessage, AIMessage, HumanMessage, AIMessage, ToolMessage, AIMessage]
        before = graph.get_state(config)

    # Another process: a new journal and saver on the same file pick the thread up.
    with cf.open_journal_sync(url) as journal:
        graph = build_agent(JournalSaver(journal))
        resumed = graph.get_state(config)
        assert resumed.values["messages"] == before.values["messages"]
        assert resumed.config == before.config
        out = graph.invoke({"messages": [HumanMessage("and now?")]}, config)
        assert _texts(out)[-2:] == ["and now?", "echo: and now?"]
        head = graph.get_state(config)

        # Fork from the checkpoint that ended the first turn (two messages, nothing next).
        history = list(graph.get_state_history(config))
        first_turn = next(
            s for s in history if len(s.values.get("messages", ())) == 2 and not s.next
        )
        forked = graph.invoke({"messages": [HumanMessage("a fork")]}, first_turn.config)
        assert _texts(forked) == ["hello", "echo: hello", "a fork", "echo: a fork"]
        # The fork's chain of parents leads back to the checkpoint it forked from.
        node = graph.get_state(config)
        assert node.values["messages"] == forked["messages"]
        old_ids = {_id(s.config) for s in history}
        while _id(node.config) not in old_ids:
            assert node.parent_config is not None
            node = graph.get_state(node.parent_config)
        assert _id(node.config) == _id(first_turn.config)
        # The old branch is intact, read by its checkpoint id.
        assert graph.get_state(head.config).values["messages"] == head.values["messages"]


@pytest.fixture(params=["memory", "postgres"])
async def async_journal(request: pytest.FixtureRequest) -> AsyncIterator[cf.Journal]:
    url = "memory://" if request.param == "memory" else request.getfixturevalue("pg_dsn")
    async with cf.open_journal(url) as journal:
        yield journal


async def test_an_async_graph_runs_and_resumes(async_journal: cf.Journal) -> None:
    config: RunnableConfig = {"configurable": {"thread_id": "async-chat"}}
    graph = build_agent(JournalSaver(async_journal))
    for i in range(4):
        out = await graph.ainvoke(turn(i), config)
    assert _texts(out)[:4] == ["add 0 1", "", "1", "The sum is 1."]
    assert len(out["messages"]) == 4 + 2 + 2 + 4  # turns 0 and 3 call the tool

    again = build_agent(JournalSaver(async_journal))  # a cold saver: lists rebuilt from records
    state = await again.aget_state(config)
    assert state.values["messages"] == out["messages"]
    out = await again.ainvoke({"messages": [HumanMessage("add 20 22")]}, config)
    assert _texts(out)[-1] == "The sum is 42."


def _payload_bytes(path: Path) -> int:
    with sqlite3.connect(path) as db:
        (stored,) = db.execute("SELECT COALESCE(SUM(LENGTH(data)), 0) FROM cf_events").fetchone()
    return int(stored)


def test_storage_grows_linearly_with_turns(tmp_path: Path) -> None:
    # LangGraph's own SqliteSaver stores the whole message list again in every checkpoint,
    # so its storage grows with the square of the turns; ours must grow with the turns.
    path = tmp_path / "linear.db"
    config: RunnableConfig = {"configurable": {"thread_id": "long"}}
    stored = {}
    with cf.open_journal_sync(f"sqlite:///{path}") as journal:
        graph = build_agent(JournalSaver(journal))
        for i in range(400):
            graph.invoke(turn(i), config)
            if i + 1 in (200, 400):
                stored[i + 1] = _payload_bytes(path)
        assert len(graph.get_state(config).values["messages"]) == 1068
    ratio = stored[400] / stored[200]
    print(f"bytes stored: 200 turns {stored[200]}, 400 turns {stored[400]}, ratio {ratio:.3f}")
    assert 1.8 <= ratio <= 2.2, stored


def test_the_same_graph_on_langgraphs_sqlite_saver_grows_quadratically(tmp_path: Path) -> None:
    # The baseline of the test above, measured the same way (fewer turns: it grows fast).
    from langgraph.checkpoint.sqlite import SqliteSaver

    config: RunnableConfig = {"configurable": {"thread_id": "long"}}
    stored = {}
    with sqlite3.connect(tmp_path / "baseline.db", check_same_thread=False) as db:
        graph = build_agent(SqliteSaver(db))
        for i in range(100):
            graph.invoke(turn(i), config)
            if i + 1 in (50, 100):
                (checkpoints,) = db.execute(
                    "SELECT SUM(LENGTH(checkpoint) + LENGTH(metadata)) FROM checkpoints"
                ).fetchone()
                (writes,) = db.execute("SELECT SUM(LENGTH(value)) FROM writes").fetchone()
                stored[i + 1] = checkpoints + writes
    assert stored[100] / stored[50] > 3, stored


def _concat(state: list[str] | None, writes: Sequence[Any]) -> list[str]:
    merged = list(state or [])
    for write in writes:
        merged.extend(write if isinstance(write, list) else [write])
    return merged


class _DeltaState(TypedDict):
    log: Annotated[list[str], DeltaChannel(_concat, snapshot_frequency=3)]


def _log(state: _DeltaState) -> dict[str, Any]:
    return {"log": [f"seen {len(state['log'])}"]}


def test_a_delta_channel_is_rebuilt_from_its_writes_by_a_new_saver(tmp_path: Path) -> None:
    # LangGraph's DeltaChannel (beta) stores a sentinel in most checkpoints and replays
    # the pending writes of the parent chain: the saver's parents and writes must hold.
    builder = StateGraph(_DeltaState)
    builder.add_node("log", _log)
    builder.add_edge(START, "log")
    url = f"sqlite:///{tmp_path / 'delta.db'}"
    config: RunnableConfig = {"configurable": {"thread_id": "delta"}}
    with cf.open_journal_sync(url) as journal:
        graph = builder.compile(checkpointer=JournalSaver(journal))
        for i in range(8):
            out = graph.invoke({"log": [f"in {i}"]}, config)
    assert out["log"][-2:] == ["in 7", "seen 15"]
    with cf.open_journal_sync(url) as journal:
        graph = builder.compile(checkpointer=JournalSaver(journal))
        assert graph.get_state(config).values["log"] == out["log"]
