"""Fixtures of the runtime tests: a fresh in-memory journal with a deterministic clock, and
a fresh transcript store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from contextfold.journal import Journal, open_journal
from contextfold.transcript import open_transcript_store
from contextfold.transcript.store.base import TranscriptStore
from tests.runtime.helpers import fixed_clock


@pytest.fixture
async def journal() -> AsyncIterator[Journal]:
    async with open_journal("memory://", clock=fixed_clock()) as opened:
        yield opened


@pytest.fixture
async def store() -> AsyncIterator[TranscriptStore]:
    """A transcript store in an in-memory SQLite database, closed after the test."""
    opened = open_transcript_store("sqlite:///:memory:")
    await opened.open()
    yield opened
    await opened.close()
