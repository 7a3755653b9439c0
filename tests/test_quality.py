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


def test_mypy_strict_on_the_package() -> None:
    done = _run("mypy")  # configuration in pyproject.toml: strict over src/contextfold
    assert done.returncode == 0, done.stdout + done.stderr
