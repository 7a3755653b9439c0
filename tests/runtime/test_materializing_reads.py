"""An agent on a stream shorter than its materialization interval never looks up when its
context was last materialized: nothing can be due there, whatever the answer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from contextfold.context.events import ContextAdded
from contextfold.context.materialized import ContextMaterialized
from contextfold.events import StoredEvent
from contextfold.journal import Journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.store.memory import MemoryStore

STREAM = "agents/materializing-reads"


class LookUps(MemoryStore):
    """A memory store counting the ``latest`` look-ups of materializations."""

    materialized = 0

    async def latest(
        self, namespace: str, stream: str, types: Sequence[str], **options: Any
    ) -> tuple[StoredEvent, ...]:
        if ContextMaterialized.event_type in types:
            self.materialized += 1
        return await super().latest(namespace, stream, types, **options)


async def test_a_short_stream_costs_no_materialization_look_up() -> None:
    store = LookUps()
    journal = Journal(store)
    await journal.append(
        STREAM, [system_prompt("You answer."), ContextAdded(role="user", content="hi")]
    )
    agent = Agent(journal, STREAM, FunctionModel(lambda request: "ok"))
    agent.settings.materialize_every = 50
    report = await agent.run_until_idle()
    assert report.requests == [3]
    cold = store.materialized  # the context fold's first read starts from a materialization
    for n in range(3):
        await journal.append(STREAM, ContextAdded(role="user", content=f"again {n}"))
        fresh = Agent(journal, STREAM, FunctionModel(lambda request: "ok"))  # a new instance
        fresh.settings.materialize_every = 50
        assert (await fresh.run_until_idle()).requests
    assert store.materialized == cold == 1
