"""Smoke test of benchmarks/prompt_cache.py: a short run, its output format and its verdict."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "prompt_cache.py"
RATIO_SHARE = re.compile(r"^RATIO prompt_cache_prefix_share (\d\.\d{3}) target >= 0\.95$")
RATIO_VS = re.compile(r"^RATIO prompt_cache_vs_baseline (\d+\.\d{2}) target >= 1\.0$")
SERIES = re.compile(
    r"^  (contextfold|baseline) +mean share (\d\.\d{4}) .* over (\d+) requests, (\d+) skipped"
)
SHORT_RUN_FLOOR = 0.88  # contextfold's mean prefix share on the short run, per transport
RUN = re.compile(
    r"^\[(anthropic|openai-chat)\] (\d+) requests, (\d+) compactions, .* byte-identical$"
)


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("prompt_cache_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_short_run_prints_ratios_and_beats_the_baseline(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code = bench.main(["--turns", "60", "--compact-every", "25"])
    lines = capsys.readouterr().out.splitlines()

    share_line, vs_line = lines[-2:]
    share = RATIO_SHARE.match(share_line)
    vs_baseline = RATIO_VS.match(vs_line)
    assert share is not None, share_line
    assert vs_baseline is not None, vs_line
    # The seeded 60-turn run measures 0.900 (worst transport) against the baseline's ~0.58;
    # the 0.95 target is for long sessions, so this run's exit status is 1 (not met).
    assert float(share.group(1)) >= SHORT_RUN_FLOOR
    assert float(vs_baseline.group(1)) >= 1.4
    assert code == (0 if float(share.group(1)) >= 0.95 else 1)

    runs = [RUN.match(line) for line in lines]
    runs_found = [m for m in runs if m is not None]
    assert [m.group(1) for m in runs_found] == ["anthropic", "openai-chat"]
    series = [m for m in (SERIES.match(line) for line in lines) if m is not None]
    assert len(series) == 4
    for index, run in enumerate(runs_found):
        requests, compactions = int(run.group(2)), int(run.group(3))
        assert requests == 60
        assert compactions == 2
        ours, baseline = series[2 * index], series[2 * index + 1]
        assert (ours.group(1), baseline.group(1)) == ("contextfold", "baseline")
        for match in (ours, baseline):
            # The first request and the first after each compaction are not measured.
            assert int(match.group(4)) == 1 + compactions
            assert int(match.group(3)) == requests - 1 - compactions
        assert float(ours.group(2)) >= SHORT_RUN_FLOOR
        assert float(ours.group(2)) > float(baseline.group(2)) + 0.2


def test_contextfold_only_loses_what_is_new(bench: ModuleType) -> None:
    """On a transport without moving cache markers, each contextfold request reuses all of the
    previous body but its tail; the baseline rewrites published content in place."""
    (run,) = asyncio.run(bench.measure("memory://", turns=40, seed=3, transports=("openai-chat",)))
    tail = max(run.contextfold.lost_previous)
    assert tail < 200  # the "Current time: …" message and the closing of the body
    assert max(run.baseline.lost_previous) > 10 * tail
    assert run.contextfold.share > run.baseline.share
    assert run.rebuild_ok


def test_common_prefix_len(bench: ModuleType) -> None:
    assert bench.common_prefix_len(b"", b"abc") == 0
    assert bench.common_prefix_len(b"abc", b"abc") == 3
    assert bench.common_prefix_len(b"abcd", b"abc") == 3
    assert bench.common_prefix_len(b"abxd", b"abyd") == 2
    assert bench.common_prefix_len(b"x" * 1000 + b"a", b"x" * 1000 + b"b") == 1000
