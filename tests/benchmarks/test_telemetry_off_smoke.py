"""Smoke test of benchmarks/telemetry_off.py: a short run prints its ratio and its verdict
(no timing is asserted). It runs in a process of its own, since it sets the global tracer
provider for its last, informational, measure."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "telemetry_off.py"
RATIO = re.compile(r"^RATIO telemetry_off_overhead (\d+\.\d{3}) target <= 1\.02$")


def test_a_short_run_prints_its_ratio(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--turns", "40"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        check=False,
    )
    lines = done.stdout.splitlines()
    found = RATIO.match(lines[-1]) if lines else None
    assert found is not None, (lines, done.stderr)
    assert done.returncode == (0 if float(found.group(1)) <= 1.02 else 1)
