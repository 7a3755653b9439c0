"""The documentation site's pages cannot drift from the code: every Python example of every
page runs as written, the tutorial's commands work on what its example wrote, every page
is in the navigation, and the generated reference pages cover every command, route, event
type and public name. (``make docs`` builds the site strictly; CI runs it.)"""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import typer.main
from typer.testing import CliRunner

import contextfold
from contextfold.cli import URL_ENV, app
from contextfold.server.body import DEFAULT_MAX_BODY_BYTES
from contextfold.server.openapi import openapi_schema

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
GENERATED = {"reference/cli.md", "reference/http.md", "reference/event-types.md"}
"""The pages the build generates (docs/_hooks/reference.py), in the navigation, not on disk."""


def _pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.relative_to(DOCS).parts)


def _blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS / "_hooks/reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # As MkDocs loads a hook: with its folder on sys.path, for the modules beside it.
    sys.path.insert(0, str(DOCS / "_hooks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(DOCS / "_hooks"))
    return module


def _nav_pages() -> list[str]:
    """The pages mkdocs.yml's navigation lists (``- Title: page.md`` or ``- page.md``)."""
    text = (ROOT / "mkdocs.yml").read_text().split("\nnav:\n", 1)[1]
    return re.findall(r"^\s+- (?:[^:\n]+: )?(\S+\.md)$", text, flags=re.M)


def test_every_page_is_in_the_navigation_once() -> None:
    nav = _nav_pages()
    assert len(nav) == len(set(nav)), "a page is in the navigation twice"
    on_disk = {str(p.relative_to(DOCS)) for p in _pages()}
    assert set(nav) == on_disk | GENERATED


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(DOCS)))
def test_the_pages_examples_run(page: Path, tmp_path: Path) -> None:
    """Each python block runs as a script, in order, in one folder per page (a block may
    read what the one before it wrote, as a reader following the page would)."""
    for index, block in enumerate(_blocks(page, "python")):
        script = tmp_path / f"example_{index}.py"
        script.write_text(block)
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{page.name} example {index} failed:\n{done.stderr}"
        if "print(" in block:
            assert done.stdout.strip(), f"{page.name} example {index} printed nothing"


def test_the_tutorials_commands_work_on_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tutorial = DOCS / "tutorial.md"
    first = _blocks(tutorial, "python")[0]
    (tmp_path / "first_agent.py").write_text(first)
    done = subprocess.run(
        [sys.executable, "first_agent.py"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(URL_ENV, raising=False)
    lines = [line for block in _blocks(tutorial, "bash") for line in block.splitlines()]
    commands = [shlex.split(line)[1:] for line in lines if line.startswith("contextfold ")]
    checked = [args for args in commands if args[0] in ("verify", "rebuild")]
    assert checked, "the tutorial runs no verify or rebuild"
    for args in checked:
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, (args, result.stdout, result.stderr)


def test_the_cli_reference_has_every_command() -> None:
    page = _hook().cli_page()
    root = typer.main.get_command(app)
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        assert f"## `contextfold {name}`" in page
        for sub in getattr(command, "commands", {}):
            assert f"## `contextfold {name} {sub}`" in page
    assert "`--url <str>`" in page


def test_the_http_reference_has_every_route_and_schema() -> None:
    hook = _hook()
    page = hook.http_page()
    assert ":func:`" not in hook.plain_roles(page)  # the descriptions' roles as code spans
    doc = openapi_schema(max_body_bytes=DEFAULT_MAX_BODY_BYTES, authenticated=True, namespaced=True)
    for path, item in doc["paths"].items():
        for method in item:
            assert f"### `{method.upper()} {path}`" in page
    for name in doc["components"]["schemas"]:
        assert f"{{#schema-{name.lower()}}}" in page
    # every schema a route or field links to is on the page
    for anchor in re.findall(r"\(#(schema-[a-z0-9]+)\)", page):
        assert f"{{#{anchor}}}" in page


def test_the_event_types_reference_has_every_type_contextfold_writes() -> None:
    hook = _hook()
    page = hook.event_types_page()
    from contextfold.events import registered_types

    ours = [
        name
        for name, cls in registered_types().items()
        if cls.__module__.startswith("contextfold.")
        and not cls.__module__.startswith("contextfold.examples")
    ]
    assert len(ours) > 40
    for name in ours:
        assert f"### `{name}`" in page
    assert "contextfold.agent/context-added" in ours


def test_every_public_name_has_a_reference_entry() -> None:
    assert _hook().missing_api_names(DOCS / "reference" / "python") == []
    assert contextfold.__all__


@pytest.mark.parametrize(
    "command", [("check",), ("format", "--check")], ids=["ruff-check", "ruff-format"]
)
def test_the_build_hooks_pass_ruff(command: tuple[str, ...]) -> None:
    # mypy checks docs/_hooks with the package (pyproject.toml); ruff is run here.
    done = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "docs/_hooks"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
