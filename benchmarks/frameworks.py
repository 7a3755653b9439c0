"""Benchmark: the frameworks' own SQLite persistence against contextfold's integrations, in one run.

The workload, for each of the OpenAI Agents SDK, LangGraph, pydantic-ai and Google ADK:
``--turns`` turns (2,000) of a user message, a tool call, a 2,000-character tool result and
an answer, written through the framework's persistence API (no model is called); after a
turn, the context of the next turn is loaded, trimmed to 30,000 tokens without splitting a
tool call from its result. Each framework runs on its own default SQLite persistence (the
baseline) and on contextfold's integration on a SQLite journal:

  openai_agents  SQLiteSession                       JournalSession.get_items(budget=)
  langgraph      SqliteSaver                         JournalSaver (get_tuple, then budget_messages)
  pydantic_ai    all_messages() JSON in SQLite       JournalHistory.load(budget=)
  adk            SqliteSessionService                JournalSessionService (newest events)

Both sides of a framework load at the same turns: every ``--sample`` turns (the growth
curve), then a warm-up at turn N-50 and the measured turns N-49..N (``--window``). Loads at
the other turns are skipped on both sides: the baselines keep nothing between loads, and
contextfold's warm-up leaves it exactly as warm as loading every turn would. (The pydantic-ai
baseline, whose every save replaces its one row, likewise saves only before loads.) The
contextfold sides keep one journal open for the run, as an agent's process does; each also
reports one cold load, from a journal opened afresh at turn N. A load is timed
from the call to the trimmed context in hand; what each side hands the model is then
fingerprinted (SHA-256 of the messages), and a run whose sides differ at any measured turn
raises ContextMismatch: speed never comes from doing less. Where a framework also offers a
newest-n read (the SDK's ``get_items(limit=)``, ADK's ``num_recent_events``), the baseline
runs it as well, widened until the budget runs out inside it, and the run reports it.

Claims, measured in this one run:
  frameworks_<name>_context_load   median baseline load / median contextfold load, >= 10
  frameworks_langgraph_storage     contextfold's bytes / SqliteSaver's bytes at N turns, <= 0.01

SqliteSaver stores the whole message list in every checkpoint, so its file grows with the
square of the turns (about 6 GB at 2,000); the SQLite files live in a temporary directory
(``--dir``), one framework at a time, deleted after it. Exit status 1 when a target is missed.

Run: .venv/bin/python benchmarks/frameworks.py [--turns 2000] [--frameworks adk,langgraph]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import _frameworks_adk
import _frameworks_langgraph
import _frameworks_openai
import _frameworks_pydantic_ai
from _frameworks_workload import BUDGET, Side, file_bytes, turn_text

__all__ = ["FRAMEWORKS", "ContextMismatch", "FrameworkRun", "SideRun", "main", "measure"]

FRAMEWORKS: dict[str, ModuleType] = {
    module.NAME: module
    for module in (
        _frameworks_openai,
        _frameworks_langgraph,
        _frameworks_pydantic_ai,
        _frameworks_adk,
    )
}
PACKAGES = {
    "openai_agents": "openai-agents",
    "langgraph": "langgraph-checkpoint-sqlite",
    "pydantic_ai": "pydantic-ai-slim",
    "adk": "google-adk",
}
TURNS = 2_000
WINDOW = 50
SAMPLE = 250
TARGET_LOAD = 10.0
TARGET_STORAGE = 0.01


class ContextMismatch(RuntimeError):
    """The two sides of a framework handed the model different context at a measured turn."""


@dataclass
class SideRun:
    """What one side did: per loader, the measured loads (ms) and digests by turn."""

    name: str
    loads: dict[str, dict[int, float]] = field(default_factory=dict)
    curve: dict[str, dict[int, float]] = field(default_factory=dict)
    digests: dict[str, dict[int, str]] = field(default_factory=dict)
    kept: dict[int, int] = field(default_factory=dict)
    """Messages handed to the model, by measured turn (first loader)."""
    write_seconds: float = 0.0
    bytes: int = 0
    cold_ms: float | None = None
    notes: list[str] = field(default_factory=list)

    def median(self, loader: str | None = None) -> float:
        return statistics.median(self.loads[loader or next(iter(self.loads))].values())

    def p90(self, loader: str) -> float:
        values = sorted(self.loads[loader].values())
        return values[min(len(values) - 1, (9 * len(values)) // 10)]


@dataclass(frozen=True)
class FrameworkRun:
    name: str
    turns: int
    budget: float
    baseline: SideRun
    contextfold: SideRun

    @property
    def load_ratio(self) -> float:
        return self.baseline.median() / self.contextfold.median()

    @property
    def storage_ratio(self) -> float:
        return self.contextfold.bytes / self.baseline.bytes


async def run_side(
    make: Callable[[Path, float], Side],
    directory: Path,
    *,
    turns: int,
    window: int,
    sample: int,
    budget: float = BUDGET,
) -> SideRun:
    """Write ``turns`` turns through one side, loading at the sampled and measured turns."""
    measured = range(turns - window + 1, turns + 1)
    load_at = {*measured, measured.start - 1, *range(sample, turns + 1, sample)}
    side = make(directory, budget)
    run = SideRun(side.name)
    for name in side.loaders:
        run.loads[name], run.curve[name], run.digests[name] = {}, {}, {}
    try:
        for turn in range(1, turns + 1):
            text = turn_text(turn)
            began = time.perf_counter_ns()
            await side.write(text, loading=turn in load_at)
            run.write_seconds += (time.perf_counter_ns() - began) / 1e9
            if turn not in load_at:
                continue
            for name, load in side.loaders.items():
                began = time.perf_counter_ns()
                context = await load()
                ms = (time.perf_counter_ns() - began) / 1e6
                if turn % sample == 0:
                    run.curve[name][turn] = ms
                if turn in measured:
                    run.loads[name][turn] = ms
                    run.digests[name][turn] = side.digest(context)
                    run.kept.setdefault(turn, len(context))
        run.cold_ms = await side.cold_load()
        run.notes = side.notes(window)
    finally:
        await side.close()
    run.bytes = file_bytes(side.files())
    return run


def check_same_context(framework: str, baseline: SideRun, contextfold: SideRun) -> int:
    """Raise ContextMismatch unless every loader of both sides handed the model the same
    messages at every measured turn; returns how many loads were compared."""
    loads = [
        (run.name, name, digests)
        for run in (baseline, contextfold)
        for name, digests in run.digests.items()
    ]
    reference_side, reference_loader, reference = loads[0]
    for side, loader, digests in loads[1:]:
        for turn, expected in reference.items():
            if digests.get(turn) != expected:
                raise ContextMismatch(
                    f"{framework}: at turn {turn} {side} ({loader}) handed the model "
                    f"{str(digests.get(turn))[:12]}, {reference_side} ({reference_loader}) "
                    f"{expected[:12]}: the sides did not load the same context"
                )
    return sum(len(digests) for _, _, digests in loads)


async def measure_framework(
    name: str,
    *,
    turns: int,
    window: int,
    sample: int,
    budget: float = BUDGET,
    directory: Path | None = None,
) -> FrameworkRun:
    """Both sides of one framework, each in its own directory (deleted after it)."""
    module = FRAMEWORKS[name]
    runs = []
    for make in (module.baseline, module.contextfold):
        with tempfile.TemporaryDirectory(prefix=f"frameworks-{name}-", dir=directory) as tmp:
            runs.append(
                await run_side(
                    make, Path(tmp), turns=turns, window=window, sample=sample, budget=budget
                )
            )
    baseline, contextfold = runs
    check_same_context(name, baseline, contextfold)
    return FrameworkRun(name, turns, budget, baseline, contextfold)


async def measure(
    names: Sequence[str],
    *,
    turns: int,
    window: int,
    sample: int,
    budget: float = BUDGET,
    directory: Path | None = None,
    report: Callable[[FrameworkRun], None] | None = None,
) -> list[FrameworkRun]:
    """Every named framework, one after the other (``report`` is called after each)."""
    done = []
    for name in names:
        run = await measure_framework(
            name, turns=turns, window=window, sample=sample, budget=budget, directory=directory
        )
        if report is not None:
            report(run)
        done.append(run)
    return done


def _mb(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


def print_run(run: FrameworkRun) -> None:
    """The absolute numbers of one framework, then its RATIO lines."""
    last = run.turns
    first = min(run.contextfold.loads[next(iter(run.contextfold.loads))])
    version = importlib.metadata.version(PACKAGES[run.name])
    print(
        f"\n[{run.name}] {PACKAGES[run.name]} {version}; {run.turns} turns ({4 * run.turns} "
        f"messages); loads at turns {first}-{last}: median (p90)"
    )
    for side in (run.baseline, run.contextfold):
        for index, loader in enumerate(side.loads):
            head = f"  {side.name:<30}" if index == 0 else " " * 32
            extra = ""
            if index == 0:
                extra = f"   writes {side.write_seconds:,.1f} s   storage {_mb(side.bytes)}"
                if side.cold_ms is not None:
                    extra += f"   cold load {side.cold_ms:,.1f} ms"
            print(
                f"{head}{loader:<30} {side.median(loader):9.3f} ms ({side.p90(loader):.3f}){extra}"
            )
    kept = run.contextfold.kept[last]
    loads = sum(len(d) for r in (run.baseline, run.contextfold) for d in r.digests.values())
    print(
        f"  the model is handed {kept} messages at turn {last} (budget {run.budget:,.0f} tokens); "
        f"the same on both sides at every measured turn ({loads} loads compared)"
    )
    curve = []
    for turn in sorted(run.baseline.curve[next(iter(run.baseline.curve))]):
        ours = run.contextfold.curve[next(iter(run.contextfold.curve))][turn]
        theirs = run.baseline.curve[next(iter(run.baseline.curve))][turn]
        curve.append(f"{turn}: {theirs:.1f}/{ours:.2f}")
    if curve:
        print(f"  load by turn, baseline/contextfold ms: {', '.join(curve)}")
    for note in (*run.baseline.notes, *run.contextfold.notes):
        print(f"  {note}")
    for loader in list(run.baseline.loads)[1:]:
        ratio = run.baseline.median(loader) / run.contextfold.median()
        print(f"  the baseline's {loader} read against contextfold's: {ratio:.1f}x")
    print(
        f"RATIO frameworks_{run.name}_context_load {run.load_ratio:.1f} target >= {TARGET_LOAD:g}"
    )
    if run.name == "langgraph":
        print(
            f"RATIO frameworks_langgraph_storage {run.storage_ratio:.4f} "
            f"target <= {TARGET_STORAGE:g}"
        )
    sys.stdout.flush()


def met(runs: Sequence[FrameworkRun]) -> bool:
    """Whether every RATIO line met its target."""
    loads = all(run.load_ratio >= TARGET_LOAD for run in runs)
    storage = all(run.storage_ratio <= TARGET_STORAGE for run in runs if run.name == "langgraph")
    return loads and storage


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=TURNS)
    parser.add_argument("--window", type=int, default=WINDOW, help="measured turns, the last ones")
    parser.add_argument("--sample", type=int, default=SAMPLE, help="turns between curve points")
    parser.add_argument(
        "--frameworks",
        default=",".join(FRAMEWORKS),
        help="comma-separated: " + ", ".join(FRAMEWORKS),
    )
    parser.add_argument("--budget", type=float, default=BUDGET, help="tokens of context")
    parser.add_argument("--dir", type=Path, default=None, help="where the SQLite files go")
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.frameworks.split(",") if name.strip()]
    unknown = [name for name in names if name not in FRAMEWORKS]
    if unknown or not names:
        parser.error(f"--frameworks: unknown {unknown}; choose from {', '.join(FRAMEWORKS)}")
    if args.window < 1 or args.turns < args.window + 1:
        parser.error("--window must be at least 1 and --turns more than --window")
    if not args.budget > 0:
        parser.error("--budget must be more than 0")
    if args.sample < 1:
        parser.error("--sample must be at least 1")
    print(
        f"frameworks: {args.turns} turns of user message, tool call, 2,000-character result, "
        f"answer; context trimmed to {args.budget:,.0f} tokens; SQLite files on both sides"
    )
    runs = asyncio.run(
        measure(
            names,
            turns=args.turns,
            window=args.window,
            sample=args.sample,
            budget=args.budget,
            directory=args.dir,
            report=print_run,
        )
    )
    return 0 if met(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
