"""Benchmark: a process reading many streams keeps its memory bounded by its fold cache.

20,000 streams of a short coding conversation (a prompt, a model step with its tool
result, an answer) in one SQLite file, each read once by one process with the worked
example's conversation fold through a fold cache of 1,000 entries, as a ``serve`` or worker
process reads the streams it is asked about. The resident set size is printed after 5k,
10k and 20k streams. Claims:

  fold_cache_within_bounds  the cache never holds more than its max_entries
  rss_20k_vs_10k            resident memory stops growing once the cache is full

Run: .venv/bin/python benchmarks/serve_memory.py [--streams N]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
from pathlib import Path

import contextfold as cf
from contextfold.examples import coding_assistant as ca

CACHE = 1_000
CALL = ca.ToolCall(id="c0", name="read_file", arguments="{}")


def conversation(i: int) -> list[cf.Event]:
    return [
        ca.UserPrompt(text=f"request {i}: please look at module {i % 50}"),
        ca.ModelStep(step_id=f"s{i}", text="reading the file", tool_calls=(CALL,)),
        ca.ToolResult(step_id=f"s{i}", call_id="c0", output=f"contents of module {i} " * 20),
        ca.AssistantMessage(text=f"done with request {i}"),
    ]


def rss_mib() -> float:
    """The resident set size of this process, after a full collection."""
    gc.collect()
    with open("/proc/self/statm") as statm:
        resident = int(statm.read().split()[1])
    return resident * os.sysconf("SC_PAGE_SIZE") / 2**20


async def main(streams: int) -> int:
    checkpoints = (streams // 4, streams // 2, streams)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'streams.db'}"
        writer = cf.open_journal(url)
        for i in range(streams):
            await writer.append(f"s{i}", conversation(i))
        await writer.close()
        cache = cf.FoldCache(max_entries=CACHE)
        journal = cf.open_journal(url, fold_cache=cache)
        rss: dict[int, float] = {}
        largest = 0
        for i in range(streams):
            state = await journal.fold(ca.Conversation, f"s{i}")
            assert len(state.segments) == 3
            largest = max(largest, len(cache))
            if i + 1 in checkpoints:
                rss[i + 1] = rss_mib()
                print(f"{i + 1:>6} streams read: RSS {rss[i + 1]:7.1f} MiB, cache {len(cache)}")
        await journal.close()
    half, full = checkpoints[1], checkpoints[2]
    ratio = rss[full] / rss[half]
    print(f"RATIO fold_cache_within_bounds {largest / CACHE:.2f} target <= 1.0")
    print(f"RATIO rss_{full // 1000}k_vs_{half // 1000}k {ratio:.2f} target <= 1.1")
    return 0 if largest <= CACHE and ratio <= 1.1 else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=20_000)
    sys.exit(asyncio.run(main(parser.parse_args().streams)))
