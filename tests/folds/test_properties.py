"""Property: a warm read equals a cold rebuild, for any interleaving of appends, reads,
checkpoints and compactions (concurrent ones, appends while a summary is written),
on the in-memory store and on SQLite."""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

import contextfold as cf
from contextfold.examples.coding_assistant import (
    AssistantMessage,
    ModelStep,
    ToolCall,
    ToolResult,
    UserPrompt,
    conversation_fold,
)
from contextfold.store.memory import MemoryStore
from contextfold.store.sqlite import SQLiteStore

# The worked example's fold, but reporting a result without its step (the reader's skip path).
Conversation = conversation_fold("propconv", on_missing="report")


class Tally(BaseModel):
    model_config = ConfigDict(frozen=True)
    events: int = 0
    outputs: tuple[str, ...] = ()
    compactions: int = 0


Tallied: cf.Fold[Tally] = cf.Fold("proptally", state=Tally)


@Tallied.on(UserPrompt)
def _tally_prompt(state: Tally, ev: cf.Envelope[UserPrompt]) -> Tally:
    return state.model_copy(update={"events": state.events + 1})


@Tallied.on(ToolResult)
def _tally_result(state: Tally, ev: cf.Envelope[ToolResult]) -> Tally:
    return state.model_copy(
        update={"events": state.events + 1, "outputs": (*state.outputs, ev.payload.output)}
    )


VIEW = cf.ContextView(
    Conversation,
    strategies=[
        cf.elide(
            keep_newest=2,
            map=lambda d: (
                d.model_copy(
                    update={
                        "results": tuple(
                            r.model_copy(update={"output": r.output[:3]}) for r in d.results
                        )
                    }
                )
                if d.kind == "step"
                else d
            ),
        ),
        cf.drop_oldest(keep_from=cf.from_newest(Conversation, "user")),
    ],
)

STREAM = "conversation"

# -- operations --------------------------------------------------------------------------------

texts = st.text(alphabet="abcxyz ", max_size=12)
outputs = st.text(alphabet="0123456789", max_size=40)
appends = st.one_of(
    st.tuples(st.just("prompt"), texts),
    st.tuples(st.just("step"), st.integers(0, 3)),
    # A result for step n: an existing one, a compacted one (late) or one that never was.
    st.tuples(st.just("result"), st.integers(0, 12), st.integers(0, 3), outputs),
    st.tuples(st.just("answer"), texts),
    st.tuples(st.just("undecodable")),
)
compactions = st.one_of(
    st.tuples(st.just("next"), st.integers(0, 3), st.integers(0, 2)),
    st.tuples(st.just("policy"), st.sampled_from([10, 25, 50, 100]), st.integers(0, 2)),
    st.tuples(st.just("tally"), st.integers(0, 2)),
)
operations = st.one_of(
    appends,
    appends,
    st.tuples(st.just("read")),
    st.tuples(st.just("compact"), compactions),
    st.tuples(st.just("concurrent"), compactions, compactions),
    st.tuples(st.just("during"), compactions, st.lists(appends, min_size=1, max_size=3)),
)


