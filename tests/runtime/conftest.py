"""Fixtures of the runtime tests: a fresh in-memory journal with a deterministic clock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from contextfold.journal import Journal, open_journal
from tests.runtime.helpers import fixed_clock


@pytest.fixture
async def journal() -> AsyncIterator[Journal]:
    async with open_journal("memory://", clock=fixed_clock()) as opened:
        yield opened
