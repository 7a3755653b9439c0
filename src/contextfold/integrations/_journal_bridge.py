"""How a framework adapter reaches its journal from both sync and async framework code.

Frameworks call an adapter's sync methods from plain scripts and its async methods from
their event loop. A :class:`~contextfold.journal.SyncJournal` runs every call on its
private loop (the sync methods block on it, the async ones await it without blocking the
caller's loop); an async :class:`~contextfold.journal.Journal` runs on the caller's loop,
and its sync methods work only from another thread while that loop runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from ..errors import InvalidInputError
from ..journal import Journal, SyncJournal

__all__ = ["JournalBridge"]

T = TypeVar("T")


class JournalBridge:
    """Runs an adapter's coroutines where its journal lives. Raises InvalidInputError for
    anything but a Journal or a SyncJournal."""

    def __init__(self, journal: Journal | SyncJournal, *, what: str) -> None:
        if isinstance(journal, SyncJournal):
            self.journal = journal.journal
            self._sync: SyncJournal | None = journal
        elif isinstance(journal, Journal):
            self.journal = journal
            self._sync = None
        else:
            raise InvalidInputError(
                f"{what} takes a cf.Journal (cf.open_journal) or a cf.SyncJournal "
                f"(cf.open_journal_sync), got {type(journal).__name__}"
            )
        self.what = what
        try:  # made in async code: that loop is the journal's until an async call says otherwise
            self._home: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._home = None

    def run(self, work: Callable[[], Awaitable[T]]) -> T:
        """Run ``work()`` to completion from sync code."""
        if self._sync is not None:
            return self._sync._call(_awaited(work))  # the facade's own loop, as its methods do
        home = self._home
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if home is None or home.is_closed() or not home.is_running() or running is home:
            raise InvalidInputError(
                f"{self.what} over an async cf.Journal: call its async methods (graph.ainvoke, "
                "astream, aget_state) on the journal's event loop, or give it a cf.SyncJournal "
                "(cf.open_journal_sync) for sync calls such as graph.invoke"
            )
        return asyncio.run_coroutine_threadsafe(_awaited(work), home).result()

    async def arun(self, work: Callable[[], Awaitable[T]]) -> T:
        """Await ``work()`` from async code without blocking the caller's loop."""
        if self._sync is not None:
            loop = self._sync._runner.loop
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(_awaited(work), loop))
        self._home = asyncio.get_running_loop()
        return await work()


async def _awaited(work: Callable[[], Awaitable[T]]) -> T:
    # The coroutine is made on the loop that runs it: none is left unawaited on a refusal.
    return await work()
