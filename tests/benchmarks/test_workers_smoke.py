"""Smoke test of benchmarks/workers.py: a tiny run on the suite's PostgreSQL prints every
part's report and the five RATIO lines with their targets, and exits 0 exactly when every
target held (no timing is asserted)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "workers.py"
RATIO = re.compile(r"^RATIO (workers_[a-z0-9_]+) (-?\d+\.\d{2}) target (>=|<=) (\d+(?:\.\d+)?)$")
NAMES = {
    "workers_1_vs_ideal",
    "workers_2_vs_1",
    "workers_trigger_to_request_p99_ms",
    "workers_idle_stream_kb",
    "workers_leased_vs_unleased",
}


def test_a_tiny_run_prints_every_ratio(pg_dsn: str) -> None:
    tiny = ["--streams", "4", "--think", "0.5", "--ramp", "0.5", "--warm", "1", "--measure", "3"]
    tiny += ["--idle-streams", "4", "--instant-streams", "4", "--repeats", "1"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *tiny],
        env={**os.environ, "CONTEXTFOLD_BENCH_PG_DSN": pg_dsn},
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stdout.splitlines()
    for part in ("== one:", "== two:", "== idle streams:", "== instant model"):
        assert any(line.startswith(part) for line in lines), (part, done.stdout, done.stderr)
    ratios = [m for m in map(RATIO.match, lines) if m is not None]
    assert {m.group(1) for m in ratios} == NAMES, done.stdout
    held = all(
        float(m.group(2)) >= float(m.group(4))
        if m.group(3) == ">="
        else float(m.group(2)) <= float(m.group(4))
        for m in ratios
    )
    assert done.returncode == (0 if held else 1), done.stderr
