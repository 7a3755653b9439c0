"""What a worker knows of the streams it serves and what it did: the point of a stream a
change was heard at, and the worker's counts."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Mark", "WorkerStats"]


@dataclass(frozen=True, slots=True)
class Mark:
    """A stream as of a change: its version, and the global position of its newest event
    when known (a notification says it; a scan does not)."""

    version: int
    head: int | None = None

    def covers(self, heard: Mark) -> bool:
        """Whether ``heard`` is this point of the stream or an older one. By head when both
        know it (global positions are never reused, so a stream deleted and made again is
        never covered); else by version."""
        if heard.head is not None and self.head is not None:
            return heard.head <= self.head
        return heard.version == self.version

    def newer(self, heard: Mark) -> Mark:
        """The newer of two changes heard of: by head when both know it, else the later heard."""
        if heard.head is not None and self.head is not None and heard.head < self.head:
            return self
        return heard


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """What a worker did so far."""

    claims: int = 0
    """Leases claimed and used (a claim whose agent found nothing to do is never written)."""
    runs: int = 0
    """Streams run to the end of their work (or of their quantum)."""
    steps: int = 0
    """Agent steps: requests sent, tool calls run, compactions, halts."""
    backoffs: int = 0
    """Runs ended by a provider (or factory) error and held back."""
    lost: int = 0
    """Runs ended because another instance took the lease over."""
    store_errors: int = 0
    """Runs and scans that met a store error."""
