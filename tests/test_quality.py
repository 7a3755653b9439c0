"""Lint, format and types are part of the suite: a change that breaks them fails CI."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize(
    "command",
    [
        ("ruff", "check", "src", "tests", "benchmarks"),
        ("ruff", "format", "--check", "src", "tests", "benchmarks"),
    ],
    ids=["ruff-check", "ruff-format"],
)
def test_ruff(command: tuple[str, ...]) -> None:
    done = _run(*command)
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_strict_in_one_run() -> None:
    # Configuration in pyproject.toml: strict over src/contextfold, tests/ and benchmarks/. The
    # tests are packages, so no two modules share a name and one run holds every file, each
    # nested conftest.py included.
    done = _run("mypy", "--verbose")
    assert done.returncode == 0, done.stdout + done.stderr[-5000:]
    checked = set(re.findall(r"Found source: +BuildSource\(path='([^']+)'", done.stderr))
    expected = {
        str(path.relative_to(ROOT))
        for folder in ("tests", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert any(path.endswith("/conftest.py") and path.count("/") > 1 for path in expected)
    assert expected <= checked, sorted(expected - checked)
