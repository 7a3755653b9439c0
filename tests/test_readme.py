"""The README's Python examples run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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
