"""A journal for tests: in memory, with a fixed clock and counted ids."""

from __future__ import annotations

from ..folds.reader import FoldCache
from ..journal.encode import Clock, IdFactory
from ..journal.journal import Journal
from ..store.base import Store
from ..store.memory import MemoryStore
from .clock import FixedClock, counter_ids

__all__ = ["memory_journal"]


def memory_journal(
    store: Store | None = None,
    *,
    namespace: str = "default",
    clock: Clock | None = None,
    ids: IdFactory | None = None,
    fold_cache: FoldCache | None = None,
) -> Journal:
    """A journal on ``store`` (a fresh memory store by default) whose events all get the
    time of a :class:`FixedClock` and the ids ``ev-1``, ``ev-2``, … unless told otherwise:
    two runs of a test write the same events, byte for byte."""
    return Journal(
        store if store is not None else MemoryStore(),
        namespace=namespace,
        clock=clock if clock is not None else FixedClock(),
        ids=ids if ids is not None else counter_ids(),
        fold_cache=fold_cache,
    )
