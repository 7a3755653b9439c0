"""Fixtures for the server tests: a real uvicorn on a free loopback port, in the test's loop.

The server runs as a task of the test's own event loop, so a test can append with the
async journal, publish on a transcript bus and talk HTTP (httpx) to the same app.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest

import contextfold as cf
from contextfold.server import create_app
from tests.server.helpers import Running, Serve, running


@pytest.fixture(params=["memory", "sqlite"])
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[cf.Journal]:
    """A fresh journal, in memory and in a SQLite file."""
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'journal.db'}"
    async with cf.open_journal(url) as opened:
        yield opened


@pytest.fixture
def serve(journal: cf.Journal) -> Serve:
    """``async with serve(**create_app_options) as srv``: the journal's app, served."""

    def start(**options: Any) -> AbstractAsyncContextManager[Running]:
        return running(create_app(journal, **options))

    return start


@pytest.fixture
async def server(serve: Serve) -> AsyncIterator[Running]:
    """The journal's app with default options, served."""
    async with serve() as srv:
        yield srv
