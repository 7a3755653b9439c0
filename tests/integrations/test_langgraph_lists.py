"""JournalSaver's decoded lists: a read decodes only what its version added, hands back a list
the caller may change freely, and always equals what a cold saver reads."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, CheckpointMetadata
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph.message import add_messages

import contextfold as cf
from contextfold.integrations._langgraph_lists import shareable
from contextfold.integrations.langgraph import JournalSaver

THREAD: RunnableConfig = {"configurable": {"thread_id": "t"}}


class _CountingSerde(JsonPlusSerializer):
    """LangGraph's default serializer, counting the values it decodes."""

    loads = 0

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        self.loads += 1
        return super().loads_typed(data)


@pytest.fixture
def journal() -> Iterator[cf.SyncJournal]:
    with cf.open_journal_sync("memory://") as opened:
        yield opened


def _put(
    saver: JournalSaver, values: dict[str, Any], version: int, parent: RunnableConfig | None
) -> RunnableConfig:
    checkpoint: Checkpoint = {
        "v": 1,
        "id": str(uuid6(clock_seq=-1)),
        "ts": "2025-01-01T00:00:00+00:00",
        "channel_values": values,
        "channel_versions": dict.fromkeys(values, version),
        "versions_seen": {},
        "updated_channels": None,
    }
    configurable: dict[str, Any] = {"thread_id": "t", "checkpoint_ns": ""}
    if parent is not None:
        configurable["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    meta: CheckpointMetadata = {"source": "loop", "step": version}
    versions: dict[str, str | int | float] = dict.fromkeys(values, version)
    return saver.put({"configurable": configurable}, checkpoint, meta, versions)


def _messages(saver: JournalSaver, config: RunnableConfig = THREAD) -> list[Any]:
    found = saver.get_tuple(config)
    assert found is not None
    messages: list[Any] = found.checkpoint["channel_values"]["m"]
    return messages


def _turn(n: int) -> list[BaseMessage]:
    call = {"id": f"c{n}", "name": "add", "args": {"n": n}}
    return [
        HumanMessage(f"question {n}", id=f"h{n}"),
        AIMessage("", tool_calls=[call], id=f"a{n}"),
        ToolMessage(f"result {n}", tool_call_id=f"c{n}", id=f"t{n}"),
    ]


def test_a_warm_read_decodes_only_the_items_its_version_added(journal: cf.SyncJournal) -> None:
    serde = _CountingSerde()
    saver = JournalSaver(journal, serde=serde)
    config: RunnableConfig | None = None
    messages: list[BaseMessage] = []
    for n in range(1, 30):
        messages = [*messages, *_turn(n)]
        config = _put(saver, {"m": messages}, n, config)
        before = serde.loads
        assert _messages(saver) == messages
        # The checkpoint itself, then the three messages of this turn; nothing older again.
        assert serde.loads - before == 1 + 3
    before = serde.loads
    assert _messages(saver) == messages
    assert serde.loads - before == 1  # the same version again: only the checkpoint


def test_changing_the_list_read_never_changes_the_next_read(journal: cf.SyncJournal) -> None:
    saver = JournalSaver(journal)
    messages = [*_turn(1), *_turn(2)]
    _put(saver, {"m": messages}, 1, None)
    first = _messages(saver)
    first.append(HumanMessage("extra", id="x"))
    first[0] = HumanMessage("replaced", id="r")
    del first[1:3]
    first.sort(key=lambda m: str(m.id))
    assert _messages(saver) == messages
    _messages(saver).clear()
    assert _messages(saver) == messages


def test_messages_langgraph_edits_in_place_are_built_anew_per_read(
    journal: cf.SyncJournal,
) -> None:
    # add_messages gives every id-less message of the list it is handed an id, in place.
    saver = JournalSaver(journal)
    messages = [HumanMessage("no id"), *_turn(1), {"note": "a dict"}]
    _put(saver, {"m": messages}, 1, None)
    loaded = _messages(saver)
    merged: Any = add_messages(loaded[:-1], AIMessage("answer", id="z"))
    assert merged[0].id is not None and loaded[0].id is not None
    loaded[-1]["note"] = "edited"
    again = _messages(saver)
    assert again[0].id is None
    assert again == messages == _messages(JournalSaver(journal))
    assert again[1] is loaded[1]  # a message with an id is shared: it is a value


def test_shareable_is_a_message_with_an_id_or_an_immutable_scalar() -> None:
    assert shareable(HumanMessage("a", id="1"))
    assert shareable("text") and shareable(3) and shareable(None) and shareable(b"x")
    assert not shareable(HumanMessage("a"))
    assert not shareable(HumanMessage("a", id=""))
    assert not shareable({"a": 1}) and not shareable([1]) and not shareable((1, [2]))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(
            st.sampled_from(["append", "truncate", "edit", "fork"]),
            st.integers(min_value=0, max_value=40),
        ),
        min_size=1,
        max_size=14,
    ),
    cache_bytes=st.sampled_from([0, 2_000, 64 * 2**20]),
)
def test_warm_reads_equal_a_cold_saver_whatever_the_history(
    steps: list[tuple[str, int]], cache_bytes: int
) -> None:
    # Lists that grow, shrink, change in the middle and fork, read back through a cache
    # that holds all, some (evicting) or none of them, and changed by the caller after
    # every read: every checkpoint reads back what it was put with, as a cold saver reads it.
    with cf.open_journal_sync("memory://") as journal:
        saver = JournalSaver(journal, cache_bytes=cache_bytes)
        put: list[tuple[RunnableConfig, list[Any]]] = []
        value: list[Any] = []
        for version, (op, pick) in enumerate(steps, start=1):
            if op == "append":
                value = [*value, *_turn(version), {"n": pick}]
            elif op == "truncate":
                value = value[: pick % (len(value) + 1)]
            elif op == "edit" and value:
                at = pick % len(value)
                value = [*value[:at], HumanMessage(f"edit {version}", id=f"e{version}")]
            parent = put[pick % len(put)][0] if put and op == "fork" else None
            if op == "fork" and put:
                value = [*put[pick % len(put)][1], HumanMessage("fork", id=f"f{version}")]
            config = _put(saver, {"m": value}, version, parent or (put[-1][0] if put else None))
            put.append((config, value))
            read = _messages(saver, config)
            assert read == value
            read.append("caller's")
            for item in read:
                if isinstance(item, dict):
                    item["n"] = "changed"
        cold = JournalSaver(journal)
        for config, expected in put:
            assert _messages(saver, config) == expected == _messages(cold, config)
