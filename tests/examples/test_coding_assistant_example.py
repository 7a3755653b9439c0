"""The shipped worked example (``contextfold.examples.coding_assistant``) used directly: its
fold, its view, its chat rendering and its chunked summaries."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCallParam
from pydantic import TypeAdapter

import contextfold as cf
from contextfold.examples import coding_assistant as ca
from contextfold.testing import envelopes


def calls(*ids: str) -> tuple[ca.ToolCall, ...]:
    return tuple(
        ca.ToolCall(id=i, name="read_file", arguments=f'{{"path": "{i}.py"}}') for i in ids
    )


async def session(journal: cf.Journal, stream: str, turns: int, *, output: int = 50) -> None:
    """``turns`` turns, each: a prompt, two steps of two tool calls with their results, an
    answer; tool outputs of ``output`` characters."""
    for turn in range(turns):
        run = f"run-{turn}"
        await journal.append(stream, ca.UserPrompt(text=f"fix bug {turn}"), run_id=run)
        for step in range(2):
            step_id = f"{run}:step-{step}"
            step_calls = calls(f"{step_id}:a", f"{step_id}:b")
            await journal.append(
                stream,
                ca.ModelStep(step_id=step_id, text="reading", tool_calls=step_calls),
                run_id=run,
            )
            await journal.append(
                stream,
                [
                    ca.ToolResult(step_id=step_id, call_id=c.id, output=(c.id * output)[:output])
                    for c in reversed(step_calls)  # results may come in any order
                ],
                run_id=run,
            )
            await journal.append(stream, ca.ToolsDone(step_id=step_id), run_id=run)
        await journal.append(stream, ca.AssistantMessage(text=f"fixed bug {turn}"), run_id=run)


async def folded(*, turns: int, output: int) -> ca.ConversationState:
    """The state of a fresh session of ``turns`` turns (see :func:`session`)."""
    journal = cf.open_journal("memory://")
    try:
        await session(journal, "s", turns=turns, output=output)
        return await journal.fold(ca.Conversation, "s")
    finally:
        await journal.close()


# Counts what to_messages renders, so a view's tokens are the request's.
VIEW = ca.chat_view(count=ca.segment_tokens, count_summary=ca.summary_tokens)


def answered(messages: list[ca.Message]) -> None:
    """Every tool call is followed by its tool message, in order; no tool message is loose."""
    index = 0
    while index < len(messages):
        message = messages[index]
        assert message["role"] != "tool", f"a tool message without its call at {index}"
        call_ids = [c["id"] for c in message.get("tool_calls", [])]
        answers = messages[index + 1 : index + 1 + len(call_ids)]
        assert [(m["role"], m["tool_call_id"]) for m in answers] == [("tool", i) for i in call_ids]
        index += 1 + len(call_ids)


async def test_a_short_session_folds_into_prompt_step_and_answer_segments() -> None:
    journal = cf.open_journal("memory://")
    try:
        await session(journal, "s", turns=1)
        state = await journal.fold(ca.Conversation, "s")
    finally:
        await journal.close()
    assert [s.id for s in state.segments] == [
        "prompt:run-0",
        "run-0:step-0",
        "run-0:step-1",
        "answer:run-0",
    ]
    assert state.summary is None
    assert state.segments[0].data == ca.UserEntry(text="fix bug 0")
    assert state.segments[-1].data == ca.AnswerEntry(text="fixed bug 0")
    step = state.segments[1].data
    assert isinstance(step, ca.StepEntry)
    assert step.tool_calls == calls("run-0:step-0:a", "run-0:step-0:b")
    assert [r.call_id for r in step.results] == ["run-0:step-0:b", "run-0:step-0:a"]


def test_segment_ids_outside_a_run_come_from_the_position() -> None:
    events = [ca.UserPrompt(text="a"), ca.UserPrompt(text="b"), ca.AssistantMessage(text="c")]
    state = ca.Conversation.apply_all(
        ca.Conversation.initial_state(),
        envelopes(events),
    )
    assert [s.id for s in state.segments] == ["prompt:@1", "prompt:@2", "answer:@3"]


async def test_a_late_result_is_ignored_by_default_and_reported_on_request() -> None:
    reporting = ca.conversation_fold("reporting", on_missing="report")
    journal = cf.open_journal("memory://")
    try:
        await session(journal, "s", turns=1)
        before = await journal.fold(ca.Conversation, "s")
        reported_before = await journal.fold(reporting, "s")
        await journal.append("s", ca.ToolResult(step_id="gone", call_id="x", output="late"))
        assert await journal.fold(ca.Conversation, "s") == before
        assert await journal.fold(reporting, "s") == reported_before
        skipped = [(s.fold, s.reason) for s in journal.folds.skipped]
    finally:
        await journal.close()
    assert skipped == [("reporting", "missing-segment")]


async def test_the_view_keeps_every_step_whole_and_the_current_turn() -> None:
    state = await folded(turns=4, output=400)
    full = VIEW(state, budget=float("inf"))
    assert full.tokens == ca.request_tokens(ca.to_messages(state))
    by_id = {s.id: s.data for s in state.segments}
    for budget in (full.tokens - 1, full.tokens / 2, full.tokens / 4, 1):
        chat = VIEW(state, budget=budget)
        kept = [s.id for s in chat.state.segments]
        assert kept == [s.id for s in state.segments][len(state.segments) - len(kept) :]
        assert "prompt:run-3" in kept  # a suffix: the current turn always stays whole
        for segment in chat.state.segments:
            original = by_id[segment.id]
            if isinstance(original, ca.StepEntry):
                assert isinstance(segment.data, ca.StepEntry)
                assert segment.data.tool_calls == original.tool_calls
                assert [r.call_id for r in segment.data.results] == [
                    r.call_id for r in original.results
                ]
        messages = ca.to_messages(chat.state)
        assert ca.request_tokens(messages) == chat.tokens
        answered(messages)
    elided = VIEW(state, budget=full.tokens - 1)
    assert list(elided.dropped) == [] and "… [elided]" in str(ca.to_messages(elided.state))
    assert VIEW(state, budget=1).over_budget  # the current turn alone is over: it stays


def test_to_messages_answers_every_tool_call() -> None:
    step = ca.StepEntry(
        text="reading",
        tool_calls=calls("a", "b"),
        results=(ca.ResultEntry(call_id="b", output="B"),),  # a's result never came
    )
    state: ca.ConversationState = cf.SegmentedState(
        [
            cf.Segment("p", ca.UserEntry(text="hi")),
            cf.Segment("s", step),
            cf.Segment("a", ca.AnswerEntry(text="done")),
        ],
        "earlier",
    )
    messages = ca.to_messages(state)
    answered(messages)
    assert messages == [
        {"role": "user", "content": "Earlier in this conversation: earlier"},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": "reading",
            "tool_calls": [
                {
                    "id": "a",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
                },
                {
                    "id": "b",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "b.py"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "a", "content": ca.NO_RESULT},
        {"role": "tool", "tool_call_id": "b", "content": "B"},
        {"role": "assistant", "content": "done"},
    ]
    # Each call is what the official client accepts as a function tool call.
    adapter = TypeAdapter(ChatCompletionMessageFunctionToolCallParam)
    for call in messages[2]["tool_calls"]:
        adapter.validate_python(call, strict=True)


def test_elide_outputs_shortens_long_outputs_of_steps_only() -> None:
    long, short = "x" * 201, "y" * 200
    step = ca.StepEntry(
        text="t",
        tool_calls=calls("a", "b"),
        results=(
            ca.ResultEntry(call_id="a", output=long),
            ca.ResultEntry(call_id="b", output=short),
        ),
    )
    elided = ca.elide_outputs(step)
    assert isinstance(elided, ca.StepEntry)
    assert [r.output for r in elided.results] == ["x" * 200 + "… [elided]", short]
    prompt = ca.UserEntry(text=long)
    assert ca.elide_outputs(prompt) is prompt


def sync_writer(requests: list[list[ca.Message]]) -> Callable[[list[ca.Message]], str]:
    def write(request: list[ca.Message]) -> str:
        requests.append(request)
        return f"summary {len(requests)}"

    return write


def async_writer(requests: list[list[ca.Message]]) -> Callable[[list[ca.Message]], Awaitable[str]]:
    async def write(request: list[ca.Message]) -> str:
        requests.append(request)
        return f"summary {len(requests)}"

    return write


@pytest.mark.parametrize("writer", [sync_writer, async_writer])
async def test_summaries_are_written_in_chunks_carrying_the_summary_so_far(
    writer: Callable[[list[list[ca.Message]]], Callable[[list[ca.Message]], str | Awaitable[str]]],
) -> None:
    state = await folded(turns=3, output=300)
    tokens = 400
    requests: list[list[ca.Message]] = []
    summary = await ca.summarize_in_chunks(
        writer(requests),
        view=VIEW,
        summary="before",
        older=state.segments,
        tokens=tokens,
    )
    chunks = cf.chunks_of(state.segments, tokens, count=VIEW.count)
    assert len(chunks) > 1 and summary == f"summary {len(chunks)}"
    assert len(requests) == len(chunks)
    for index, (request, chunk) in enumerate(zip(requests, chunks, strict=True)):
        written = "before" if index == 0 else f"summary {index}"
        assert request == ca.to_messages(cf.SegmentedState(chunk, written))
        assert ca.request_tokens(request[1:]) <= tokens or len(chunk) == 1
        answered(request)

    nothing: list[list[ca.Message]] = []
    write = writer(nothing)
    assert (
        await ca.summarize_in_chunks(write, view=VIEW, summary="kept", older=[], tokens=tokens)
        == "kept"
    )
    assert nothing == []
