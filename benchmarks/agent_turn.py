"""Benchmark: a full agent turn costs what is new in it, not the length of the session.

One agent on a SQLite journal runs 1,000 turns of the tool-heavy workload: a user message,
a tool call, a 2,000-character result, an answer (``cf.FunctionModel``: the model costs
nothing). Each turn's floor is measured in the same run: serializing and hashing its two
request bodies with orjson and hashlib, plus the raw driver appending its events (one
transaction per append, in the batches the journal's store was given). Claims:

  agent_turn_growth         per-turn cost minus floor at turns 951-1,000 vs turns 1-50
  agent_turn_1000_vs_floor  turns 951-1,000 against their floor: information, with a guard
                            of 6x (a turn costs 1.5-3 ms of CPU against a model call of
                            300 ms to 30 s: simplicity may cost some of it, not more)

Run: .venv/bin/python benchmarks/agent_turn.py [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

import contextfold as cf

sys.path.insert(0, str(Path(__file__).resolve().parent))
from journal import RawSQLite  # the raw driver side of the journal benchmark

STREAM = "session"
WINDOW = 50
RESULT = "x" * 1_990


def lookup(path: str) -> str:
    """Read a file (a stand-in that returns 2,000 characters)."""
    return f"{path}:{RESULT}"[:2_000]


class Recording(cf.FunctionModel):
    """The function model, keeping each request's body for the floor."""

    def __init__(self) -> None:
        super().__init__(self.answer)
        self.bodies: list[bytes] = []
        self.turn = 0

    def answer(self, request: cf.NeutralRequest) -> cf.ModelOutput | str:
        if request.messages[-2].role == "tool":
            return f"done with turn {self.turn}"
        call = cf.ToolCall(id=f"c{self.turn}", name="lookup", arguments='{"path": "a.py"}')
        return cf.ModelOutput(tool_calls=(call,))

    async def complete(self, request: Any, rendered: Any, *, on_delta: Any = None) -> Any:
        self.bodies.append(rendered.body)
        return await super().complete(request, rendered, on_delta=on_delta)


def floor(
    bodies: list[bytes], rows: list[dict[str, Any]], batches: list[int], raw: RawSQLite, turn: int
) -> float:
    """Seconds of the turn's irreducible work: its bodies serialized and hashed, its events
    appended by the raw driver in the same batches, one transaction each."""
    assert sum(batches) == len(rows), (batches, len(rows))
    decoded = [orjson.loads(body) for body in bodies]
    start = time.perf_counter()
    for value in decoded:
        hashlib.sha256(orjson.dumps(value)).hexdigest()
    at = 0
    for size in batches:
        raw.append(f"raw-{turn}", rows[at : at + size])
        at += size
    return time.perf_counter() - start


def count_batches(journal: cf.Journal) -> list[int]:
    """The sizes of the appends the journal's store makes to the session, as they come."""
    sizes: list[int] = []
    store = journal.store
    append = store.append

    async def counted(namespace: str, stream: str, events: Any, **options: Any) -> Any:
        if stream == STREAM:
            sizes.append(len(events))
        return await append(namespace, stream, events, **options)

    store.append = counted  # type: ignore[method-assign]
    return sizes


async def main(turns: int) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        journal = cf.open_journal(f"sqlite:///{Path(tmp) / 'agent.db'}")
        raw = RawSQLite(Path(tmp) / "raw.db")
        batches = count_batches(journal)
        await journal.append(STREAM, cf.system_prompt("You read files with the lookup tool."))
        model = Recording()
        agent = cf.Agent(journal, STREAM, model, tools=[lookup])
        costs: dict[int, float] = {}
        floors: dict[int, float] = {}
        for turn in range(1, turns + 1):
            model.turn = turn
            before = await journal.head(STREAM)
            # Only this turn's bodies are kept: an agent sends a body and drops it, and a
            # list of every body would charge the turn for fresh memory the floor never needs.
            model.bodies.clear()
            appended = len(batches)
            start = time.perf_counter()
            await journal.append(STREAM, cf.ContextAdded(role="user", content=f"turn {turn}"))
            await agent.run_until_idle()
            costs[turn] = time.perf_counter() - start
            if turn <= WINDOW or turn > turns - WINDOW:
                # Only the turn's events: reading the whole stream would leave its garbage
                # to the collector during the next measured turn.
                page = await journal.read(STREAM, after=before)
                rows = [orjson.loads(e.data) for e in page.events]
                floors[turn] = floor(model.bodies, rows, batches[appended:], raw, turn)
        raw.close()
        await journal.close()
    early = range(1, WINDOW + 1)
    late = range(turns - WINDOW + 1, turns + 1)
    cost_late = statistics.median(costs[t] for t in late)
    floor_late = statistics.median(floors[t] for t in late)
    cost_early = statistics.median(costs[t] for t in early)
    floor_early = statistics.median(floors[t] for t in early)
    over_late = statistics.median(costs[t] - floors[t] for t in late)
    over_early = statistics.median(costs[t] - floors[t] for t in early)
    print(f"turns 1-{WINDOW}: {cost_early * 1e3:.2f} ms/turn, floor {floor_early * 1e3:.2f} ms")
    print(
        f"turns {late.start}-{late.stop - 1}: {cost_late * 1e3:.2f} ms/turn, "
        f"floor {floor_late * 1e3:.2f} ms"
    )
    vs_floor = cost_late / floor_late
    growth = over_late / over_early
    print(f"RATIO agent_turn_1000_vs_floor {vs_floor:.2f} target <= 6.0")
    print(f"RATIO agent_turn_growth {growth:.2f} target <= 1.5")
    return 0 if vs_floor <= 6.0 and growth <= 1.5 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=1_000)
    sys.exit(asyncio.run(main(parser.parse_args().turns)))
