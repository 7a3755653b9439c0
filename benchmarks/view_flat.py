"""Benchmark: a view call costs what the view keeps, not the length of the history.

Two conversation states, of 8,000 and of 200 segments (prompts, model steps with large
tool outputs, answers), each trimmed to 30,000 tokens by the worked example's chat view
(``contextfold.examples.coding_assistant``), which elides old tool outputs and drops old
segments (never the current turn). Each call comes after one new segment, with the view's
caches warm from the previous calls, as in an agent's loop.

Claim, measured in this one run:
  view_8000_vs_200   a view of 8,000 segments costs about what a view of 200 costs

Run: .venv/bin/python benchmarks/view_flat.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

import contextfold as cf
from contextfold.examples import coding_assistant as ca
from contextfold.testing import envelope

ChatView = ca.chat_view()
BUDGET = 30_000
SIZES = (200, 8_000)
WARM_UP = 20
TOOL_CALLS = tuple(ca.ToolCall(id=c, name="read_file", arguments="{}") for c in ("c0", "c1"))
CALLS = 300


def segment_events(index: int) -> list[cf.Event]:
    """The events of segment ``index``: turns of a prompt, three steps, an answer."""
    turn, part = divmod(index, 5)
    if part == 0:
        return [ca.UserPrompt(text=f"request {turn}: " + "please change the parser so that " * 18)]
    if part == 4:
        return [
            ca.AssistantMessage(text=f"done with {turn}: " + "the parser now handles it. " * 15)
        ]
    step_id = f"t{turn}s{part}"
    output = f"file {turn}/{part}: " + "def parse(tokens): return tokens[0] " * (
        40 + (index * 7) % 50
    )
    return [
        ca.ModelStep(
            step_id=step_id, text="reading the parser and its tests " * 12, tool_calls=TOOL_CALLS
        ),
        ca.ToolResult(step_id=step_id, call_id="c0", output=output),
        ca.ToolResult(step_id=step_id, call_id="c1", output=output[::-1]),
    ]


class Conversations:
    """A growing state, one segment at a time, folded by the fold's own handlers."""

    def __init__(self, segments: int) -> None:
        self.position = 0
        self.index = 0
        self.state = ca.Conversation.initial_state()
        self.grow(segments)

    def envelopes(self, count: int) -> Iterator[cf.Envelope[Any]]:
        for _ in range(count):
            for event in segment_events(self.index):
                self.position += 1
                yield envelope(event, self.position)
            self.index += 1

    def grow(self, count: int = 1) -> None:
        self.state = ca.Conversation.apply_all(self.state, self.envelopes(count))


def main() -> int:
    conversations = {n: Conversations(n) for n in SIZES}
    for n, conversation in conversations.items():
        first = ChatView(conversation.state, budget=BUDGET)  # warms the caches
        print(
            f"{n:>5} segments: {first.tokens:.0f} tokens in the view, "
            f"{len(first.state.segments)} segments kept, {len(first.dropped)} dropped"
        )
    times: dict[int, list[float]] = {n: [] for n in SIZES}
    for i in range(WARM_UP + CALLS):
        for n, conversation in conversations.items():  # interleaved: drift hits both alike
            conversation.grow()
            start = time.perf_counter()
            result = ChatView(conversation.state, budget=BUDGET)
            elapsed = time.perf_counter() - start
            assert result.tokens <= BUDGET
            if i >= WARM_UP:
                times[n].append(elapsed)
    medians = {n: statistics.median(samples) for n, samples in times.items()}
    for n in SIZES:
        print(
            f"{n:>5} segments: view call after one new segment {medians[n] * 1000:8.3f} ms (median)"
        )
    ratio = medians[8_000] / medians[200]
    print(f"RATIO view_8000_vs_200 {ratio:.2f} target <= 2.0")
    return 0 if ratio <= 2.0 else 1


if __name__ == "__main__":
    sys.exit(main())
