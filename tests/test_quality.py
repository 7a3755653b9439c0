"""Lint, format and types are part of the suite: a change that breaks them fails CI."""

from __future__ import annotations

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


def test_mypy_strict_on_the_package_and_tests() -> None:
    # Configuration in pyproject.toml: strict over src/contextfold and tests/. One run cannot
    # hold two modules named conftest, so the plain run leaves out the nested conftest.py
    # files and each gets a run of its own (same configuration).
    nested = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("tests/*/**/conftest.py"))
    assert nested, "no nested conftest.py found: is the glob still right?"
    for files in [(), *[(conftest,) for conftest in nested]]:
        done = _run("mypy", *files)
        assert done.returncode == 0, done.stdout + done.stderr
