"""The README's Python examples run as written, and so do its CLI paging lines."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contextfold.cli import URL_ENV, app

ROOT = Path(__file__).resolve().parent.parent


def _python_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_readme_has_a_quickstart() -> None:
    blocks = _python_blocks()
    assert blocks, "README.md has no python example"
    assert 10 <= len(blocks[0].splitlines()) <= 40


def test_readme_examples_run(tmp_path: Path) -> None:
    for index, block in enumerate(_python_blocks()):
        script = tmp_path / f"example_{index}.py"
        script.write_text(block)
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"README example {index} failed:\n{done.stderr}"
        if "print(" in block:
            assert done.stdout.strip(), f"README example {index} printed nothing"


def _cli_lines() -> list[list[str]]:
    """The README's command lines of the CLI (comments cut off), split into arguments."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    prefix = ".venv/bin/contextfold "
    lines = [line for block in blocks for line in block.splitlines() if line.startswith(prefix)]
    return [shlex.split(line.split("#", 1)[0])[1:] for line in lines]


def test_the_readmes_event_pages_work_after_a_second_demo(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each demo deletes its stream and writes it again, with new cursors: the README's
    paging lines, run in order, take the cursor (``C``) the page before printed."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    env = {URL_ENV: f"sqlite:///{tmp_path / 'journal.db'}"}
    for _ in range(2):
        assert runner.invoke(app, ["demo"], env=env).exit_code == 0
    paging = [args for args in _cli_lines() if args[0] == "events" and "--limit" in args]
    assert [args for args in paging if "--after" in args], "the README shows no next page"
    cursor, seen = "", list[int]()
    for args in paging:
        run = [cursor if arg == "C" else arg for arg in args]
        done = runner.invoke(app, run, env=env)
        assert done.exit_code == 0, (args, done.stderr)
        seen += [json.loads(line)["position"] for line in done.stdout.splitlines()]
        cursor = done.stderr.split("continue with --after ")[-1].strip()
    # Page after page from the stream's start (each --limit 20 page of a longer stream full).
    assert seen == list(range(1, 20 * len(paging) + 1))
