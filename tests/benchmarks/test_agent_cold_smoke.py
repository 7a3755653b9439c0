"""Smoke test of benchmarks/agent_cold.py: a short run, its output format (no timing is
asserted: the ratio is the benchmark's own verdict)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

import contextfold as cf

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "agent_cold.py"
RATIO = re.compile(r"^RATIO agent_cold_100k_vs_1k (\d+\.\d{2}) target <= 3\.0$")
SIZE = re.compile(r"^ +(\d+) events   first request of a restarted agent +\d+\.\d{2} ms CPU, ")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agent_cold_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_short_run_prints_its_ratio(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code = bench.main(["--small", "300", "--large", "1500", "--restarts", "1"])
    lines = capsys.readouterr().out.splitlines()
    assert [int(m.group(1)) for m in map(SIZE.match, lines) if m] == [300, 1500]
    ratio = RATIO.match(lines[-1])
    assert ratio is not None, lines[-1]
    assert code == (0 if float(ratio.group(1)) <= 3.0 else 1)


async def test_both_streams_hold_about_as_much_context(bench: ModuleType, tmp_path: Path) -> None:
    """The claim compares like with like: compaction bounds both contexts alike."""
    sizes = {}
    for n in (400, 4000):
        url = f"sqlite:///{tmp_path / f'{n}.db'}"
        await bench.build(url, n)
        async with cf.open_journal(url) as journal:
            assert await journal.version(bench.STREAM) >= n
            state = await journal.fold(cf.AgentContext, bench.STREAM)
            assert state.compacted_through > 0
            sizes[n] = len(state.history)
    assert max(sizes.values()) <= 2 * bench.COMPACT_EVERY + 1
