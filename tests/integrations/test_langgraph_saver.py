"""JournalSaver beyond LangGraph's conformance suite: what it stores (each channel version
once, lists as their new items), that its reads are indexed, what each deletion leaves in
the journal, sync and async use, and the errors it gives."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, CheckpointMetadata
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.serde.types import ERROR

import contextfold as cf
from contextfold.integrations._langgraph_index import (
    ChannelBlob,
    CheckpointPut,
    CheckpointsRetracted,
    ThreadCleared,
)
from contextfold.integrations.langgraph import JournalSaver
from contextfold.testing import RecordingStore


@pytest.fixture
def journal() -> Iterator[cf.SyncJournal]:
    with cf.open_journal_sync("memory://") as opened:
        yield opened


def _put(
    saver: JournalSaver,
    thread: str,
    values: dict[str, Any],
    *,
    versions: dict[str, Any],
    new: dict[str, Any] | None = None,
    parent: RunnableConfig | None = None,
    metadata: dict[str, Any] | None = None,
    ns: str = "",
) -> RunnableConfig:
    checkpoint: Checkpoint = {
        "v": 1,
        "id": str(uuid6(clock_seq=-1)),
        "ts": "2025-01-01T00:00:00+00:00",
        "channel_values": values,
        "channel_versions": versions,
        "versions_seen": {},
        "updated_channels": None,
    }
    configurable: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if parent is not None:
        configurable["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    meta: CheckpointMetadata = {"source": "loop", "step": 0, **(metadata or {})}  # type: ignore[typeddict-item]
    return saver.put({"configurable": configurable}, checkpoint, meta, new or versions)


def _values(saver: JournalSaver, config: RunnableConfig) -> dict[str, Any]:
    found = saver.get_tuple(config)
    assert found is not None
    return found.checkpoint["channel_values"]


def _records(journal: cf.SyncJournal, stream: str, cls: type[cf.Event]) -> list[Any]:
    return [e.decode(cls) for e in journal.read_all(stream, types=[cls])]


# -- what is stored ---------------------------------------------------------------------------


def test_an_unchanged_channel_is_written_once(journal: cf.SyncJournal) -> None:
    saver = JournalSaver(journal)
    first = _put(saver, "t", {"doc": "big text " * 100, "n": 1}, versions={"doc": 1, "n": 1})
    second = _put(
        saver, "t", {"doc": "big text " * 100, "n": 2}, versions={"doc": 1, "n": 2},
        new={"n": 2}, parent=first,
    )  # fmt: skip
    blobs = _records(journal, "langgraph/t", ChannelBlob)
    assert sorted((b.channel, b.version) for b in blobs) == [("doc", 1), ("n", 1), ("n", 2)]
    assert _values(saver, second) == {"doc": "big text " * 100, "n": 2}


def test_a_growing_list_is_stored_as_the_items_it_gained(journal: cf.SyncJournal) -> None:
    saver = JournalSaver(journal)
    one = _put(saver, "t", {"m": ["a", "b", "c"]}, versions={"m": 1})
    two = _put(saver, "t", {"m": ["a", "b", "c", "d", "e"]}, versions={"m": 2}, parent=one)
    three = _put(saver, "t", {"m": ["a", "X", "c", "d", "e", "f"]}, versions={"m": 3}, parent=two)
    blobs = _records(journal, "langgraph/t", ChannelBlob)
    assert [(b.base, b.keep, len(b.items)) for b in blobs] == [(None, 0, 3), (1, 3, 2), (2, 1, 5)]
    cold = JournalSaver(journal)  # no cached list: each is rebuilt from its delta chain
    for saver_ in (saver, cold):
        assert _values(saver_, one) == {"m": ["a", "b", "c"]}
        assert _values(saver_, two) == {"m": ["a", "b", "c", "d", "e"]}
        assert _values(saver_, three) == {"m": ["a", "X", "c", "d", "e", "f"]}


def test_a_long_delta_chain_is_rebuilt_by_a_new_saver(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'chain.db'}"
    with cf.open_journal_sync(url) as journal:
        saver = JournalSaver(journal)
        config = None
        for n in range(1, 60):
            config = _put(saver, "t", {"m": list(range(n))}, versions={"m": n}, parent=config)
    assert config is not None
    with cf.open_journal_sync(url) as journal:
        assert _values(JournalSaver(journal), config) == {"m": list(range(59))}


def test_a_value_over_the_part_size_is_split_and_one_over_the_limit_refused() -> None:
    with cf.open_journal_sync("memory://", max_payload_bytes=10_000) as journal:
        saver = JournalSaver(journal)
        big = "x" * 60_000
        config = _put(saver, "t", {"doc": big, "m": ["y" * 3000] * 8}, versions={"doc": 1, "m": 1})
        assert _values(saver, config) == {"doc": big, "m": ["y" * 3000] * 8}
        parts = _records(journal, "langgraph/t", ChannelBlob)
        assert len([p for p in parts if p.channel == "doc"]) > 5
        assert len([p for p in parts if p.channel == "m"]) > 1

        version = journal.version("langgraph/t")
        with pytest.raises(cf.PayloadError, match=r"thread 't' checkpoint '.*'.*over the limit"):
            _put(saver, "t", {"m": ["z" * 20_000]}, versions={"m": 2}, parent=config)
        assert journal.version("langgraph/t") == version  # nothing was written


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["append", "truncate", "replace", "value", "same"]),
            st.lists(st.text(max_size=900), max_size=4),
            st.integers(min_value=0, max_value=50),
        ),
        min_size=1,
        max_size=12,
    )
)
def test_every_checkpoint_reads_back_the_values_it_was_put_with(
    steps: list[tuple[str, list[str], int]],
) -> None:
    # Lists that grow, shrink, change in the middle or become other values, with forks
    # (a random parent), over small parts: each checkpoint reads back exactly, warm or cold.
    with cf.open_journal_sync("memory://", max_payload_bytes=4096) as journal:
        saver = JournalSaver(journal)
        value: Any = []
        put: list[tuple[RunnableConfig, Any]] = []
        for version, (op, items, pick) in enumerate(steps, start=1):
            current = value if isinstance(value, list) else []
            if op == "append":
                value = [*current, *items]
            elif op == "truncate":
                value = current[: pick % (len(current) + 1)]
            elif op == "replace" and current:
                value = [*current[: pick % len(current)], *items]
            elif op == "value":
                value = {"text": "".join(items), "n": pick}
            parent = put[pick % len(put)][0] if put else None
            config = _put(
                saver, "t", {"c": value, "k": version}, versions={"c": version, "k": version},
                parent=parent,
            )  # fmt: skip
            put.append((config, value))
        cold = JournalSaver(journal)
        for config, expected in put:
            assert _values(saver, config)["c"] == expected
            assert _values(cold, config)["c"] == expected


def test_a_warm_get_tuple_reads_the_same_few_records_at_any_history_length() -> None:
    store = RecordingStore()
    with cf.SyncJournal(cf.Journal(store)) as journal:
        saver = JournalSaver(journal)
        config = None
        read = {}
        for n in range(1, 201):
            values = {"m": [f"message {i}" for i in range(n)], "step": n, "static": "s"}
            versions = {"m": n, "step": n, "static": 1}
            config = _put(saver, "t", values, versions=versions, parent=config)
            if n in (10, 200):
                saver.get_tuple({"configurable": {"thread_id": "t"}})  # the fold catches up
                before = store.events_read()
                found = saver.get_tuple({"configurable": {"thread_id": "t"}})
                assert found is not None and len(found.checkpoint["channel_values"]["m"]) == n
                read[n] = store.events_read() - before
        assert read[200] == read[10] <= 5, read


# -- what deletions leave ----------------------------------------------------------------------


def test_delete_thread_appends_a_record_and_hard_delete_drops_the_stream(
    journal: cf.SyncJournal,
) -> None:
    soft, hard = JournalSaver(journal), JournalSaver(journal, hard_delete=True)
    _put(soft, "soft", {"a": 1}, versions={"a": 1})
    _put(hard, "hard", {"a": 1}, versions={"a": 1})
    soft.delete_thread("soft")
    hard.delete_thread("hard")
    assert soft.get_tuple({"configurable": {"thread_id": "soft"}}) is None
    assert hard.get_tuple({"configurable": {"thread_id": "hard"}}) is None
    kinds = [e.type for e in journal.read_all("langgraph/soft")]
    assert kinds[-1] == ThreadCleared.event_type and CheckpointPut.event_type in kinds
    assert journal.version("langgraph/hard") == 0
    # The thread lives on after a soft delete: only what came after is seen.
    again = _put(soft, "soft", {"a": 2}, versions={"a": 1})
    assert [t.config for t in soft.list({"configurable": {"thread_id": "soft"}})] == [again]
    assert _values(soft, again) == {"a": 2}


def test_prune_and_delete_for_runs_retract_what_they_remove(journal: cf.SyncJournal) -> None:
    saver = JournalSaver(journal)
    config = None
    ids = []
    for n in range(1, 5):
        meta = {"run_id": f"run-{n % 2}"}
        config = _put(saver, "t", {"m": list(range(n))}, versions={"m": n}, parent=config,
                      metadata=meta)  # fmt: skip
        ids.append(config["configurable"]["checkpoint_id"])
    saver.delete_for_runs(["run-1"])
    retracted = _records(journal, "langgraph/t", CheckpointsRetracted)
    assert [(r.reason, r.run_ids, r.checkpoints) for r in retracted] == [
        ("delete_for_runs", ("run-1",), (("", ids[0]), ("", ids[2])))
    ]
    saver.prune(["t"], strategy="keep_latest")
    last = _records(journal, "langgraph/t", CheckpointsRetracted)[-1]
    assert (last.reason, last.checkpoints) == ("prune", (("", ids[1]),))
    listed = list(saver.list({"configurable": {"thread_id": "t"}}))
    assert [t.config["configurable"]["checkpoint_id"] for t in listed] == [ids[3]]
    # Blobs are never retracted: the kept list still rebuilds through pruned versions.
    assert listed[0].checkpoint["channel_values"] == {"m": [0, 1, 2, 3]}


def test_a_copied_thread_stands_alone(journal: cf.SyncJournal) -> None:
    saver = JournalSaver(journal, hard_delete=True)
    config = None
    for n in range(1, 4):
        config = _put(saver, "src", {"m": list(range(n))}, versions={"m": n}, parent=config)
    assert config is not None
    saver.put_writes(config, [("m", "pending")], "task-1")
    saver.copy_thread("src", "dst")
    saver.delete_thread("src")
    copied = saver.get_tuple({"configurable": {"thread_id": "dst"}})
    assert copied is not None
    assert copied.checkpoint["channel_values"] == {"m": [0, 1, 2]}
    assert copied.pending_writes == [("task-1", "m", "pending")]
    assert copied.parent_config is not None
    assert len(list(saver.list({"configurable": {"thread_id": "dst"}}))) == 3


def test_a_special_write_replaces_and_a_regular_one_is_kept_once(journal: cf.SyncJournal) -> None:
    saver = JournalSaver(journal)
    config = _put(saver, "t", {}, versions={})
    saver.put_writes(config, [("ch", "first"), (ERROR, "boom")], "task")
    saver.put_writes(config, [("ch", "retry"), (ERROR, "boom again")], "task")
    found = saver.get_tuple(config)
    assert found is not None
    assert sorted(w[1:] for w in found.pending_writes or []) == [
        ("__error__", "boom again"),
        ("ch", "first"),
    ]


def _bounded(call: Callable[[], Any]) -> Any:
    """``call()`` in a thread, failing the test when it has not returned in 10 seconds."""
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(call()), daemon=True)
    worker.start()
    worker.join(10)
    assert not worker.is_alive(), "the call did not return"
    return result[0]


def test_a_checkpoint_put_under_its_descendant_leaves_the_delta_walk_finite(
    journal: cf.SyncJournal,
) -> None:
    # As SqliteSaver (INSERT OR REPLACE): the put is taken and its parent replaced, which
    # makes the parent chain a loop; the DeltaChannel walk stops where it loops.
    saver = JournalSaver(journal)
    first = _put(saver, "t", {}, versions={})
    saver.put_writes(first, [("messages", "a")], "task-1")
    second = _put(saver, "t", {}, versions={}, parent=first)
    saver.put_writes(second, [("messages", "b")], "task-2")
    found = saver.get_tuple(first)
    assert found is not None
    under_second: RunnableConfig = {"configurable": {**second["configurable"]}}
    assert saver.put(under_second, found.checkpoint, found.metadata, {}) == first
    again = saver.get_tuple(first)
    assert again is not None and again.parent_config == second  # the chain is a loop
    expected = {"messages": {"writes": [("task-1", "messages", "a")]}}
    walk = functools.partial(saver.get_delta_channel_history, config=second, channels=["messages"])
    assert _bounded(walk) == expected
    awalk = saver.aget_delta_channel_history(config=second, channels=["messages"])
    assert _bounded(lambda: asyncio.run(awalk)) == expected
    # Each checkpoint's writes once, from the target's parent back to the loop.
    from_first = saver.get_delta_channel_history(config=first, channels=["messages"])
    assert from_first == {"messages": {"writes": [("task-2", "messages", "b")]}}


def test_versions_grow_and_two_forks_of_one_parent_never_share_one() -> None:
    saver = JournalSaver(cf.open_journal("memory://"))
    first = saver.get_next_version(None, None)
    fork_a, fork_b = saver.get_next_version(first, None), saver.get_next_version(first, None)
    assert first < fork_a and first < fork_b and fork_a != fork_b
    assert saver.get_next_version(7, None) > saver.get_next_version(6, None)  # type: ignore[arg-type]


# -- sync and async ----------------------------------------------------------------------------


async def test_over_an_async_journal_sync_calls_work_only_off_its_loop() -> None:
    async with cf.open_journal("memory://") as journal:
        saver = JournalSaver(journal)
        config: RunnableConfig = {"configurable": {"thread_id": "t"}}
        await saver.aput(
            config,
            {"v": 1, "id": str(uuid6()), "ts": "", "channel_values": {"a": 1},
             "channel_versions": {"a": 1}, "versions_seen": {}, "updated_channels": None},
            {"source": "input", "step": -1},
            {"a": 1},
        )  # fmt: skip
        with pytest.raises(cf.InvalidInputError, match="async methods"):
            saver.get_tuple(config)
        found = await asyncio.to_thread(saver.get_tuple, config)
        assert found is not None and found.checkpoint["channel_values"] == {"a": 1}


def test_over_a_sync_journal_async_calls_run_from_any_loop(journal: cf.SyncJournal) -> None:
    saver = JournalSaver(journal)
    config = _put(saver, "t", {"a": 1}, versions={"a": 1})
    results: list[Any] = []

    def other_thread() -> None:
        results.append(asyncio.run(saver.aget_tuple(config)))

    worker = threading.Thread(target=other_thread)
    worker.start()
    worker.join()
    assert results[0] is not None and results[0].checkpoint["channel_values"] == {"a": 1}


# -- errors ------------------------------------------------------------------------------------


def test_bad_configs_and_options_are_refused_naming_what_is_wrong(
    journal: cf.SyncJournal,
) -> None:
    saver = JournalSaver(journal)
    with pytest.raises(cf.InvalidInputError, match=r"thread_id'\] is missing"):
        saver.get_tuple({"configurable": {}})
    with pytest.raises(cf.InvalidStreamNameError, match=r"thread_id 'a\\nb'"):
        saver.get_tuple({"configurable": {"thread_id": "a\nb"}})
    with pytest.raises(cf.InvalidInputError, match="prune strategy 'all'"):
        saver.prune(["t"], strategy="all")
    with pytest.raises(cf.InvalidInputError, match="sequence of run ids"):
        saver.delete_for_runs("run-1")
    with pytest.raises(cf.InvalidInputError, match="same thread"):
        saver.copy_thread("t", "t")
    with pytest.raises(cf.InvalidInputError, match="hard_delete"):
        JournalSaver(journal, hard_delete="yes")  # type: ignore[arg-type]
    with pytest.raises(cf.InvalidInputError, match="Journal"):
        JournalSaver("sqlite:///x.db")  # type: ignore[arg-type]
    with pytest.raises(cf.InvalidStreamNameError, match="stream_prefix ' lg/'"):
        JournalSaver(journal, stream_prefix=" lg/")
    with pytest.raises(cf.PayloadError, match=r"checkpoint '.*': metadata\.blob"):
        _put(saver, "t", {}, versions={}, metadata={"blob": object()})
    with pytest.raises(cf.InvalidInputError, match="channel 'a' version True"):
        _put(saver, "t", {"a": 1}, versions={"a": True})
    assert journal.version("langgraph/t") == 0  # nothing was written
