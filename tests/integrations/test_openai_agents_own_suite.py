"""The OpenAI Agents SDK's own session tests, at the installed version (from its sdist on
PyPI), run with ``SQLiteSession`` swapped for a JournalSession: every test whose code or
fixtures name SQLiteSession, in the SDK's test files that use it, passes, less the ones listed
here as not applicable, each with its reason (see ``_openai_agents_suite.py``)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.integrations._framework_sources import source_or_skip

_RUNNER = Path(__file__).with_name("_openai_agents_suite.py")

FILES = [
    "tests/memory/test_session.py",
    "tests/memory/test_session_limit.py",
    "tests/memory/test_compaction_suffix.py",
    "tests/memory/test_compaction_model_visibility.py",
    "tests/memory/test_openai_responses_compaction_session.py",
    "tests/extensions/memory/test_encrypt_session.py",
    "tests/test_agent_runner.py",
    "tests/test_agent_runner_streamed.py",
    "tests/test_run_impl_resume_paths.py",
    "tests/test_programmatic_tool_calling.py",
    "tests/test_max_turns.py",
    "tests/test_soft_cancel.py",
    "tests/test_handoff_failure_error_function.py",
    "tests/test_native_tool_failure_history.py",
    "tests/test_tool_batch_failure_history.py",
    "tests/test_tool_failure_boundaries.py",
]

_SESSION = "tests/memory/test_session.py::test_sqlite_session_"
_SUFFIX = "tests/memory/test_compaction_suffix.py::test_"
_COMPACTION = "tests/memory/test_openai_responses_compaction_session.py::"
_ENCRYPT = "tests/extensions/memory/test_encrypt_session.py::test_encrypted_"

# Not applicable, by reason: each entry a node id prefix of the SDK's tests.
NOT_APPLICABLE: dict[str, list[str]] = {
    "reaches into SQLiteSession's connections, locks, tables or private methods (a JournalSession "
    "has none: its journal is the store)": [
        f"{_SESSION}close_closes_worker_thread_connections",
        f"{_SESSION}close_retries_quarantined_connection",
        f"{_SESSION}closes_retired_connections_before_the_next_allocation",
        f"{_SESSION}keeps_connections_of_live_worker_threads",
        f"{_SESSION}reaps_connections_from_exited_worker_threads",
        f"{_SESSION}rollback_failure_evicts_connection",
        f"{_SESSION}file_lock_is_shared_across_instances",
        f"{_SESSION}post_commit_cancellation_propagates_after_known_outcome",
        f"{_SESSION}failed_clear_session_rolls_back",
        f"{_SESSION}failed_pop_item_releases_write_lock",
        f"{_SESSION}get_items_limit_skips_corrupt_newest_rows",
        f"{_SESSION}get_items_session_settings_limit_skips_corrupt_rows",
        f"{_SESSION}pop_item_returns_none_after_dropping_only_corrupt_rows",
        f"{_SESSION}pop_item_skips_corrupt_most_recent",
        f"{_SUFFIX}suffix_transaction_rolls_back_failed_insert[sqlite]",
        f"{_SUFFIX}cancelled_suffix_transaction_settles_before_newer_append[sqlite]",
        f"{_SUFFIX}failed_encrypted_suffix_transaction_preserves_original_tokens[sqlite-",
        f"{_COMPACTION}TestOpenAIResponsesCompactionSession::test_settled_pop_failure_",
        f"{_COMPACTION}TestOpenAIResponsesCompactionSession::test_settled_clear_failure_",
        "tests/test_run_impl_resume_paths.py::test_handoff_resume_after_cancelled_compaction_",
        f"{_ENCRYPT}pop_wrong_key_preserves_row_identity",
        f"{_ENCRYPT}pop_authentication_is_atomic_with_concurrent_mutations",
    ],
    "reads SQLiteSession's agent_sessions table after add_items fails on an item that is not "
    "JSON; a JournalSession refuses that item with PayloadError (an InvalidInputError, not "
    "TypeError) before writing anything": [
        f"{_SESSION}failed_add_items_releases_write_lock",
    ],
    "SQLiteSession.close(): a JournalSession has nothing to close (its journal's owner closes "
    "the journal)": [
        f"{_SESSION}closed_rejects_empty_add_items",
    ],
    "EncryptedSession authenticates a pop inside SQLiteSession's transaction only (its private "
    "_pop_item_with_validation); any other session gets its documented plain pop": [
        f"{_ENCRYPT}pop_wrong_key_preserves_recoverable_history",
        f"{_ENCRYPT}pop_rechecks_authentication_after_expired_tail",
        f"{_ENCRYPT}pop_cancellation_waits_for_authentication_rollback",
    ],
    "a kept difference: get_items(limit=n) returns whole units (a tool call with its output, a "
    "reasoning item with the item after it), never the raw newest n items": [
        "tests/memory/test_session_limit.py::test_session_limit_drops_unmatched_history_function_",
        "tests/test_agent_runner.py::test_limited_session_replays_boundary_answer_by_value",
    ],
}

# What the run gives at the version uv.lock installs (another version only has to pass): tests
# ran and passed, those of them that built a JournalSession, and the not-applicable ones.
EXPECTED = {"0.25.0": (387, 387, 352, 42)}


def test_the_sdk_session_tests_pass_on_journal_session(tmp_path: Path) -> None:
    source = source_or_skip("openai-agents", ["tests", "pyproject.toml"])
    prefixes = [prefix for group in NOT_APPLICABLE.values() for prefix in group]
    listed = tmp_path / "not_applicable.json"
    listed.write_text(json.dumps(prefixes))
    report_path = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTEST_ADDOPTS")}
    files = [name for name in FILES if (source / name).exists()]  # another version's may differ
    pytest_args = ["-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "sdk"), *files]
    run = subprocess.run(
        [sys.executable, str(_RUNNER), str(report_path), str(listed), *pytest_args],
        cwd=source,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert report_path.exists(), run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(report_path.read_text())
    tests: dict[str, dict[str, object]] = report["tests"]
    failed = {nodeid: report["errors"].get(nodeid, "") for nodeid, t in tests.items()}
    failed = {k: v for k, v in failed.items() if tests[k]["outcome"] == "failed"}
    ran = [t for t in tests.values() if t["outcome"] != "skipped"]
    passed = [t for t in ran if t["outcome"] == "passed"]
    built = [t for t in passed if t["session"]]
    not_applicable = report["not_applicable"]
    print(
        f"openai-agents: {len(ran)} ran, {len(passed)} passed ({len(built)} on a JournalSession), "
        f"{sum(map(len, not_applicable.values()))} not applicable"
    )
    assert not failed, "\n\n".join(f"{k}\n{v}" for k, v in failed.items())
    counts = (len(ran), len(passed), len(built), sum(map(len, not_applicable.values())))
    expected = EXPECTED.get(importlib.metadata.version("openai-agents"))
    if expected is None:  # another SDK version: its tests pass, whatever they number
        assert built, counts
        return
    assert counts == expected
    assert [prefix for prefix, found in not_applicable.items() if not found] == []
