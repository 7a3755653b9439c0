"""An agent reads its context and its scheduler together, as of one look at the stream's
head: one head check for the two folds, both states through the same event."""

from __future__ import annotations

from typing import Any

import pytest

import contextfold as cf
from contextfold.context.projection import AgentContext
from contextfold.journal import Journal
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.scheduling import Scheduler
from contextfold.store.memory import MemoryStore
from tests.runtime.helpers import STREAM, lookup, lookup_then_answer


def _count_heads(store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    heads: list[str] = []
    original = store.head

    async def counting(namespace: str, stream: str) -> Any:
        heads.append(stream)
        return await original(namespace, stream)

    monkeypatch.setattr(store, "head", counting)
    return heads


async def test_a_tool_turn_checks_the_head_once_per_pair_of_folds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore()
    journal = Journal(store)
    await journal.append(STREAM, system_prompt("You read files."))
    agent = Agent(journal, STREAM, cf.FunctionModel(lookup_then_answer), tools=[lookup])
    await journal.append(STREAM, cf.ContextAdded(role="user", content="read a"))
    await agent.run_until_idle()  # the first turn reads both folds cold
    heads = _count_heads(store, monkeypatch)
    await journal.append(STREAM, cf.ContextAdded(role="user", content="read b"))
    report = await agent.run_until_idle()
    assert len(report.requests) == 2
    # The turn's four looks at the journal (by the loop three times, once after the tool
    # ran) each read both folds: a head check each (it was one per fold: eight).
    assert heads == [STREAM] * 4


async def test_both_states_are_those_of_the_same_head(journal: Journal) -> None:
    await journal.append(STREAM, system_prompt("You read files."))
    await journal.fold(AgentContext, STREAM)  # cached, then moved past by another writer
    other = Journal(journal.store)
    await other.append(STREAM, cf.ContextAdded(role="user", content="hello"))
    context, sched = await journal.fold_pair(AgentContext, Scheduler, STREAM)
    assert context == await other.fold(AgentContext, STREAM)
    assert sched == await other.fold(Scheduler, STREAM)
    assert context.history[-1].content == "hello"
