"""Benchmark: the first request of a new agent instance costs what its context holds, not
the length of its journal.

Two agent streams in SQLite files, of 1,000 and 100,000 events: a conversation (a user
question, the request, the answer) compacted every few turns, so both contexts hold about
as much. On each, an agent answers one question and materializes its context in chunks,
as a running agent does; then a new instance (a fresh journal: nothing cached, as after a
restart) answers one more question. Its whole first run, from its first read of the
stream to the recorded answer, is measured (the median of several restarts) as the CPU
time of the process, every thread included (the SQLite thread's reads too), so the load
other processes put on the machine does not blur it; the wall time is printed beside it.
Every request sent is verified to rebuild byte for byte from the events alone.

Claim, measured in this one run:
  agent_cold_100k_vs_1k   a restarted agent's first request on a 100k-event stream costs
                          within 3x of the same on a 1k-event stream

Run: .venv/bin/python benchmarks/agent_cold.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import contextfold as cf
from contextfold.context.compaction import summary_item
from contextfold.context.events import LlmResponse, RequestHeader
from contextfold.context.rebuild import rebuild_state, verify_requests
from contextfold.events import Event
from contextfold.runtime.local import LocalModel

STREAM = "agents/long"
SIZES = (1_000, 100_000)
BATCH = 5_000
COMPACT_EVERY = 25  # turns
RESTARTS = 9
WARM_UP = 1  # restarts per size not counted: the process warms up (imports, first SQL)
HEADER = RequestHeader(transport="openai-chat", model="contextfold-local", max_tokens=1024)


def conversation(n: int) -> Iterator[Event]:
    """n events as an agent writes them: per turn a question, the request, the response
    and its assistant item; every COMPACT_EVERY turns a summary replacing history."""
    yield cf.system_prompt("You answer questions about the workspace.")
    position, turn = 1, 0
    while True:
        question = cf.ContextAdded(
            role="user", actor=cf.Actor(type="user"), content=f"Question {turn}: what is x{turn}?"
        )
        request = cf.LlmRequestRequested(header=HEADER if turn == 0 else None)
        yield question
        yield request
        offset = position + 2
        response = LlmResponse(
            request_offset=offset,
            model="contextfold-local",
            text=f"x{turn} is the value of step {turn}.",
            usage=cf.Usage(input_tokens=400, output_tokens=20),
        )
        yield response
        yield cf.ContextAdded(  # the assistant item, as the runtime writes it
            role="assistant",
            actor=cf.Actor(type="agent"),
            content=response.text,
            llm_request_offset=offset,
        )
        position += 4
        turn += 1
        if turn % COMPACT_EVERY == 0:
            yield summary_item(
                f"Summary through turn {turn}: the user asked about x.", cutoff=offset
            )
            position += 1
        if position >= n:
            return


async def build(url: str, n: int) -> None:
    journal = cf.open_journal(url)
    events = list(conversation(n))
    for start in range(0, len(events), BATCH):
        await journal.append(STREAM, events[start : start + BATCH], actor="agent")
    assert await journal.version(STREAM) == len(events)
    await journal.close()


def _agent(journal: cf.Journal) -> cf.Agent:
    agent = cf.Agent(journal, STREAM, LocalModel())
    agent.settings.materialize_every = 500
    return agent


async def previous_instance(url: str) -> None:
    """The agent that ran before the restart: it answers and materializes its context."""
    journal = cf.open_journal(url)
    await journal.append(STREAM, cf.ContextAdded(role="user", content="What is y?"))
    report = await _agent(journal).run_until_idle()
    assert len(report.requests) == 1 and report.status == "idle"
    await journal.close()


async def first_request(url: str, i: int) -> tuple[float, float]:
    """The first run of a new instance (a fresh journal), answering one question: its CPU
    time and its wall time, in seconds."""
    journal = cf.open_journal(url)
    await journal.append(STREAM, cf.ContextAdded(role="user", content=f"And z{i}, what is it?"))
    cpu, wall = time.process_time(), time.perf_counter()
    report = await _agent(journal).run_until_idle()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    assert len(report.requests) == 1 and report.status == "idle"
    await journal.close()
    return cpu, wall


async def refold(url: str) -> float:
    """For comparison: folding the whole journal, what a start without chunks costs."""
    journal = cf.open_journal(url)
    await journal.version(STREAM)
    start = time.perf_counter()
    await rebuild_state(journal, STREAM, 2**62)
    elapsed = time.perf_counter() - start
    assert await verify_requests(journal, STREAM) == ()  # every request sent rebuilds
    await journal.close()
    return elapsed


def ms(seconds: float) -> str:
    return f"{seconds * 1000:9.2f} ms"


async def measure(sizes: Sequence[int], restarts: int) -> dict[int, tuple[float, float, float]]:
    """Per stream size: the median first run's CPU and wall time, and a full refold's."""
    with tempfile.TemporaryDirectory() as tmp:
        urls = {n: f"sqlite:///{Path(tmp) / f'agent_cold_{n}.db'}" for n in sizes}
        for n, url in urls.items():
            await build(url, n)
            await previous_instance(url)
        times: dict[int, list[tuple[float, float]]] = {n: [] for n in sizes}
        # Interleaved, so drift (CPU clock, other load on the machine) hits every size alike.
        for i in range(WARM_UP + restarts):
            for n, url in urls.items():
                measured = await first_request(url, i)
                if i >= WARM_UP:
                    times[n].append(measured)
        return {
            n: (
                statistics.median(cpu for cpu, _ in times[n]),
                statistics.median(wall for _, wall in times[n]),
                await refold(urls[n]),
            )
            for n in sizes
        }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=SIZES[0], help="events of the short stream")
    parser.add_argument("--large", type=int, default=SIZES[1], help="events of the long stream")
    parser.add_argument("--restarts", type=int, default=RESTARTS)
    args = parser.parse_args(argv)
    small, large = args.small, args.large
    results = asyncio.run(measure((small, large), args.restarts))
    for n, (cpu, wall, full) in results.items():
        print(
            f"{n:>7} events   first request of a restarted agent {ms(cpu)} CPU, {ms(wall)} "
            f"wall (medians of {args.restarts})   a full refold of the journal {ms(full)}"
        )
    ratio = results[large][0] / results[small][0]
    print(f"RATIO agent_cold_100k_vs_1k {ratio:.2f} target <= 3.0")
    return 0 if ratio <= 3.0 else 1


if __name__ == "__main__":
    sys.exit(main())
