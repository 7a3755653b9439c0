"""Smoke test of benchmarks/openai_agents_engine.py: a short run prints every ratio in its
format and its verdict follows them (no timing is asserted: the ratio is the benchmark's
own verdict); the measures it compares the sides with are checked on small cases."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "openai_agents_engine.py"
RATIOS = {
    "openai_agents_model_overhead": re.compile(r"^RATIO \S+ (\d+\.\d{2}) target <= 1\.2$"),
    "openai_agents_pairs_split": re.compile(r"^RATIO \S+ (\d+) target == 0$"),
    "openai_agents_prompt_cache_vs_sdk": re.compile(r"^RATIO \S+ (\d+\.\d{2}|inf) target >= 1\.0$"),
    "openai_agents_originals_recoverable": re.compile(r"^RATIO \S+ (\d\.\d{2}) target == 1\.0$"),
}


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("openai_agents_engine_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_a_short_run_prints_every_ratio(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code = bench.main(["--turns", "3", "--session-turns", "14", "--compact-at", "3000"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("RATIO")]
    assert [line.split()[1] for line in lines] == list(RATIOS)
    values = {}
    for line in lines:
        found = RATIOS[line.split()[1]].match(line)
        assert found is not None, line
        values[line.split()[1]] = float(found.group(1))
    assert values["openai_agents_pairs_split"] == 0
    assert values["openai_agents_originals_recoverable"] == 1.0
    held = (
        values["openai_agents_model_overhead"] <= 1.2
        and values["openai_agents_prompt_cache_vs_sdk"] >= 1.0
    )
    assert code == (0 if held else 1)


def test_the_measures(bench: ModuleType) -> None:
    assert bench.split_pairs(["a", "b"], ["a"]) == 1
    assert bench.split_pairs(["a"], ["a", "c"]) == 1
    assert bench.split_pairs(["a", "a"], ["a", "a"]) == 0
    mean, weighted = bench.cache_share([b"abcd", b"abcdef", b"xbcdefgh"])
    assert (mean, weighted) == (pytest.approx((4 / 6 + 0 / 8) / 2), pytest.approx(4 / 14))
    originals = [{"a": 1}, {"a": 1}, {"b": 2}]
    assert bench.recoverable(originals, [{"a": 1}, {"b": 2}]) == pytest.approx(2 / 3)
    assert bench.recoverable(originals, [*originals, {"c": 3}]) == 1.0
