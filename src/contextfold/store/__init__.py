"""Append-only journal backends: memory, SQLite (default) and PostgreSQL."""

from .base import AppendResult, ReadResult, Store, StreamInfo, TailReset
from .memory import MemoryStore
from .sqlite import SQLiteStore

__all__ = [
    "AppendResult",
    "MemoryStore",
    "ReadResult",
    "SQLiteStore",
    "Store",
    "StreamInfo",
    "TailReset",
]
