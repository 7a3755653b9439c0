"""Time and ids for deterministic tests: what ``Journal(clock=..., ids=...)`` takes."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

from ..errors import InvalidInputError
from ..journal.encode import IdFactory

__all__ = ["EPOCH", "FixedClock", "counter_ids"]

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
"""The time a :class:`FixedClock` starts at unless told otherwise."""


class FixedClock:
    """A clock that says the same time until the test moves it (``advance``).

    Pass it as ``clock=`` to :class:`~contextfold.journal.Journal` or ``open_journal``: every
    event appended meanwhile gets the same time. Raises InvalidInputError for a naive time.
    """

    def __init__(self, at: datetime = EPOCH) -> None:
        if at.tzinfo is None:
            raise InvalidInputError(f"FixedClock needs an aware datetime (tzinfo=UTC), got {at!r}")
        self.now = at

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float = 0.0, **delta: float) -> datetime:
        """Move the clock forward (``seconds``, or ``timedelta`` keywords) and return it."""
        self.now = self.now + timedelta(seconds=seconds, **delta)
        return self.now


def counter_ids(prefix: str = "ev-", start: int = 1) -> IdFactory:
    """An id factory for ``ids=``: ``ev-1``, ``ev-2``, … (a new counter per call)."""
    counter = itertools.count(start)
    return lambda: f"{prefix}{next(counter)}"
