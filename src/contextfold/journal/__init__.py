"""The journal: the async API over a store, its input checks, and the sync facade."""

from .journal import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    Journal,
    SyncJournal,
    open_journal,
    open_journal_sync,
    store_from_url,
)

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "Journal",
    "SyncJournal",
    "open_journal",
    "open_journal_sync",
    "store_from_url",
]
