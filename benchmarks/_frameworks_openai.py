"""The OpenAI Agents SDK sides of ``benchmarks/frameworks.py``: the SDK's ``SQLiteSession``
against contextfold's ``JournalSession`` on a SQLite journal.

Each turn is one ``add_items`` of four Responses API input items (user message, function
call, its output, the assistant message). The SDK's Runner reads the whole session before
each run (``get_items()``, no limit by default), and the model is handed the newest whole
units within the budget; ``JournalSession.get_items(budget=...)`` returns that directly.
The baseline also runs the SDK's own ``get_items(limit=n)`` read, widened until the budget
is exhausted inside it (``windowed``), since that is the cheapest the SDK can do.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
from _frameworks_sides import FileSide, JournalSide, NewestUnits
from _frameworks_workload import Loader, TurnText, approx, digest
from agents import SQLiteSession

import contextfold as cf
from contextfold.integrations.openai_agents import JournalSession

__all__ = ["NAME", "Baseline", "Contextfold", "baseline", "contextfold", "items_of"]

NAME = "openai_agents"
SESSION = "bench"


def items_of(text: TurnText) -> list[dict[str, Any]]:
    """One turn as the SDK stores it."""
    return [
        {"role": "user", "content": text.user},
        {
            "type": "function_call",
            "id": f"fc_{text.turn}",
            "call_id": text.call_id,
            "name": text.tool,
            "arguments": orjson.dumps(text.arguments).decode(),
            "status": "completed",
        },
        {"type": "function_call_output", "call_id": text.call_id, "output": text.result},
        {
            "type": "message",
            "id": f"msg_{text.turn}",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": text.answer, "annotations": []}],
        },
    ]


def _size(item: dict[str, Any]) -> int:
    return approx(orjson.dumps(item))  # what JournalSession counts: ⌈JSON length / 4⌉


def _calls(item: dict[str, Any]) -> tuple[Iterable[str], Iterable[str]]:
    kind = item.get("type")
    if kind == "function_call":
        return (item["call_id"],), ()
    if kind == "function_call_output":
        return (), (item["call_id"],)
    return (), ()


def _digest(context: Sequence[Any]) -> str:
    return digest(orjson.dumps(item, option=orjson.OPT_SORT_KEYS) for item in context)


class Baseline(FileSide):
    """The SDK's SQLiteSession on a file."""

    digest = staticmethod(_digest)

    def __init__(self, path: Path, budget: float) -> None:
        super().__init__("SQLiteSession", path, budget)
        self.units = NewestUnits(budget, size=_size, calls=_calls)
        self.session = SQLiteSession(SESSION, path)
        self.loaders: dict[str, Loader] = {"get_items()": self.load, "windowed": self.windowed}

    async def write(self, text: TurnText, *, loading: bool) -> None:
        await self.session.add_items(items_of(text))  # type: ignore[arg-type]

    async def load(self) -> Sequence[Any]:
        return await self.units.whole(self.session.get_items)

    async def windowed(self) -> Sequence[Any]:
        async def fetch(n: int) -> Sequence[Any]:
            return await self.session.get_items(limit=n)

        return await self.units.windowed(fetch)

    async def close(self) -> None:
        self.session.close()


class Contextfold(JournalSide):
    """contextfold's JournalSession on a SQLite journal."""

    digest = staticmethod(_digest)

    def __init__(self, path: Path, budget: float) -> None:
        super().__init__("JournalSession", path, budget)
        self.session = JournalSession(self.journal, SESSION)
        self.loaders: dict[str, Loader] = {"get_items(budget=)": self.load}

    async def write(self, text: TurnText, *, loading: bool) -> None:
        await self.session.add_items(items_of(text))  # type: ignore[arg-type]

    async def load(self) -> Sequence[Any]:
        return await self.session.get_items(budget=self.budget)

    def first_load(self, journal: cf.Journal) -> Callable[[], Awaitable[object]]:
        return lambda: JournalSession(journal, SESSION).get_items(budget=self.budget)


def baseline(directory: Path, budget: float) -> Baseline:
    return Baseline(directory / "sdk.db", budget)


def contextfold(directory: Path, budget: float) -> Contextfold:
    return Contextfold(directory / "contextfold.db", budget)