class Scenario:
    def __init__(self, journal: cf.Journal, cold: Callable[[], Awaitable[tuple[Any, Any]]]) -> None:
        self.journal = journal
        self.cold = cold
        self.steps = 0

    def event(self, op: tuple[Any, ...]) -> cf.Event | cf.RawEvent:
        kind = op[0]
        if kind == "prompt":
            return UserPrompt(text=op[1])
        if kind == "step":
            self.steps += 1
            calls = tuple(ToolCall(id=f"c{i}", name="f", arguments="{}") for i in range(op[1]))
            return ModelStep(step_id=f"s{self.steps}", text="", tool_calls=calls)
        if kind == "result":
            return ToolResult(step_id=f"s{op[1]}", call_id=f"c{op[2]}", output=op[3])
        if kind == "answer":
            return AssistantMessage(text=op[1])
        return cf.RawEvent(ToolResult.event_type, {"step_id": 1})  # no longer decodes

    async def append(self, ops: list[tuple[Any, ...]]) -> None:
        await self.journal.append(STREAM, [self.event(op) for op in ops])
        event("appended")

    async def compact(
        self, spec: tuple[Any, ...], during: list[tuple[Any, ...]] | None = None
    ) -> None:
        async def side_effects(yields: int) -> None:
            for _ in range(yields):
                await asyncio.sleep(0)
            if during:
                await self.append(during)

        kind = spec[0]
        if kind == "next":
            keep, yields = spec[1], spec[2]

            async def next_state(state: cf.SegmentedState[Any, Any]) -> cf.SegmentedState[Any, Any]:
                await side_effects(yields)
                kept = list(state.segments)[len(state.segments) - keep :] if keep else []
                summary = f"{state.summary or ''}/next{len(state.segments) - len(kept)}"
                return cf.SegmentedState(kept, summary)

            await self.journal.checkpoint(Conversation, STREAM, next_state)
        elif kind == "policy":
            budget, yields = spec[1], spec[2]

            async def summarize(*, summary: str | None, older: Any, kept: Any) -> str:
                await side_effects(yields)
                return f"{summary or ''}/policy:{','.join(s.id for s in older)}"

            result = await self.journal.compact(
                Conversation,
                STREAM,
                view=VIEW,
                budget=budget,
                keep_tokens=budget / 2,
                keep_from=cf.newest(),
                summarize=summarize,
            )
            event(f"policy compacted: {result.compacted}")
        else:
            yields = spec[1]

            async def next_tally(state: Tally) -> Tally:
                await side_effects(yields)
                return state.model_copy(
                    update={"outputs": state.outputs[-2:], "compactions": state.compactions + 1}
                )

            await self.journal.checkpoint(Tallied, STREAM, next_tally)

    async def check(self) -> None:
        warm = (
            await self.journal.fold(Conversation, STREAM),
            await self.journal.fold(Tallied, STREAM),
        )
        assert warm == await self.cold()

    async def run(self, ops: list[tuple[Any, ...]]) -> None:
        for op in ops:
            kind = op[0]
            if kind == "read":
                await self.check()
            elif kind == "compact":
                await self.compact(op[1])
            elif kind == "concurrent":
                event("concurrent compactions")
                await asyncio.gather(self.compact(op[1]), self.compact(op[2]))
            elif kind == "during":
                event("appends during a compaction")
                await self.compact(op[1], during=op[2])
            else:
                await self.append([op])
        await self.check()


async def cold_on(store: cf.Store) -> tuple[Any, Any]:
    fresh = cf.Journal(store)
    return await fresh.fold(Conversation, STREAM), await fresh.fold(Tallied, STREAM)


PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(st.lists(operations, min_size=3, max_size=30))
def test_warm_reads_equal_cold_rebuilds_in_memory(ops: list[tuple[Any, ...]]) -> None:
    async def main() -> None:
        store = MemoryStore()
        await Scenario(cf.Journal(store), lambda: cold_on(store)).run(ops)

    asyncio.run(main())


@PROPERTY
@given(st.lists(operations, min_size=3, max_size=30))
def test_warm_reads_equal_cold_rebuilds_on_sqlite(ops: list[tuple[Any, ...]]) -> None:
    async def main(path: str) -> None:
        store = SQLiteStore(path)
        try:
            journal = cf.Journal(store)
            await Scenario(journal, lambda: cold_on(store)).run(ops)
            # The journal that read all along (its cached states, warm) folds what a fresh
            # journal on the same file, through a connection of its own, rebuilds cold.
            again = SQLiteStore(path)
            try:
                assert len(journal.folds.cache) == 2  # both states cached: these reads are warm
                warm = (
                    await journal.fold(Conversation, STREAM),
                    await journal.fold(Tallied, STREAM),
                )
                assert warm == await cold_on(again)
            finally:
                await again.close()
        finally:
            await store.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(main(str(Path(tmp) / "journal.db")))
