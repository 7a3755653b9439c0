"""Benchmark: verifying a stream's recorded requests takes memory bounded by its largest
request, not by the number of its requests.

Two agent streams in one SQLite file, of 1,000 and 10,000 recorded requests: per turn a
user question (about 300 characters) and the request, whose record (the hash of the body
as sent) lands with the next turn; a summary replaces the history every 20 turns, so most
requests are a few kilobytes. At turn 500 and every 2,500 turns a large pasted document
(1 MiB) makes one request large, the same largest in both streams (a summary right after
it takes it out). Each stream is verified as ``contextfold verify`` does it, in a child
process of its own (nothing cached or memoized by the other), which reports the peak of
its Python allocations (tracemalloc) over the whole verification, and for information how
much its peak resident set grew meanwhile.

Claims, measured in this one run:
  verify_peak_10k_vs_1k           verifying 10x the requests takes the same memory
  verify_peak_vs_largest_request  that memory is a small multiple of the largest body

Run: .venv/bin/python benchmarks/verify_memory.py [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import contextfold as cf
from contextfold.context import AgentContext, build_request, summary_item
from contextfold.context.events import RequestHeader
from contextfold.inspection import verify_stream
from contextfold.wire import render_request

HEADER = RequestHeader(transport="openai-chat", model="gpt-4.1", max_tokens=1024)
COMPACT_EVERY = 20  # turns
LARGE_AT = 500  # the first turn with a large document, then every LARGE_EVERY turns
LARGE_EVERY = 2_500
LARGE = 1024 * 1024  # characters
# The largest request's own copies (its event as read and decoded, its item, rendered text,
# serialized message and body: about 6x) and the transient of reading the page that holds
# it (about 13x today): a constant factor of the largest request, whatever the stream.
PER_BODY = 20
QUESTION = "Please look at module {turn} again and tell me what its main loop does. " * 4


async def write(journal: cf.Journal, stream: str, requests: int) -> int:
    """A session of ``requests`` recorded requests; the size of the largest body."""
    await journal.append(stream, cf.system_prompt("You answer questions about the code."))
    record: list[cf.Event] = []
    largest = 0
    for turn in range(requests):
        events: list[cf.Event] = [*record]
        large = turn >= LARGE_AT and (turn - LARGE_AT) % LARGE_EVERY == 0
        if large:
            document = f"document {turn}: " + "x" * LARGE
            events.append(
                cf.ContextAdded(role="user", actor=cf.Actor(type="user"), content=document)
            )
        question = QUESTION.format(turn=turn)
        events.append(cf.ContextAdded(role="user", actor=cf.Actor(type="user"), content=question))
        events.append(cf.LlmRequestRequested(header=HEADER if turn == 0 else None))
        offset = (await journal.append(stream, events)).last_position
        state = await journal.fold(AgentContext, stream)
        body = render_request(build_request(state, through=offset), HEADER.transport)
        largest = max(largest, len(body.body))
        record = [
            cf.RequestRecorded(
                request_offset=offset,
                transport=body.transport,
                sha256=body.sha256,
                size=len(body.body),
            )
        ]
        if large or turn % COMPACT_EVERY == COMPACT_EVERY - 1:
            record.append(summary_item(f"Summary through turn {turn}.", cutoff=offset))
    await journal.append(stream, record)
    return largest


async def measure(url: str, stream: str) -> dict[str, int]:
    """Verify ``stream`` as the CLI does: the peak of Python allocations while it runs,
    how much the peak resident set grew (-1 where it cannot be reset) and the time."""
    async with cf.open_journal(url) as journal:
        await journal.version(stream)  # the connection is open before measuring
        resident = _reset_peak_rss()
        tracemalloc.start()
        started = time.perf_counter()
        done = await verify_stream(journal, stream)
        took = time.perf_counter() - started
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        grown = _status("VmHWM") - resident if resident >= 0 else -1
    return {
        "peak": peak,
        "rss": grown,
        "ms": round(took * 1000),
        "requests": done.requests,
        "drifts": done.drift_count,
    }


def _status(field: str) -> int:
    """A size in bytes from /proc/self/status."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


def _reset_peak_rss() -> int:
    """Reset the peak resident set to the current one (Linux); the current one, or -1."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return _status("VmRSS")
    except OSError:
        return -1


def child(url: str, stream: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, __file__, "--measure", url, stream],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, int] = json.loads(done.stdout)
    return result


async def main(requests: int) -> int:
    sizes = (requests // 10, requests)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'verify.db'}"
        largest: dict[int, int] = {}
        async with cf.open_journal(url) as journal:
            for size in sizes:
                largest[size] = await write(journal, f"agent/{size}", size)
        peaks = {}
        for size in sizes:
            got = child(url, f"agent/{size}")
            assert got["requests"] == size and got["drifts"] == 0, got
            peaks[size] = got["peak"]
            rss = f"+{got['rss'] / 2**20:5.1f} MiB" if got["rss"] >= 0 else "n/a"
            print(
                f"{size:>6} requests verified in {got['ms'] / 1000:5.1f} s: "
                f"peak {got['peak'] / 2**20:6.2f} MiB traced, peak RSS {rss}, "
                f"largest body {largest[size] / 2**20:.2f} MiB"
            )
    small, full = sizes
    ratio = peaks[full] / peaks[small]
    per_body = peaks[full] / largest[full]
    label = f"{full // 1000}k_vs_{small // 1000}k" if small >= 1000 else f"{full}_vs_{small}"
    print(f"RATIO verify_peak_{label} {ratio:.2f} target <= 1.2")
    print(f"RATIO verify_peak_vs_largest_request {per_body:.1f} target <= {PER_BODY}")
    return 0 if ratio <= 1.2 and per_body <= PER_BODY else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--measure"]:
        print(json.dumps(asyncio.run(measure(sys.argv[2], sys.argv[3]))))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    sys.exit(asyncio.run(main(parser.parse_args().requests)))
