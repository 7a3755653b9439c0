"""What the sides of ``benchmarks/frameworks.py`` share, written once: a side on one SQLite
file, contextfold's side on a journal open for the run (and its cold load, timed on a journal
opened afresh), and the baselines' loads trimmed by :func:`newest_units`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from _frameworks_workload import Expanding, newest_units

import contextfold as cf

__all__ = ["FileSide", "JournalSide", "NewestUnits", "elapsed_ms"]


def elapsed_ms(began: int) -> float:
    """Milliseconds since ``began`` (a ``time.perf_counter_ns()``)."""
    return (time.perf_counter_ns() - began) / 1e6


class FileSide:
    """A side whose persistence is the one SQLite file at ``path``: no cold load measured,
    nothing to note (a side overrides what it does otherwise)."""

    def __init__(self, name: str, path: Path, budget: float) -> None:
        self.name = name
        self.path = path
        self.budget = budget

    async def cold_load(self) -> float | None:
        return None

    def files(self) -> Sequence[Path]:
        return (self.path,)

    def notes(self, window: int) -> list[str]:
        return []


class JournalSide(FileSide):
    """contextfold's side: a SQLite journal on ``path``, open for the whole run as an agent's
    process keeps it. Its cold load times, on a journal opened afresh, the call that
    :meth:`first_load` returns (what it builds before returning is not timed)."""

    def __init__(self, name: str, path: Path, budget: float) -> None:
        super().__init__(name, path, budget)
        self.journal = cf.open_journal(f"sqlite:///{path}")

    def first_load(self, journal: cf.Journal) -> Callable[[], Awaitable[object]]:
        raise NotImplementedError

    async def cold_load(self) -> float | None:
        journal = cf.open_journal(f"sqlite:///{self.path}")
        try:
            load = self.first_load(journal)
            began = time.perf_counter_ns()
            await load()
            return elapsed_ms(began)
        finally:
            await journal.close()

    async def close(self) -> None:
        await self.journal.close()


class NewestUnits:
    """A baseline's loads trimmed by :func:`newest_units`: of everything it reads, or of a
    newest-n read widened until the budget runs out inside it (:class:`Expanding`)."""

    def __init__(
        self,
        budget: float,
        *,
        size: Callable[[Any], float],
        calls: Callable[[Any], tuple[Iterable[str], Iterable[str]]],
    ) -> None:
        self.trim = functools.partial(newest_units, budget=budget, size=size, calls=calls)
        self.window = Expanding()

    async def whole(self, read: Callable[[], Awaitable[Sequence[Any]]]) -> Sequence[Any]:
        items = await read()
        start, _ = self.trim(items)
        return items[start:]

    async def windowed(self, fetch: Callable[[int], Awaitable[Sequence[Any]]]) -> list[Any]:
        return await self.window.load(fetch, self.trim)
