"""The journal: the async API over a store, its input checks, and the sync facade.

:mod:`.journal` holds :class:`Journal`; :mod:`.encode` every argument check and the event
encoding; :mod:`.checkpoint` and :mod:`.compaction` what replaces or summarizes a fold's
state; :mod:`.sync` the blocking facade.
"""

from .compaction import CompactionResult
from .encode import DEFAULT_MAX_PAYLOAD_BYTES
from .journal import Journal, open_journal
from .sync import SyncJournal, open_journal_sync

__all__ = [
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "CompactionResult",
    "Journal",
    "SyncJournal",
    "open_journal",
    "open_journal_sync",
]
