"""Smoke test of benchmarks/frameworks.py: a short run of all four frameworks (its output, its
context check and its verdict), and properties of the trimming rule it gives the baselines."""

from __future__ import annotations

import asyncio
import importlib.util
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
NAMES = ("openai_agents", "langgraph", "pydantic_ai", "adk")
LOAD = re.compile(r"^RATIO frameworks_(\w+?)_context_load (\d+\.\d) target >= 10$")
STORAGE = re.compile(r"^RATIO frameworks_langgraph_storage (\d+\.\d{4}) target <= 0\.01$")
HANDED = re.compile(
    r"^  the model is handed (\d+) messages at turn (\d+) \(budget 3,000 tokens\); the same on "
    r"both sides at every measured turn \((\d+) loads compared\)$"
)
TURNS, WINDOW = 24, 4


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    # The script imports its helpers by bare name, as `python benchmarks/frameworks.py` does.
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield _load("frameworks_bench", BENCHMARKS / "frameworks.py")
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.fixture(scope="module")
def workload(bench: ModuleType) -> ModuleType:
    return sys.modules["_frameworks_workload"]


def test_short_run_prints_every_ratio_from_the_same_context(
    bench: ModuleType, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    size = ["--turns", str(TURNS), "--window", str(WINDOW), "--sample", "12", "--budget", "3000"]
    code = bench.main([*size, "--dir", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()

    loads = {m.group(1): float(m.group(2)) for m in map(LOAD.match, lines) if m is not None}
    assert sorted(loads) == sorted(NAMES)
    assert all(ratio > 0 for ratio in loads.values())
    storage = [float(m.group(1)) for m in map(STORAGE.match, lines) if m is not None]
    assert len(storage) == 1 and 0 < storage[0] < 1  # smaller than SqliteSaver's even here
    handed = [m for m in map(HANDED.match, lines) if m is not None]
    assert len(handed) == len(NAMES)
    for match in handed:
        kept, turn, compared = (int(g) for g in match.groups())
        assert turn == TURNS
        assert 0 < kept < 4 * TURNS  # the budget trimmed: the check compared real trims
        assert compared >= 2 * WINDOW
    met = all(r >= 10 for r in loads.values()) and storage[0] <= 0.01
    assert code == (0 if met else 1)
    assert list(tmp_path.iterdir()) == []  # every framework's files are deleted after it


def test_a_side_handing_the_model_less_is_refused(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    openai = sys.modules["_frameworks_openai"]

    class Less(openai.Contextfold):  # type: ignore[name-defined,misc]
        async def load(self) -> Sequence[Any]:
            context: Sequence[Any] = await super().load()
            return context[1:] if len(context) > 8 else context

    def short(directory: Path, budget: float) -> Any:
        side = Less(directory / "contextfold.db", budget)
        side.loaders = {"get_items(budget=)": side.load}
        return side

    fake = ModuleType("fake_openai")
    fake.baseline = openai.baseline  # type: ignore[attr-defined]
    fake.contextfold = short  # type: ignore[attr-defined]
    monkeypatch.setitem(bench.FRAMEWORKS, "openai_agents", fake)
    with pytest.raises(bench.ContextMismatch, match=r"openai_agents: at turn \d+ JournalSession"):
        asyncio.run(
            bench.measure_framework(
                "openai_agents", turns=10, window=3, sample=5, budget=3000, directory=tmp_path
            )
        )


# -- the trimming rule ----------------------------------------------------------------------

Item = tuple[int, tuple[str, ...], tuple[str, ...]]  # size, calls made, calls answered


@st.composite
def conversations(draw: st.DrawFn) -> list[Item]:
    """Plain items and tool calls, each answered later (maybe after other items) or never."""
    items: list[Item] = []
    open_calls: list[str] = []
    for index in range(draw(st.integers(0, 40))):
        size = draw(st.integers(0, 30))
        kind = draw(st.sampled_from(("plain", "call", "answer")))
        if kind == "call":
            open_calls.append(f"c{index}")
            items.append((size, (f"c{index}",), ()))
        elif kind == "answer" and open_calls:
            call = open_calls.pop(draw(st.integers(0, len(open_calls) - 1)))
            items.append((size, (), (call,)))
        else:
            items.append((size, (), ()))
    return items


def _size(item: Item) -> int:
    return item[0]


def _calls(item: Item) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return item[1], item[2]


def _brute_force(items: Sequence[Item], budget: int) -> int:
    """The earliest start whose items fit and answer only calls they hold."""
    for start in range(len(items) + 1):
        kept = items[start:]
        made = {call for item in kept for call in item[1]}
        answered = {call for item in kept for call in item[2]}
        if sum(i[0] for i in kept) <= budget and answered <= made:
            return start
    raise AssertionError("the empty suffix always qualifies")


@settings(max_examples=300, deadline=None)
@given(items=conversations(), budget=st.integers(0, 400))
def test_newest_units_keeps_the_most_whole_units_that_fit(
    workload: ModuleType, items: list[Item], budget: int
) -> None:
    start, exhausted = workload.newest_units(items, budget=budget, size=_size, calls=_calls)
    assert start == _brute_force(items, budget)
    assert exhausted == (sum(i[0] for i in items) > budget)


@settings(max_examples=200, deadline=None)
@given(items=conversations(), budget=st.integers(0, 400), first=st.integers(1, 8))
def test_a_widening_newest_n_read_trims_like_the_whole_history(
    workload: ModuleType, items: list[Item], budget: int, first: int
) -> None:
    """Read as each item arrives: newest-n windows (starting with answers whose calls they
    cut off) give the whole history's trim every time."""
    window = workload.Expanding(first)

    def trim(seen: Sequence[Item]) -> tuple[int, bool]:
        start: int
        exhausted: bool
        start, exhausted = workload.newest_units(seen, budget=budget, size=_size, calls=_calls)
        return start, exhausted

    for end in range(1, len(items) + 1):
        history = items[:end]

        async def fetch(n: int, history: list[Item] = history) -> Sequence[Item]:
            return history[-n:]

        got = asyncio.run(window.load(fetch, trim))
        assert got == history[_brute_force(history, budget) :]


def test_turns_are_deterministic_with_results_of_the_stated_size(workload: ModuleType) -> None:
    first, again, other = workload.turn_text(7), workload.turn_text(7), workload.turn_text(8)
    assert first == again
    assert first.result != other.result and first.call_id != other.call_id
    assert {len(workload.turn_text(t).result) for t in (1, 99, 2000)} == {2000}


def test_digest_tells_apart_how_bytes_split_into_messages(workload: ModuleType) -> None:
    assert workload.digest([b"ab", b"c"]) != workload.digest([b"a", b"bc"])
    assert workload.digest([b"ab", b"c"]) == workload.digest(iter([b"ab", b"c"]))


def test_file_bytes_counts_the_sqlite_companions(workload: ModuleType, tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    db.write_bytes(b"a" * 10)
    (tmp_path / "x.db-wal").write_bytes(b"b" * 5)
    (tmp_path / "other.db").write_bytes(b"c" * 100)
    assert workload.file_bytes([db]) == 15
    assert workload.file_bytes([tmp_path / "missing.db"]) == 0
