"""The pydantic-ai sides of ``benchmarks/frameworks.py``: pydantic-ai's documented pattern of
storing ``all_messages()`` as JSON (``all_messages_json()``, loaded back with
``ModelMessagesTypeAdapter.validate_json``), here in a SQLite table, against contextfold's
``JournalHistory`` on a SQLite journal.

Each turn is four messages: a request with the user prompt (the first also holds the system
prompt), a response calling a tool, a request with its return, a response with the answer.
The baseline row holds the whole conversation, rewritten after each run; a load reads and
validates it and trims it with ``budget_history`` (contextfold's pair-safe processor, which
keeps the system prompt); ``JournalHistory.load(budget=...)`` returns the same view.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _frameworks_sides import FileSide, JournalSide
from _frameworks_workload import SYSTEM_PROMPT, Loader, TurnText
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

import contextfold as cf
from contextfold.integrations.pydantic_ai import JournalHistory, budget_history, messages_digest

__all__ = ["NAME", "Baseline", "Contextfold", "baseline", "contextfold", "messages_of"]

NAME = "pydantic_ai"
STREAM = "pydantic-ai/bench"
_START = datetime(2025, 6, 2, 9, 0, tzinfo=UTC)


def messages_of(text: TurnText) -> list[ModelMessage]:
    """One turn as a run's ``new_messages()`` (fixed timestamps: both sides store equal ones)."""
    at = _START + timedelta(seconds=4 * text.turn)
    prompt: list[ModelRequestPart] = [UserPromptPart(text.user, timestamp=at)]
    if text.turn == 1:
        prompt.insert(0, SystemPromptPart(SYSTEM_PROMPT, timestamp=at))
    call = ToolCallPart(text.tool, dict(text.arguments), tool_call_id=text.call_id)
    result = ToolReturnPart(text.tool, text.result, tool_call_id=text.call_id, timestamp=at)
    return [
        ModelRequest(parts=prompt, timestamp=at),
        ModelResponse(parts=[call], model_name="bench", timestamp=at),
        ModelRequest(parts=[result], timestamp=at),
        ModelResponse(parts=[TextPart(text.answer)], model_name="bench", timestamp=at),
    ]


class Baseline(FileSide):
    """The conversation's ``all_messages_json()`` in one SQLite row, rewritten each turn."""

    digest = staticmethod(messages_digest)

    def __init__(self, path: Path, budget: float) -> None:
        super().__init__("all_messages() JSON in SQLite", path, budget)
        self.conn = sqlite3.connect(path)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS conversations (id TEXT PRIMARY KEY, messages BLOB)"
        )
        self.messages: list[ModelMessage] = []  # the run's all_messages(), as the app holds it
        self.skipped = 0
        self.loaders: dict[str, Loader] = {"validate_json + budget_history": self.load}

    async def write(self, text: TurnText, *, loading: bool) -> None:
        self.messages = [*self.messages, *messages_of(text)]
        if not loading:
            # Each save replaces the whole row, so the row a load reads is the same whether
            # or not the turns between loads were saved: those saves are skipped for time.
            self.skipped += 1
            return
        with self.conn:
            self.conn.execute(
                "INSERT OR REPLACE INTO conversations (id, messages) VALUES (?, ?)",
                ("bench", ModelMessagesTypeAdapter.dump_json(self.messages)),
            )

    async def load(self) -> Sequence[Any]:
        (data,) = self.conn.execute(
            "SELECT messages FROM conversations WHERE id = ?", ("bench",)
        ).fetchone()
        history = ModelMessagesTypeAdapter.validate_json(data)
        return budget_history(history, budget=self.budget).messages

    async def close(self) -> None:
        self.conn.close()

    def notes(self, window: int) -> list[str]:
        return [
            f"{self.name}: the row is saved only before loads ({self.skipped} saves of turns "
            "no load reads skipped), so its write time is not the workload's"
        ]


class Contextfold(JournalSide):
    """contextfold's JournalHistory on a SQLite journal."""

    digest = staticmethod(messages_digest)

    def __init__(self, path: Path, budget: float) -> None:
        super().__init__("JournalHistory", path, budget)
        self.history = JournalHistory(self.journal, STREAM)
        self.loaders: dict[str, Loader] = {"load(budget=)": self.load}

    async def write(self, text: TurnText, *, loading: bool) -> None:
        await self.history.save(messages_of(text))

    async def load(self) -> Sequence[Any]:
        return await self.history.load(budget=self.budget)

    def first_load(self, journal: cf.Journal) -> Callable[[], Awaitable[object]]:
        return lambda: JournalHistory(journal, STREAM).load(budget=self.budget)


def baseline(directory: Path, budget: float) -> Baseline:
    return Baseline(directory / "messages.db", budget)


def contextfold(directory: Path, budget: float) -> Contextfold:
    return Contextfold(directory / "contextfold.db", budget)
