"""Transcript store backends: memory, SQLite (default) and PostgreSQL, and their contract.

``PostgresTranscriptStore`` lives in :mod:`.postgres` (it needs the ``postgres`` extra);
:mod:`.contract` holds the test suite every backend passes.
"""

from .base import CleanupResult, MessagePage, SessionInfo, TranscriptStore
from .factory import open_transcript_store
from .memory import MemoryTranscriptStore
from .sqlite import SQLiteTranscriptStore

__all__ = [
    "CleanupResult",
    "MemoryTranscriptStore",
    "MessagePage",
    "SQLiteTranscriptStore",
    "SessionInfo",
    "TranscriptStore",
    "open_transcript_store",
]
