"""Benchmark: a warm fold read costs what is new, not the length of the history.

Streams of 1k, 10k and 100k events of a coding conversation (prompts, model steps, tool
results, answers) in a SQLite file, read with the worked example's conversation fold
(``contextfold.examples.coding_assistant``). For each: a cold read of the whole stream (a
fresh journal: nothing cached), and a warm read after one new event (the median of many).

Claims, measured in this one run:
  warm_100k_vs_warm_1k        a warm read of a 100k stream costs about what it costs at 1k
  cold_100k_vs_warm_100k      caching pays: a warm read is far cheaper than a rebuild
  cold_100k_vs_raw_100k       a cold read of 100k events is within 3x of the raw driver
                              selecting the same rows and decoding them with orjson
  cold_per_event_100k_vs_10k  a cold read's cost per event does not grow with the history

Run: .venv/bin/python benchmarks/fold_read.py
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

import contextfold as cf
from contextfold.examples import coding_assistant as ca

STREAM = "session"
SIZES = (1_000, 10_000, 100_000)
BATCH = 5_000
WARM_UP = 20
WARM_READS = 200
TOOL_CALLS = tuple(ca.ToolCall(id=c, name="read_file", arguments="{}") for c in ("c0", "c1"))


def conversation(n: int) -> Iterator[cf.Event]:
    """n events: per turn a prompt, two steps with two tool results each, an answer."""
    i = 0
    while True:
        turn = i // 8
        yield ca.UserPrompt(text=f"request {turn}: please look at module {turn % 50}")
        for step in range(2):
            step_id = f"t{turn}s{step}"
            yield ca.ModelStep(step_id=step_id, text="reading the files", tool_calls=TOOL_CALLS)
            for call in TOOL_CALLS:
                yield ca.ToolResult(
                    step_id=step_id,
                    call_id=call.id,
                    output=f"contents {turn}/{step}/{call.id} " * 8,
                )
        yield ca.AssistantMessage(text=f"done with request {turn}")
        i += 8
        if i >= n:
            return


async def build(url: str, n: int) -> None:
    journal = cf.open_journal(url)
    batch: list[cf.Event] = []
    for event in list(conversation(n))[:n]:
        batch.append(event)
        if len(batch) == BATCH:
            await journal.append(STREAM, batch)
            batch = []
    if batch:
        await journal.append(STREAM, batch)
    assert await journal.version(STREAM) == n
    await journal.close()


async def cold_read(url: str) -> float:
    journal = cf.open_journal(url)
    await journal.version(STREAM)  # connect first: the read alone is measured
    start = time.perf_counter()
    state = await journal.fold(ca.Conversation, STREAM)
    elapsed = time.perf_counter() - start
    assert len(state.segments) > 0
    await journal.close()
    return elapsed


def raw_read(path: Path) -> float:
    """The raw driver's floor of a cold read: one SELECT of the stream's rows, in order,
    each row's payload decoded with orjson (on a fresh connection, like the cold read)."""
    conn = sqlite3.connect(path)
    conn.execute("SELECT 1").fetchone()  # connect first, as the cold read does
    start = time.perf_counter()
    rows = conn.execute(
        "SELECT position, type, data, event_id, time FROM cf_events"
        " WHERE stream = ? ORDER BY position",
        (STREAM,),
    )
    decoded = [(position, kind, orjson.loads(data), e, t) for position, kind, data, e, t in rows]
    elapsed = time.perf_counter() - start
    assert len(decoded) > 0
    conn.close()
    return elapsed


async def warm_reads(urls: dict[int, str]) -> dict[int, float]:
    """The median warm read per stream size. Reads of the sizes are interleaved, so drift
    (CPU clock, other load on the machine) hits every size alike."""
    journals = {n: cf.open_journal(url) for n, url in urls.items()}
    for journal in journals.values():
        await journal.fold(ca.Conversation, STREAM)  # cached from here
    times: dict[int, list[float]] = {n: [] for n in urls}
    for i in range(WARM_UP + WARM_READS):
        for n, journal in journals.items():
            await journal.append(STREAM, ca.UserPrompt(text=f"one more request {i}"))
            start = time.perf_counter()
            state = await journal.fold(ca.Conversation, STREAM)
            elapsed = time.perf_counter() - start
            assert state.segments[-1].data.text == f"one more request {i}"
            if i >= WARM_UP:
                times[n].append(elapsed)
    for journal in journals.values():
        await journal.close()
    return {n: statistics.median(samples) for n, samples in times.items()}


def ms(seconds: float) -> str:
    return f"{seconds * 1000:9.3f} ms"


async def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        urls = {n: f"sqlite:///{Path(tmp) / f'fold_read_{n}.db'}" for n in SIZES}
        for n, url in urls.items():
            await build(url, n)
        cold = {n: await cold_read(url) for n, url in urls.items()}
        raw = raw_read(Path(tmp) / f"fold_read_{SIZES[-1]}.db")
        warm = await warm_reads(urls)
    for n in SIZES:
        print(
            f"{n:>7} events   cold read {ms(cold[n])}"
            f"   warm read after one new event {ms(warm[n])} (median)"
        )
    warm_ratio = warm[100_000] / warm[1_000]
    cold_ratio = cold[100_000] / warm[100_000]
    raw_ratio = cold[100_000] / raw
    per_event = (cold[100_000] / 100_000) / (cold[10_000] / 10_000)
    print(f"raw driver read of 100000 events {ms(raw)}")
    print(f"RATIO warm_100k_vs_warm_1k {warm_ratio:.2f} target <= 2.0")
    print(f"RATIO cold_100k_vs_warm_100k {cold_ratio:.2f} target >= 500")
    print(f"RATIO cold_100k_vs_raw_100k {raw_ratio:.2f} target <= 3.0")
    print(f"RATIO cold_per_event_100k_vs_10k {per_event:.2f} target <= 1.2")
    met = warm_ratio <= 2.0 and cold_ratio >= 500 and raw_ratio <= 3.0 and per_event <= 1.2
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
