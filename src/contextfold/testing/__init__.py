"""contextfold.testing: what users' own tests of agents and backends need, shipped.

- :func:`memory_journal`, :class:`MemoryStore`, :class:`MemoryTranscriptStore`: in memory,
  nothing to set up; the journal with a :class:`FixedClock` and :func:`counter_ids`.
- :class:`FunctionModel` (a Python function as the model) and :class:`LocalModel` (a
  deterministic offline one) in place of a provider.
- :class:`StoreContract` and :class:`TranscriptStoreContract`: the suites every backend
  passes; subclass one and implement ``make_store()`` to run it on yours.
- :func:`envelope` / :func:`envelopes` for pure use of folds, :class:`RecordingStore` to
  see what a journal asked of its store, and to make its store fail or be overtaken.
- :class:`ProviderGuard` / :func:`no_real_providers`, and the pytest plugin
  ``contextfold.testing.plugin`` (``pytest_plugins = ["contextfold.testing.plugin"]``):
  a test that would reach a real model provider fails.
"""

from __future__ import annotations

from ..errors import ProviderBlockedError
from ..runtime.clients import FunctionModel
from ..runtime.local import LocalModel
from ..store.contract import StoreContract
from ..store.memory import MemoryStore
from ..transcript.store.contract import TranscriptStoreContract
from ..transcript.store.memory import MemoryTranscriptStore
from .clock import EPOCH, FixedClock, counter_ids
from .envelopes import envelope, envelopes
from .guard import ProviderGuard, no_real_providers
from .journals import memory_journal
from .recording import RecordingStore, StoreCall

__all__ = [
    "EPOCH",
    "FixedClock",
    "FunctionModel",
    "LocalModel",
    "MemoryStore",
    "MemoryTranscriptStore",
    "ProviderBlockedError",
    "ProviderGuard",
    "RecordingStore",
    "StoreCall",
    "StoreContract",
    "TranscriptStoreContract",
    "counter_ids",
    "envelope",
    "envelopes",
    "memory_journal",
    "no_real_providers",
]
