"""Smoke test of benchmarks/agent_turn.py: a short run prints both ratios and its verdict
(no timing is asserted), and the floor appends the turn's events in the batches the
journal's store was given."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

import contextfold as cf

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "agent_turn.py"
VS_FLOOR = re.compile(r"^RATIO agent_turn_1000_vs_floor (\d+\.\d{2}) target <= 6\.0$")
GROWTH = re.compile(r"^RATIO agent_turn_growth (-?\d+\.\d{2}) target <= 1\.5$")


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("agent_turn_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_a_short_run_prints_its_ratios(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code = asyncio.run(bench.main(60))
    lines = capsys.readouterr().out.splitlines()
    vs_floor, growth = VS_FLOOR.match(lines[-2]), GROWTH.match(lines[-1])
    assert vs_floor is not None and growth is not None, lines
    held = float(vs_floor.group(1)) <= 6.0 and float(growth.group(1)) <= 1.5
    assert code == (0 if held else 1)


async def test_the_floor_appends_in_the_agents_batches(bench: ModuleType, tmp_path: Path) -> None:
    journal = cf.open_journal(f"sqlite:///{tmp_path / 'agent.db'}")
    try:
        batches = bench.count_batches(journal)
        await journal.append(bench.STREAM, cf.system_prompt("You read files."))
        model = bench.Recording()
        agent = cf.Agent(journal, bench.STREAM, model, tools=[bench.lookup])
        await journal.append(bench.STREAM, cf.ContextAdded(role="user", content="turn 1"))
        await agent.run_until_idle()
        page = await journal.read(bench.STREAM)
        assert sum(batches) == len(page.events)
        assert len(batches) < len(page.events)  # some appends carry several events
        raw = bench.RawSQLite(tmp_path / "raw.db")
        try:
            rows = [{"n": n} for n in range(sum(batches))]
            bench.floor(model.bodies, rows, batches, raw, 1)
            assert raw.conn.execute("SELECT count(*) FROM raw_events").fetchone()[0] == len(rows)
            versions = raw.conn.execute("SELECT version FROM raw_streams").fetchall()
            assert versions == [(len(rows),)]
        finally:
            raw.close()
    finally:
        await journal.close()
