"""Shared pytest fixtures.

PostgreSQL: ``pg_server`` starts one real server per session (see ``tests/pgserver.py``);
``pg_dsn`` gives each test its own fresh database. Without PostgreSQL installed these tests
are skipped locally and fail under ``CI=true``. Set ``CONTEXTFOLD_TEST_PG_DSN`` to use an
existing server instead.

A real model: ``llama_server`` starts llama.cpp's server with a small model once per session
(see ``tests/llamaserver.py``; built by ``make local-model``); tests using it are marked
``real_model``, skipped locally without the build and failed under ``CI=true``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from tests.llamaserver import LlamaServer, LlamaServerNotFoundError
from tests.pgserver import PostgresNotFoundError, TemporaryPostgres

# No test reaches a real model provider: each runs under contextfold.testing's guard.
pytest_plugins = ["contextfold.testing.plugin"]

_PG_FIXTURES = frozenset({"pg_server", "pg_dsn"})


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _unavailable(reason: str) -> NoReturn:
    if _in_ci():
        pytest.fail(f"{reason} (CI is set, so this is an error, not a skip)", pytrace=False)
    pytest.skip(reason)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests using the PostgreSQL fixtures with ``postgres`` and those using the real
    model's server with ``real_model`` (for ``-m 'not postgres'``, ``-m 'not real_model'``)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        if _PG_FIXTURES & names:
            item.add_marker(pytest.mark.postgres)
        if "llama_server" in names:
            item.add_marker(pytest.mark.real_model)


# --- pytest fixtures shared by all layers ---


@pytest.fixture(scope="session")
def pg_server() -> Iterator[TemporaryPostgres]:
    """One real PostgreSQL server for the whole session (``.dsn``, ``.admin_dsn``, ...)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _unavailable("psycopg is not installed (pip install -e '.[all]' --group dev)")
    server = TemporaryPostgres()
    missing = None
    try:
        server.start()
    except PostgresNotFoundError as exc:
        missing = str(exc)
    if missing is not None:
        _unavailable(missing)
    with server:
        yield server


@pytest.fixture(scope="session")
def llama_server() -> Iterator[LlamaServer]:
    """One llama.cpp server with SmolLM2-135M-Instruct for the whole session (``.openai_url``,
    ``.url``, ``.model``)."""
    try:
        server = LlamaServer()
    except LlamaServerNotFoundError as exc:
        _unavailable(str(exc))
    with server:
        yield server


@pytest.fixture
def pg_dsn(pg_server: TemporaryPostgres) -> Iterator[str]:
    """``postgresql://`` URL of a fresh database, dropped (WITH FORCE) after the test."""
    name = pg_server.create_database()
    try:
        yield pg_server.dsn_for(name)
    finally:
        pg_server.drop_database(name)


@pytest.fixture
def sqlite_path(tmp_path: Path) -> str:
    """Path of a not-yet-existing SQLite journal file in the test's temp dir."""
    return str(tmp_path / "journal.db")
