"""The seed's full example end to end, as shipped in ``contextfold.examples.coding_assistant``:
a coding assistant with a segmented conversation, a view (elide + drop_oldest from the newest
prompt), compaction through the policy with chunked summaries, and a chat rendering that
pairs every tool call with its result.

A deterministic local model stands in for the LLM: it answers with tool calls for a few
steps of each turn (counted by a run-scoped fold), then with an answer. Runs on SQLite
and PostgreSQL, at a budget small enough that compaction must happen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

import contextfold as cf
from contextfold.examples.coding_assistant import (
    NO_RESULT,
    AssistantMessage,
    Conversation,
    Message,
    ModelStep,
    StepEntry,
    ToolCall,
    ToolResult,
    ToolsDone,
    UserPrompt,
    chat_view,
    request_tokens,
    segment_tokens,
    summarize_in_chunks,
    summary_message,
    summary_tokens,
    to_messages,
)

# The progress of one request: model steps of the current run.
Progress: cf.Fold[int] = cf.Fold("progress", scope="run", initial=lambda: 0)
Progress.on(ModelStep)(lambda steps, ev: steps + 1)

# Counts what to_messages renders, so a view's tokens are the request's.
ChatView = chat_view(count=segment_tokens, count_summary=summary_tokens)

BUDGET = 500  # the OpenAI tool-call shape costs a few tokens per call
SUMMARY_CHARS = 200
# A summary request carries the summary so far next to one chunk of older segments.
CHUNK_TOKENS = BUDGET - request_tokens([summary_message("x" * SUMMARY_CHARS)])
STEPS_PER_TURN = [2, 3, 1, 4, 2, 3, 0, 2]


# --- A deterministic local model and tool runner ---


def tool_calls(turn: int, steps: int) -> list[ToolCall]:
    return [
        ToolCall(
            id=f"t{turn}-s{steps}-c{i}",
            name="read_file",
            arguments=f'{{"path": "src/m{turn}_{steps}_{i}.py"}}',
        )
        for i in range(1 + (turn + steps) % 2)
    ]


@dataclass
class LocalModel:
    requests: list[list[Message]] = field(default_factory=list)
    summary_requests: list[list[Message]] = field(default_factory=list)

    def complete(
        self, messages: list[Message], *, turn: int, steps: int
    ) -> tuple[str, list[ToolCall]]:
        self.requests.append(messages)
        if steps >= STEPS_PER_TURN[turn]:
            return f"Done with request {turn}: the change is in place.", []
        calls = tool_calls(turn, steps)
        return f"Step {steps} of request {turn}: reading {len(calls)} file(s).", calls

    def summarize(self, messages: list[Message]) -> str:
        self.summary_requests.append(messages)
        prefix = "Earlier in this conversation: "
        earlier = next((m["content"] for m in messages if m["content"].startswith(prefix)), "")
        asked = [
            f'"{m["content"]}"'
            for m in messages
            if m["role"] == "user" and not m["content"].startswith(prefix)
        ]
        calls = sum(len(m.get("tool_calls", ())) for m in messages)
        earlier = earlier.removeprefix("Earlier in this conversation: ")
        text = f"{earlier} asked {' '.join(asked)}; {calls} calls."
        return text.strip()[-SUMMARY_CHARS:]


def run_tool(call: ToolCall, salt: int) -> str:
    size = 150 + (salt * 37) % 200
    line = f"contents of {call.arguments}: def f(): return {salt} "
    return (line * (size // len(line) + 1))[:size]


def check_request(messages: list[Message]) -> None:
    """Every tool call is answered by its result, right after it; nothing else is a tool message."""
    index = 0
    while index < len(messages):
        message = messages[index]
        assert message["role"] != "tool", f"a tool message without its call at {index}"
        calls = message.get("tool_calls", [])
        for offset, call in enumerate(calls, start=1):
            answer = messages[index + offset]
            assert answer["role"] == "tool" and answer["tool_call_id"] == call["id"]
            assert answer["content"] != NO_RESULT
        index += 1 + len(calls)


# --- The network, played out by hand ---


@dataclass
class Stats:
    compactions: int = 0
    summarized: int = 0
    summarized_steps: list[str] = field(default_factory=list)


async def play(journal: cf.Journal, model: LocalModel, stream: str) -> Stats:
    stats = Stats()

    async def summarize(
        *, summary: str | None, older: Sequence[cf.Segment[Any]], kept: Sequence[cf.Segment[Any]]
    ) -> str:
        stats.summarized_steps += [s.id for s in older if isinstance(s.data, StepEntry)]

        def write(request: list[Message]) -> str:
            assert request_tokens(request) <= BUDGET
            return model.summarize(request)

        # `older` has its tool outputs in full: one request per chunk of at most a budget.
        next_summary = await summarize_in_chunks(
            write, view=ChatView, summary=summary, older=older, tokens=CHUNK_TOKENS
        )
        return next_summary or ""

    for turn in range(len(STEPS_PER_TURN)):
        run = f"run-{turn}"
        await journal.append(
            stream, UserPrompt(text=f"Please fix bug #{turn} in module m{turn}."), run_id=run
        )
        while True:  # the model agent: one model call per invocation
            result = await journal.compact(
                Conversation,
                stream,
                view=ChatView,
                budget=BUDGET,
                keep_tokens=BUDGET / 2,
                keep_from=cf.newest(),
                summarize=summarize,
            )
            stats.compactions += result.compacted
            stats.summarized += result.summarized
            chat = ChatView(result.state, budget=BUDGET)
            messages = to_messages(chat.state)
            assert request_tokens(messages) == chat.tokens <= BUDGET
            check_request(messages)
            steps = await journal.fold(Progress, stream, run_id=run)
            text, calls = model.complete(messages, turn=turn, steps=steps)
            if not calls:
                await journal.append(stream, AssistantMessage(text=text), run_id=run)
                break
            step_id = f"{run}:step-{steps}"
            await journal.append(
                stream, ModelStep(step_id=step_id, text=text, tool_calls=tuple(calls)), run_id=run
            )
            # The tools agent: every result, then "done" (which triggers the model again).
            for i, call in enumerate(calls):
                output = run_tool(call, salt=turn * 10 + steps * 3 + i)
                await journal.append(
                    stream, ToolResult(step_id=step_id, call_id=call.id, output=output), run_id=run
                )
            await journal.append(stream, ToolsDone(step_id=step_id), run_id=run)
        assert await journal.fold(Progress, stream, run_id=run) == STEPS_PER_TURN[turn]
        journal.end_run(stream, run)
    return stats


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def journal_url(request: pytest.FixtureRequest) -> str:
    if request.param == "sqlite":
        return "sqlite:///" + str(request.getfixturevalue("sqlite_path"))
    return str(request.getfixturevalue("pg_dsn"))


async def test_the_coding_assistant_end_to_end(journal_url: str) -> None:
    journal = cf.open_journal(journal_url)
    model = LocalModel()
    try:
        stats = await play(journal, model, "session-1")
        state = await journal.fold(Conversation, "session-1")

        # Compaction happened, through checkpoints, and the requests all fit the budget.
        assert stats.compactions >= 2 and stats.summarized > 0
        assert (
            len(await journal.latest("session-1", [Conversation.checkpoint_type], limit=100))
            == stats.compactions
        )
        assert len(model.requests) == sum(STEPS_PER_TURN) + len(STEPS_PER_TURN)
        assert all(request_tokens(r) <= BUDGET for r in model.requests)
        assert len(model.summary_requests) > stats.compactions  # some were chunked
        assert all(request_tokens(r) <= BUDGET for r in model.summary_requests)
        assert state.summary is not None and "Please fix bug" in state.summary
        assert [s.id for s in state.segments][-1] == f"answer:run-{len(STEPS_PER_TURN) - 1}"

        # A late result of a step the compaction summarized away is expected: ignored quietly.
        late_step = stats.summarized_steps[0]
        await journal.append(
            "session-1", ToolResult(step_id=late_step, call_id="late", output="late")
        )
        assert await journal.fold(Conversation, "session-1") == state
        assert [s for s in journal.folds.skipped if s.fold == "conversation"] == []

        # A cold restart (a new journal object) reads the same state.
        restarted = cf.open_journal(journal_url)
        try:
            assert await restarted.fold(Conversation, "session-1") == state
            assert await restarted.fold(Progress, "session-1", run_id="run-3") == STEPS_PER_TURN[3]
            view = ChatView(await restarted.fold(Conversation, "session-1"), budget=BUDGET)
            assert view.tokens <= BUDGET
            check_request(to_messages(view.state))
        finally:
            await restarted.close()
    finally:
        await journal.close()


async def test_the_view_alone_keeps_the_budget_without_breaking_tool_calls() -> None:
    """Without compaction, the view still holds the budget (when the current turn fits):
    old outputs shrink first, then whole old segments go."""
    journal = cf.open_journal("memory://")
    for turn in range(3):
        run = f"run-{turn}"
        await journal.append("s", UserPrompt(text=f"request {turn}"), run_id=run)
        for steps in range(2):
            calls = tool_calls(turn, steps)
            step_id = f"{run}:{steps}"
            await journal.append(
                "s", ModelStep(step_id=step_id, text="t", tool_calls=tuple(calls)), run_id=run
            )
            await journal.append(
                "s",
                [
                    ToolResult(step_id=step_id, call_id=c.id, output=run_tool(c, turn + steps))
                    for c in calls
                ],
                run_id=run,
            )
        await journal.append("s", AssistantMessage(text=f"answer {turn}"), run_id=run)
    state = await journal.fold(Conversation, "s")
    full = ChatView(state, budget=float("inf"))
    current = ChatView(state, budget=1)  # the current turn alone, as the view keeps it
    assert current.state.segments[0].id == "prompt:run-2"
    assert current.over_budget and list(current.dropped) == [s.id for s in state.segments][:-4]
    elided_only = ChatView(state, budget=full.tokens - 1)
    assert list(elided_only.dropped) == [] and "[elided]" in str(to_messages(elided_only.state))
    for budget in (full.tokens - 1, full.tokens * 0.75, full.tokens / 2, current.tokens):
        chat = ChatView(state, budget=budget)
        assert chat.tokens <= budget and not chat.over_budget
        check_request(to_messages(chat.state))
    assert len(ChatView(state, budget=full.tokens / 2).dropped) > 0
