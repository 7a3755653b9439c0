"""The LangGraph sides of ``benchmarks/frameworks.py``: ``SqliteSaver``
(langgraph-checkpoint-sqlite) against contextfold's ``JournalSaver`` on a SQLite journal.

Each turn writes one checkpoint whose ``messages`` channel is the whole message list so far
(a system message, then per turn a human message, an AI message with a tool call, the tool
message and the AI answer), through each saver's ``put``: the fewest checkpoints any graph
writes per turn (a ReAct agent writes one per step). A load is what a graph does before
calling the model: the thread's latest checkpoint (``get_tuple``), then the model's view
through ``budget_messages`` (contextfold's pair-safe trim, the same function on both sides).
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from _frameworks_sides import FileSide, JournalSide, elapsed_ms
from _frameworks_workload import SYSTEM_PROMPT, Loader, TurnText, digest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    empty_checkpoint,
)
from langgraph.checkpoint.sqlite import SqliteSaver

import contextfold as cf
from contextfold.integrations.langgraph import JournalSaver, budget_messages

__all__ = ["NAME", "Baseline", "Contextfold", "baseline", "contextfold", "messages_of"]

NAME = "langgraph"
THREAD: RunnableConfig = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}


def messages_of(text: TurnText) -> list[BaseMessage]:
    """One turn as LangGraph's ``add_messages`` keeps it (every message has an id)."""
    call = {"id": text.call_id, "name": text.tool, "args": dict(text.arguments)}
    return [
        HumanMessage(text.user, id=f"human-{text.turn}"),
        AIMessage("", tool_calls=[call], id=f"call-{text.turn}"),
        ToolMessage(text.result, tool_call_id=text.call_id, name=text.tool, id=f"tool-{text.turn}"),
        AIMessage(text.answer, id=f"answer-{text.turn}"),
    ]


class _Phases:
    """Where each load's time went: reading the checkpoint, then trimming its messages."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.read: list[float] = []
        self.trim: list[float] = []

    def view(self, began: int, checkpoint: Any) -> Sequence[BaseMessage]:
        read = time.perf_counter_ns()
        messages = budget_messages(checkpoint["channel_values"]["messages"], budget=self.budget)
        self.read.append((read - began) / 1e6)
        self.trim.append(elapsed_ms(read))
        return messages.messages

    def notes(self, name: str, read: str, window: int) -> list[str]:
        if not self.read:
            return []
        return [
            f"{name}: {read} {statistics.median(self.read[-window:]):.1f} ms + budget_messages "
            f"{statistics.median(self.trim[-window:]):.1f} ms (medians): the checkpoint hands "
            "back every message, each built anew"
        ]


def _digest(context: Sequence[Any]) -> str:
    return digest(message.model_dump_json().encode() for message in context)


class _Writer:
    """Checkpoints of a growing message list, one per turn, each child of the last."""

    def __init__(self, saver: BaseCheckpointSaver[Any]) -> None:
        self.saver = saver
        self.config: RunnableConfig = THREAD
        self.version: Any = None
        self.messages: list[BaseMessage] = [SystemMessage(SYSTEM_PROMPT, id="system")]

    def checkpoint(self, text: TurnText) -> tuple[Checkpoint, CheckpointMetadata, ChannelVersions]:
        # A new list each turn, as add_messages makes: the old one may still be referenced.
        self.messages = [*self.messages, *messages_of(text)]
        self.version = self.saver.get_next_version(self.version, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": self.messages}
        checkpoint["channel_versions"] = {"messages": self.version}
        checkpoint["updated_channels"] = ["messages"]
        metadata: CheckpointMetadata = {"source": "loop", "step": text.turn, "parents": {}}
        return checkpoint, metadata, {"messages": self.version}


class Baseline(FileSide):
    """LangGraph's SqliteSaver on a file."""

    digest = staticmethod(_digest)

    def __init__(self, path: Path, budget: float) -> None:
        super().__init__("SqliteSaver", path, budget)
        self.conn = sqlite3.connect(path, check_same_thread=False)
        self.saver = SqliteSaver(self.conn)
        self.writer = _Writer(self.saver)
        self.phases = _Phases(budget)
        self.loaders: dict[str, Loader] = {"get_tuple + budget_messages": self.load}

    async def write(self, text: TurnText, *, loading: bool) -> None:
        checkpoint, metadata, versions = self.writer.checkpoint(text)
        self.writer.config = self.saver.put(self.writer.config, checkpoint, metadata, versions)

    async def load(self) -> Sequence[Any]:
        began = time.perf_counter_ns()
        found = self.saver.get_tuple(THREAD)
        assert found is not None
        return self.phases.view(began, found.checkpoint)

    async def close(self) -> None:
        self.conn.close()

    def notes(self, window: int) -> list[str]:
        return self.phases.notes(self.name, "get_tuple", window)


class Contextfold(JournalSide):
    """contextfold's JournalSaver on a SQLite journal (its async methods, as ainvoke uses)."""

    digest = staticmethod(_digest)

    def __init__(self, path: Path, budget: float) -> None:
        super().__init__("JournalSaver", path, budget)
        self.saver = JournalSaver(self.journal)
        self.writer = _Writer(self.saver)
        self.phases = _Phases(budget)
        self.loaders: dict[str, Loader] = {"aget_tuple + budget_messages": self.load}

    async def write(self, text: TurnText, *, loading: bool) -> None:
        checkpoint, metadata, versions = self.writer.checkpoint(text)
        self.writer.config = await self.saver.aput(
            self.writer.config, checkpoint, metadata, versions
        )

    async def load(self) -> Sequence[Any]:
        began = time.perf_counter_ns()
        found = await self.saver.aget_tuple(THREAD)
        assert found is not None
        return self.phases.view(began, found.checkpoint)

    def first_load(self, journal: cf.Journal) -> Callable[[], Awaitable[object]]:
        async def load() -> object:
            began = time.perf_counter_ns()
            found = await JournalSaver(journal).aget_tuple(THREAD)
            assert found is not None
            return _Phases(self.budget).view(began, found.checkpoint)

        return load

    def notes(self, window: int) -> list[str]:
        return self.phases.notes(self.name, "aget_tuple", window)


def baseline(directory: Path, budget: float) -> Baseline:
    return Baseline(directory / "checkpoints.db", budget)


def contextfold(directory: Path, budget: float) -> Contextfold:
    return Contextfold(directory / "contextfold.db", budget)
