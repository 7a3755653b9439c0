"""What the timeline tests share: a journal clock whose steps give every request a duration."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta


def ticking_clock() -> Callable[[], datetime]:
    """A deterministic journal clock: five milliseconds further at every call."""
    now = [datetime(2026, 1, 1, tzinfo=UTC)]

    def tick() -> datetime:
        now[0] += timedelta(milliseconds=5)
        return now[0]

    return tick
