"""The agent context materialized in chunks: a cold read that starts from the chunks and
folds the events after their cursor equals a fold of the whole journal, and no stored
value grows with the stream."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold.context import (
    Actor,
    AgentContext,
    AgentContextState,
    ContextAdded,
    LlmRequestRequested,
    ToolCallResult,
    summary_item,
    tool_result_item,
)
from contextfold.context.materialized import (
    MAX_BATCHES,
    ContextChunk,
    ContextMaterialized,
    SnapshotFold,
    load_materialized,
    plan_materialization,
    restore_state,
    snapshot_event,
)
from contextfold.context.rebuild import rebuild_state
from contextfold.events import Event, StoredEvent, runtime_only_types
from contextfold.journal import Journal
from contextfold.runtime.materializing import materialize_context
from contextfold.server.writers import is_runtime_type
from contextfold.store.base import ReadResult
from contextfold.store.memory import MemoryStore
from contextfold.wire import ToolCall
from tests.context.helpers import HEADER, Log

STREAM = "agents/materialized"
PROMPT_KEY = "agent/system-prompt"


def _plan(
    state: AgentContextState,
    through: str,
    previous: ContextMaterialized | None = None,
    previous_cursor: str | None = None,
) -> tuple[tuple[ContextChunk, ...], ContextMaterialized]:
    """A plan with tiny chunks: many chunks per lane."""
    return plan_materialization(
        state,
        through,
        fold_version=AgentContext.version,
        previous=previous,
        previous_cursor=previous_cursor,
        chunk_items=2,
        chunk_bytes=300,
        chunk_offsets=2,
    )


# -- a stream of context events, the same in a Log (pure) and in a journal ------------------

Op = tuple[str, Any]

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("item"),
            st.tuples(
                st.sampled_from(["system", "developer", "user", "assistant"]),
                st.sampled_from([None, "k1", "k2"]),
                st.sampled_from([None, "user", "slack", "agent"]),
                st.text(max_size=40),
            ),
        ),
        st.tuples(st.just("request"), st.booleans()),
        st.tuples(st.just("summary"), st.integers(min_value=0, max_value=5)),
        st.tuples(st.just("tool"), st.sampled_from(["c1", "c2", "c3"])),
    ),
    max_size=40,
)


def _batches(script: list[Op]) -> list[tuple[list[Event], str]]:
    """The appends of a script: (events, journal meta actor), as the runtime writes them."""
    appends: list[tuple[list[Event], str]] = []
    position = 0
    requests: list[int] = []
    for kind, arg in script:
        if kind == "item":
            role, key, actor, text = arg
            fields: dict[str, Any] = {"key": key, "content": text}
            if actor is not None:
                fields["actor"] = Actor(type=actor)
            if role == "assistant" and requests:
                fields["llm_request_offset"] = requests[-1]
                fields["tool_calls"] = (ToolCall(id=f"call-{position}", name="t"),)
            appends.append(([ContextAdded(role=role, **fields)], "agent"))
        elif kind == "request":
            header = HEADER if arg or not requests else None
            appends.append(([LlmRequestRequested(header=header)], "agent"))
            requests.append(position + 1)
        elif kind == "summary" and requests:
            cutoff = requests[-1 - arg % len(requests)]
            appends.append(([summary_item(f"summary of @{cutoff}", cutoff=cutoff)], "agent"))
        elif kind == "tool":
            result = ToolCallResult(tool_call_id=arg, name="t", content="out")
            appends.append(([result, tool_result_item(result)], "tool"))
        else:
            continue
        position += len(appends[-1][0])
    return appends


def _log(appends: list[tuple[list[Event], str]]) -> Log:
    log = Log()
    for events, actor in appends:
        for event in events:
            log.append(event, actor=actor)
    return log


class CountingStore(MemoryStore):
    """The memory store, counting the events its reads return (how much a fold refolds)."""

    def __init__(self) -> None:
        super().__init__()
        self.read_events = 0

    async def read(self, *args: Any, **kwargs: Any) -> ReadResult:
        page = await super().read(*args, **kwargs)
        self.read_events += len(page.events)
        return page


async def _append_all(journal: Journal, appends: list[tuple[list[Event], str]]) -> None:
    for events, actor in appends:
        await journal.append(STREAM, events, actor=actor)


async def _stored(journal: Journal, cls: type[Event]) -> list[StoredEvent]:
    return [s async for s in journal.read_all(STREAM, types=[cls])]


# -- pure: plan and restore --------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(ops, st.lists(st.integers(min_value=0, max_value=60), max_size=4))
def test_restored_state_equals_the_fold_at_every_point(script: list[Op], cuts: list[int]) -> None:
    """Materialized at several points, each one referencing the previous one's chunks:
    every manifest and its chunks restore exactly the state folded through its point."""
    log = _log(_batches(script))
    pool: dict[str, ContextChunk] = {}
    previous: ContextMaterialized | None = None
    for number, cut in enumerate(sorted(cuts)):
        through = min(cut, len(log.envelopes))
        state = log.state(through=through)
        chunks, manifest = _plan(state, str(through), previous, f"manifest-{number - 1}")
        pool.update({chunk.sha256: chunk for chunk in chunks})
        referenced = [pool[ref.sha256] for ref in manifest.chunks]
        assert restore_state(AgentContext, manifest, referenced) == state
        assert len({ref.batch for ref in manifest.chunks}) <= MAX_BATCHES
        previous = manifest


def test_only_changed_chunks_are_written_again() -> None:
    log = Log()
    log.add("system", "prompt", key="agent/system-prompt")
    for n in range(9):
        log.add("user", f"question {n}", actor=Actor(type="user"))
        log.request()
    first_chunks, first = _plan(log.state(), "a")
    log.add("user", "one more", actor=Actor(type="user"))
    chunks, second = _plan(log.state(), "b", first, "m1")
    # History grew by one item: only its last chunk is new; the rest is referenced.
    last = max(ref.index for ref in second.chunks if ref.lane == "history")
    assert [(c.lane, c.index) for c in chunks] == [("history", last)]
    assert len(second.chunks) == len(first.chunks) + 1
    assert {r.batch for r in second.chunks} == {None, "m1"}
    assert len(first_chunks) == len(first.chunks)  # the first one wrote every chunk


def test_a_compaction_rewrites_the_history_chunks() -> None:
    log = Log()
    for n in range(6):
        log.add("user", f"q{n}", actor=Actor(type="user"))
    r = log.request()
    _, first = _plan(log.state(), "a")
    log.append(summary_item("gist", cutoff=r))
    chunks, _ = _plan(log.state(), "b", first, "m1")
    assert [c.lane for c in chunks] == ["history"]
    assert chunks[0].items[0].content == "gist"


def test_references_span_at_most_max_batches_appends() -> None:
    log = Log()
    previous: ContextMaterialized | None = None
    spans = []
    for n in range(3 * MAX_BATCHES):
        log.add("user", f"q{n}", actor=Actor(type="user"))
        log.add("user", f"r{n}", actor=Actor(type="user"))
        _, manifest = _plan(log.state(), str(n), previous, f"m{n}")
        spans.append(len({ref.batch for ref in manifest.chunks}))
        previous = manifest
    assert max(spans) == MAX_BATCHES and min(spans[MAX_BATCHES:]) == 1  # then all anew


def test_a_manifest_that_does_not_match_its_chunks_is_refused() -> None:
    log = Log()
    log.add("user", "q", actor=Actor(type="user"))
    log.request()
    chunks, manifest = _plan(log.state(), "a")
    with pytest.raises(ValueError, match="missing or not the one named"):
        restore_state(AgentContext, manifest, chunks[1:])
    other = chunks[0].model_copy(update={"sha256": "0" * 64})
    with pytest.raises(ValueError, match="missing or not the one named"):
        restore_state(AgentContext, manifest, (other, *chunks[1:]))
    fewer = manifest.model_copy(update={"state": {"published_through": 2}})
    with pytest.raises(ValueError, match="fields"):
        restore_state(AgentContext, fewer, chunks)


# -- in a journal: cold reads start from the chunks --------------------------------------------


@settings(max_examples=25, deadline=None)
@given(ops, st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=3))
def test_a_cold_read_from_the_chunks_equals_a_fold_from_the_start(
    script: list[Op], cuts: list[int]
) -> None:
    appends = _batches(script)

    async def run() -> None:
        store = CountingStore()
        journal = Journal(store)
        done = 0
        for cut in sorted(cuts):
            await _append_all(journal, appends[done:cut])
            done = max(done, cut)
            if await journal.version(STREAM):
                await materialize_context(journal, STREAM)
        await _append_all(journal, appends[done:])
        if not await journal.version(STREAM):
            return
        expected = await rebuild_state(journal, STREAM, 10**9)
        fresh = Journal(store)  # another process: nothing cached
        assert await fresh.fold(AgentContext, STREAM) == expected
        assert await journal.fold(AgentContext, STREAM) == expected

    asyncio.run(run())


async def test_a_restarted_reader_folds_only_the_events_after_the_cursor() -> None:
    store = CountingStore()
    journal = Journal(store)
    await journal.append(
        STREAM, ContextAdded(role="system", content="p", key="agent/system-prompt")
    )
    for n in range(200):
        await journal.append(STREAM, ContextAdded(role="user", content=f"q{n}"))
        await journal.append(STREAM, LlmRequestRequested(header=HEADER), actor="agent")
    done = await materialize_context(journal, STREAM)
    assert done is not None and done.written == done.referenced
    await journal.append(STREAM, ContextAdded(role="user", content="after"))

    expected = await rebuild_state(journal, STREAM, 10**9)
    store.read_events = 0
    state = await Journal(store).fold(AgentContext, STREAM)
    assert state == expected
    assert state.history[-1].content == "after"
    assert store.read_events == 1  # not the 401 events before the cursor

    assert await materialize_context(journal, STREAM) is not None
    assert await materialize_context(journal, STREAM) is None  # up to date: nothing stored
    again = [s.position for s in await _stored(journal, ContextMaterialized)]
    assert len(again) == 2


async def test_no_stored_value_grows_with_the_stream() -> None:
    """A long stream with compactions: every chunk and manifest stays bounded."""
    journal = Journal(MemoryStore())
    await journal.append(
        STREAM, ContextAdded(role="system", content="p", key="agent/system-prompt")
    )
    sizes: list[int] = []
    for turn in range(60):
        await journal.append(STREAM, ContextAdded(role="user", content=f"question {turn} " * 20))
        request = await journal.append(STREAM, LlmRequestRequested(header=HEADER), actor="agent")
        if turn % 10 == 9:
            summary = summary_item("gist " * 20, cutoff=request.first_position)
            await journal.append(STREAM, summary, actor="agent")
        if turn % 5 == 4:
            await materialize_context(journal, STREAM)
            manifest = (await _stored(journal, ContextMaterialized))[-1]
            sizes.append(len(manifest.data))
    chunk_sizes = [len(s.data) for s in await _stored(journal, ContextChunk)]
    assert max(chunk_sizes) < 300 * 1024
    assert max(sizes[4:]) < 2 * min(sizes[4:])  # compaction bounds it: no growth


async def test_an_unusable_materialization_is_skipped() -> None:
    journal = Journal(MemoryStore())
    await journal.append(STREAM, ContextAdded(role="user", content="q"))
    await journal.append(STREAM, LlmRequestRequested(header=HEADER), actor="agent")
    await materialize_context(journal, STREAM)
    [good] = await _stored(journal, ContextMaterialized)
    manifest = ContextMaterialized.model_validate_json(good.data)
    expected = await rebuild_state(journal, STREAM, 10**9)

    # Newer manifests that cannot be used: another writer's, another fold version's, and
    # one naming a chunk that is not in the stream. The good one below them is used.
    await journal.append(STREAM, manifest, actor="http")
    await journal.append(STREAM, manifest.model_copy(update={"fold_version": 99}), actor="agent")
    [ref, *rest] = manifest.chunks
    wrong = manifest.model_copy(update={"chunks": (ref.model_copy(update={"back": 9}), *rest)})
    await journal.append(STREAM, wrong, actor="agent")
    loaded = await load_materialized(AgentContext, journal.store, journal.namespace, STREAM)
    assert loaded is None  # the three newest were tried, none usable: fold from the start
    assert await Journal(journal.store).fold(AgentContext, STREAM) == expected

    await journal.append(STREAM, manifest.model_copy(update={"through": "999999"}), actor="agent")
    assert await load_materialized(AgentContext, journal.store, journal.namespace, STREAM) is None
    assert await Journal(journal.store).fold(AgentContext, STREAM) == expected


def test_the_materialization_events_are_runtime_only() -> None:
    for cls in (ContextChunk, ContextMaterialized):
        assert cls.event_type in runtime_only_types()
        assert is_runtime_type(cls.event_type)


# -- small folds: one snapshot ----------------------------------------------------------------

Counter: SnapshotFold[int] = SnapshotFold("materialized_counter", state=int, checkpoints=False)


@Counter.on(ContextAdded)
def _count(state: int, ev: Any) -> int:
    return state + 1


async def test_a_snapshot_fold_starts_from_the_agents_newest_snapshot() -> None:
    store = CountingStore()
    journal = Journal(store)
    for n in range(30):
        await journal.append(STREAM, ContextAdded(role="user", content=f"q{n}"))
    state, cursor = await journal.folds.read_with_cursor(Counter, journal.namespace, STREAM)
    await journal.append(STREAM, snapshot_event(Counter, state, cursor), actor="agent")
    await journal.append(STREAM, ContextAdded(role="user", content="after"))
    store.read_events = 0
    assert await Journal(store).fold(Counter, STREAM) == 31
    assert store.read_events == 1  # only the item after the snapshot

    # Another writer's snapshot (here: a wrong count) is never used.
    forged = snapshot_event(Counter, 1000, cursor)
    await journal.append(STREAM, forged, actor="http")
    assert await Journal(store).fold(Counter, STREAM) == 31
    assert Counter.snapshot_type.startswith("contextfold.agent/")
    assert is_runtime_type(Counter.snapshot_type)
