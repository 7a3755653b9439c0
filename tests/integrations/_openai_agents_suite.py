"""Runs the OpenAI Agents SDK's own tests with its ``SQLiteSession`` swapped for a
JournalSession: ``python _openai_agents_suite.py REPORT NOT_APPLICABLE PYTEST-ARGS...`` in the
SDK's unpacked source (its ``tests`` package is not ours, so this runs as a script in a
process of its own; the SDK's tests are not changed).

``from agents import SQLiteSession`` (or ``agents.memory``) hands the tests a JournalSession
whose constructor is SQLiteSession's: one SQLite journal per database file, shared by the
sessions opened on it (``":memory:"``: a memory journal of the session's own). The tests run
are those whose code or fixtures name ``SQLiteSession``, less the not-applicable ones
(NOT_APPLICABLE: JSON, a list of node id prefixes). REPORT (JSON) gets each test's outcome,
whether it built a session, the failures' reports, and the tests each prefix deselected.
"""

from __future__ import annotations

import inspect
import json
import signal
import sys
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest

_TEST_SECONDS = 60  # a test waiting on a gate SQLiteSession would open fails, not hangs


class _Run:
    """The journals the running test opened (closed after it) and what the run saw."""

    def __init__(self) -> None:
        self.current = ""
        self.built: set[str] = set()
        self.outcomes: dict[str, str] = {}
        self.errors: dict[str, str] = {}
        self.journals: list[Any] = []


_RUN = _Run()


def _suite_session() -> type[Any]:
    """The class handed out as SQLiteSession (imported here, after pytest's own setup)."""
    import contextfold as cf
    from contextfold.integrations.openai_agents import JournalSession

    shared: dict[str, cf.SyncJournal] = {}

    def journal(db_path: str | Path) -> cf.SyncJournal:
        if str(db_path) == ":memory:":
            own = cf.open_journal_sync("memory://")
            _RUN.journals.append(own)
            return own
        key = str(Path(db_path).resolve())
        if key not in shared or shared[key] not in _RUN.journals:
            shared[key] = cf.open_journal_sync(f"sqlite:///{key}")
            _RUN.journals.append(shared[key])
        return shared[key]

    class SuiteSession(JournalSession):
        def __init__(
            self,
            session_id: str,
            db_path: str | Path = ":memory:",
            sessions_table: str = "agent_sessions",
            messages_table: str = "agent_messages",
            session_settings: Any = None,
        ) -> None:
            _RUN.built.add(_RUN.current)
            super().__init__(journal(db_path), session_id, session_settings=session_settings)
            self.db_path = db_path
            self.sessions_table = sessions_table
            self.messages_table = messages_table

        def close(self) -> None:
            """The journal is closed after the test."""

    return SuiteSession


def _names_sqlite_session(item: pytest.Item) -> bool:
    """Whether the test's code, or one of its fixtures', names SQLiteSession."""
    functions: list[Callable[..., Any]] = [getattr(item, "function", None) or (lambda: None)]
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        functions += [d.func for defs in info.name2fixturedefs.values() for d in defs]
    for function in functions:
        try:
            if "SQLiteSession" in inspect.getsource(function):
                return True
        except (OSError, TypeError):
            continue
    return False


def _over_time(signum: int, frame: object) -> None:
    raise TimeoutError(f"{_RUN.current} ran over {_TEST_SECONDS}s (a test waiting forever)")


class _Plugin:
    def __init__(self, report: Path, not_applicable: list[str]) -> None:
        self.report = report
        self.not_applicable = not_applicable
        self.deselected: dict[str, list[str]] = {prefix: [] for prefix in not_applicable}

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        import agents
        import agents.memory

        suite_session = _suite_session()
        agents.SQLiteSession = suite_session  # type: ignore[misc]
        agents.memory.SQLiteSession = suite_session  # type: ignore[misc]

    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        kept: list[pytest.Item] = []
        dropped: list[pytest.Item] = []
        for item in items:
            if not _names_sqlite_session(item):
                dropped.append(item)
                continue
            prefix = next((p for p in self.not_applicable if item.nodeid.startswith(p)), None)
            if prefix is not None:
                self.deselected[prefix].append(item.nodeid)
                dropped.append(item)
            else:
                kept.append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, None, None]:
        _RUN.current = item.nodeid
        signal.signal(signal.SIGALRM, _over_time)
        signal.alarm(_TEST_SECONDS)
        try:
            yield
        finally:
            signal.alarm(0)
            for journal in _RUN.journals:
                journal.close()
            _RUN.journals.clear()
            _RUN.current = ""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = _RUN.outcomes.get(report.nodeid, "passed")
        if report.failed:
            outcome = "failed"
            _RUN.errors[report.nodeid] = str(report.longrepr)[-3000:]
        elif report.skipped and outcome != "failed":
            outcome = "skipped"
        _RUN.outcomes[report.nodeid] = outcome

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            _RUN.outcomes[report.nodeid] = "failed"
            _RUN.errors[report.nodeid] = str(report.longrepr)[-3000:]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        tests = {
            nodeid: {"outcome": outcome, "session": nodeid in _RUN.built}
            for nodeid, outcome in _RUN.outcomes.items()
        }
        report = {"tests": tests, "errors": _RUN.errors, "not_applicable": self.deselected}
        self.report.write_text(json.dumps(report, indent=1))


def main(argv: list[str]) -> int:
    report, not_applicable, *args = argv
    prefixes = json.loads(Path(not_applicable).read_text())
    return int(pytest.main(args, plugins=[_Plugin(Path(report), prefixes)]))


if __name__ == "__main__":
    here = str(Path(__file__).resolve().parent)
    sys.path[:] = [entry for entry in sys.path if str(Path(entry or ".").resolve()) != here]
    sys.exit(main(sys.argv[1:]))
