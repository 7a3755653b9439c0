"""Benchmark: a view call costs what the view keeps, not the length of the history.

Two conversation states, of 8,000 and of 200 segments (prompts, model steps with large
tool outputs, answers), each trimmed to 30,000 tokens by a view that elides old tool
outputs and drops old segments (never the current turn). Each call comes after one new
segment, with the view's caches warm from the previous calls, as in an agent's loop.

Claim, measured in this one run:
  view_8000_vs_200   a view of 8,000 segments costs about what a view of 200 costs

Run: .venv/bin/python benchmarks/view_flat.py
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

import contextfold as cf


class UserPrompt(cf.Event, type="vbench/user-prompt"):
    text: str


class ModelStep(cf.Event, type="vbench/model-step"):
    step_id: str
    text: str
    calls: tuple[str, ...]


class ToolResult(cf.Event, type="vbench/tool-result"):
    step_id: str
    call_id: str
    output: str


class AssistantMessage(cf.Event, type="vbench/assistant-message"):
    text: str


class UserEntry(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["user"] = "user"
    text: str


class Result(BaseModel):
    model_config = ConfigDict(frozen=True)
    call_id: str
    output: str


class StepEntry(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["step"] = "step"
    text: str
    calls: tuple[str, ...]
    results: tuple[Result, ...] = ()


class AnswerEntry(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["answer"] = "answer"
    text: str


Entry = Annotated[UserEntry | StepEntry | AnswerEntry, Field(discriminator="kind")]
Conversation = cf.SegmentedFold("conversation", data=Entry, summary=str, tag="kind")


@Conversation.open(UserPrompt)
def _prompt(ev: cf.Envelope[UserPrompt]) -> cf.Segment[UserEntry]:
    return cf.Segment(f"prompt:{ev.position}", UserEntry(text=ev.payload.text))


@Conversation.open(ModelStep)
def _step(ev: cf.Envelope[ModelStep]) -> cf.Segment[StepEntry]:
    return cf.Segment(ev.payload.step_id, StepEntry(text=ev.payload.text, calls=ev.payload.calls))


@Conversation.attach(ToolResult, kind="step", to=lambda ev: ev.payload.step_id, on_missing="ignore")
def _result(step: StepEntry, ev: cf.Envelope[ToolResult]) -> StepEntry:
    result = Result(call_id=ev.payload.call_id, output=ev.payload.output)
    return step.model_copy(update={"results": (*step.results, result)})


@Conversation.open(AssistantMessage)
def _answer(ev: cf.Envelope[AssistantMessage]) -> cf.Segment[AnswerEntry]:
    return cf.Segment(f"answer:{ev.position}", AnswerEntry(text=ev.payload.text))


def elide_outputs(data: Any) -> Any:
    if not isinstance(data, StepEntry):
        return data
    results = tuple(
        r.model_copy(update={"output": f"{r.output[:200]}… [elided]"}) if len(r.output) > 200 else r
        for r in data.results
    )
    return data.model_copy(update={"results": results})


ChatView = cf.ContextView(
    Conversation,
    strategies=[
        cf.elide(keep_newest=4, map=elide_outputs),
        cf.drop_oldest(keep_from=cf.from_newest(Conversation, "user")),
    ],
)

BUDGET = 30_000
SIZES = (200, 8_000)
WARM_UP = 20
CALLS = 300


def segment_events(index: int) -> list[cf.Event]:
    """The events of segment ``index``: turns of a prompt, three steps, an answer."""
    turn, part = divmod(index, 5)
    if part == 0:
        return [UserPrompt(text=f"request {turn}: " + "please change the parser so that " * 18)]
    if part == 4:
        return [AssistantMessage(text=f"done with {turn}: " + "the parser now handles it. " * 15)]
    step_id = f"t{turn}s{part}"
    output = f"file {turn}/{part}: " + "def parse(tokens): return tokens[0] " * (
        40 + (index * 7) % 50
    )
    return [
        ModelStep(
            step_id=step_id, text="reading the parser and its tests " * 12, calls=("c0", "c1")
        ),
        ToolResult(step_id=step_id, call_id="c0", output=output),
        ToolResult(step_id=step_id, call_id="c1", output=output[::-1]),
    ]


class Conversations:
    """A growing state, one segment at a time, folded by the fold's own handlers."""

    def __init__(self, segments: int) -> None:
        self.position = 0
        self.index = 0
        self.state = Conversation.initial_state()
        self.grow(segments)

    def envelopes(self, count: int) -> Iterator[cf.Envelope[Any]]:
        for _ in range(count):
            for event in segment_events(self.index):
                self.position += 1
                yield cf.Envelope.make(event, position=self.position)
            self.index += 1

    def grow(self, count: int = 1) -> None:
        self.state = Conversation.apply_all(self.state, self.envelopes(count))


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
