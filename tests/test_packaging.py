"""What users install: the license, the metadata, and no test tooling in any extra."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
TOOLING = {"pytest", "pytest-asyncio", "hypothesis", "mypy", "ruff", "schemathesis"}


def _name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert match, requirement
    return match.group(0).lower()


def test_the_license_file_is_the_license_the_metadata_declares() -> None:
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert 'THE SOFTWARE IS PROVIDED "AS IS"' in text


def test_no_extra_users_install_brings_test_tooling() -> None:
    extras = PROJECT["optional-dependencies"]
    for extra, requirements in extras.items():
        names = {_name(r) for r in requirements}
        assert not names & TOOLING, f"extra {extra!r} installs test tooling: {names & TOOLING}"
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    dev = {_name(r) for r in groups["dependency-groups"]["dev"]}
    assert {"pytest", "hypothesis", "mypy", "ruff"} <= dev


def test_the_metadata_has_classifiers_and_urls() -> None:
    assert "Typing :: Typed" in PROJECT["classifiers"]
    assert any(
        c.startswith("Programming Language :: Python :: 3.11") for c in PROJECT["classifiers"]
    )
    assert {"Homepage", "Source", "Issues"} <= set(PROJECT["urls"])
    assert (ROOT / "src" / "contextfold" / "py.typed").exists()
