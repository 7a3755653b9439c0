"""LangGraph's own checkpointer conformance suite (langgraph-checkpoint-conformance), run
against JournalSaver on every journal backend: every capability is detected, every case
passes."""

from __future__ import annotations

import importlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import ALL_CAPABILITIES

import contextfold as cf
from contextfold.integrations.langgraph import JournalSaver

_SPEC = {
    "put": "test_put",
    "put_writes": "test_put_writes",
    "get_tuple": "test_get_tuple",
    "list": "test_list",
    "delete_thread": "test_delete_thread",
    "delete_for_runs": "test_delete_for_runs",
    "copy_thread": "test_copy_thread",
    "prune": "test_prune",
}


def _cases_in_spec(capability: str) -> int:
    """How many cases the installed suite has for a capability (read from the suite)."""
    module = importlib.import_module(f"langgraph.checkpoint.conformance.spec.{_SPEC[capability]}")
    (cases,) = [v for k, v in vars(module).items() if k.startswith("ALL_") and k.endswith("_TESTS")]
    return len(cases)


Savers = Callable[[str], JournalSaver]


@pytest.fixture(params=["memory", "sqlite-file", "sqlite-file-sync", "postgres"])
async def savers(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Savers]:
    """A saver per namespace of one journal of the backend (``sqlite-file-sync``: over a
    SyncJournal, whose private loop the async methods await)."""
    if request.param == "sqlite-file-sync":
        with cf.open_journal_sync(f"sqlite:///{tmp_path / 'sync.db'}") as sync:
            yield lambda namespace: JournalSaver(sync.with_namespace(namespace))
        return
    url = {
        "memory": "memory://",
        "sqlite-file": f"sqlite:///{tmp_path / 'conformance.db'}",
    }.get(request.param) or request.getfixturevalue("pg_dsn")
    async with cf.open_journal(url) as journal:
        yield lambda namespace: JournalSaver(journal.with_namespace(namespace))


async def test_journal_saver_passes_the_langgraph_conformance_suite(
    savers: Savers, request: pytest.FixtureRequest
) -> None:
    suites = iter(range(1000))

    async def factory() -> AsyncGenerator[BaseCheckpointSaver[str], None]:
        yield savers(f"conformance-{next(suites)}")  # a fresh namespace per capability

    registered = checkpointer_test(name=f"JournalSaver[{request.node.callspec.id}]")(factory)
    report = await validate(registered)

    results = report.results
    assert {name for name, r in results.items() if r.detected} == {
        c.value for c in ALL_CAPABILITIES
    }
    ran = sum(r.tests_passed + r.tests_failed for r in results.values())
    passed = sum(r.tests_passed for r in results.values())
    failures = [f for r in results.values() for f in r.failures]
    print(
        f"{registered.name}: {ran} conformance cases ran, {passed} passed, {len(failures)} failed"
    )
    assert failures == []
    assert ran == passed == sum(_cases_in_spec(c) for c in _SPEC)
    assert report.conformance_level() == "FULL"
