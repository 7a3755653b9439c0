"""Benchmark: without a tracer provider, telemetry costs an agent turn nothing measurable.

An agent runs tool-heavy turns (a user message, a tool call, its 2,000-character result, an
answer; ``cf.FunctionModel``, so the model costs nothing) on an in-memory journal, its
spans as cf.Agent makes them: with no tracer provider they watch every loop event, make no
span and record the two GenAI metrics through the API's no-op meter. Every call into them
is timed, so the claim is measured inside one run, not between two runs a busy machine
would tell apart by more than the spans cost:

  telemetry_off_overhead   a turn's CPU time against the same turn without the time spent
                           in its spans (1.00: nothing). About 40-50 us a turn, 1% of a
                           turn whose model answers instantly (the guard is 2%): against a
                           model call of 300 ms to 30 s, under 0.02%

For information, the same turns against an agent whose spans ignore everything (blocks of
turns alternating, the median ratio: what a busy machine's noise looks like), and then with
an SDK tracer provider set (spans made and kept in memory, no content captured).

Run: .venv/bin/python benchmarks/telemetry_off.py [--turns N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import contextfold as cf
from contextfold.runtime.spans import LoopSpans

BLOCK = 20
RESULT = "x" * 1_990
TARGET = 1.02


def lookup(path: str) -> str:
    """Read a file (a stand-in that returns 2,000 characters)."""
    return f"{path}:{RESULT}"[:2_000]


def answer(request: cf.NeutralRequest) -> cf.ModelOutput | str:
    if request.messages[-2].role == "tool":
        return "done"
    call = cf.ToolCall(id=f"c{len(request.messages)}", name="lookup", arguments='{"path": "a"}')
    usage = cf.Usage(input_tokens=len(request.messages) * 50, output_tokens=8)
    return cf.ModelOutput(tool_calls=(call,), usage=usage)


class Timed:
    """The agent's own spans, every call into them timed (seconds in ``spent``: by the
    wall clock, whose reading costs far less than the CPU clock's, and which over calls of
    microseconds that never wait reads the same)."""

    def __init__(self, spans: LoopSpans) -> None:
        self.spans = spans
        self.spent = 0.0

    def start_turn(self) -> None:
        start = time.perf_counter()
        self.spans.start_turn()
        self.spent += time.perf_counter() - start

    def end_turn(self, status: str, reason: str) -> None:
        start = time.perf_counter()
        self.spans.end_turn(status, reason)
        self.spent += time.perf_counter() - start

    def on_event(self, event: Any) -> None:
        start = time.perf_counter()
        self.spans.on_event(event)
        self.spent += time.perf_counter() - start


class Silent:
    """Spans that ignore every loop event: the turn without telemetry."""

    def start_turn(self) -> None:
        pass

    def end_turn(self, status: str, reason: str) -> None:
        pass

    def on_event(self, event: Any) -> None:
        pass


async def _agent(journal: cf.Journal, stream: str) -> cf.Agent:
    await journal.append(stream, cf.system_prompt("You read files with the lookup tool."))
    return cf.Agent(journal, stream, cf.FunctionModel(answer, model="gpt-4.1"), tools=[lookup])


async def _block(journal: cf.Journal, agent: cf.Agent, stream: str, first: int) -> float:
    """CPU seconds per turn of ``BLOCK`` turns."""
    start = time.process_time()
    for turn in range(first, first + BLOCK):
        await journal.append(stream, cf.ContextAdded(role="user", content=f"turn {turn}"))
        await agent.run_until_idle()
    return (time.process_time() - start) / BLOCK


async def main(turns: int) -> int:
    blocks = max(turns // BLOCK, 2)
    async with cf.open_journal("memory://") as journal:
        watched, silent = await _agent(journal, "watched"), await _agent(journal, "silent")
        timed = Timed(watched._spans)
        watched._spans = timed  # type: ignore[assignment]
        silent._spans = Silent()  # type: ignore[assignment]
        await _block(journal, watched, "watched", 0)  # warm-up: schemas built on first use
        await _block(journal, silent, "silent", 0)
        timed.spent = 0.0
        total, ratios = 0.0, []
        for n in range(1, blocks + 1):
            # Each goes first every other round: what a block leaves falls on both alike.
            if n % 2:
                ours = await _block(journal, watched, "watched", n * BLOCK)
                none = await _block(journal, silent, "silent", n * BLOCK)
            else:
                none = await _block(journal, silent, "silent", n * BLOCK)
                ours = await _block(journal, watched, "watched", n * BLOCK)
            total += ours * BLOCK
            ratios.append(ours / none)
        share = timed.spent / total
        print(f"{blocks * BLOCK} turns, {total / (blocks * BLOCK) * 1e3:.2f} ms of CPU a turn")
        print(f"in the spans: {timed.spent / (blocks * BLOCK) * 1e6:.1f} us a turn ({share:.2%})")
        print(f"against spans that do nothing (information): {statistics.median(ratios):.3f}")

        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        trace.set_tracer_provider(provider)
        await _block(journal, watched, "watched", (blocks + 1) * BLOCK)  # prices load once
        traced = await _block(journal, watched, "watched", (blocks + 2) * BLOCK)
        print(f"with an SDK tracer provider (information): {traced * 1e3:.2f} ms of CPU a turn")
    overhead = 1 / (1 - share)
    print(f"RATIO telemetry_off_overhead {overhead:.3f} target <= {TARGET}")
    return 0 if overhead <= TARGET else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400)
    raise SystemExit(asyncio.run(main(parser.parse_args().turns)))
