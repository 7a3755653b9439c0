"""Compaction in the loop: the exact request plus the instruction goes to the summarizer, the
summary replaces history through the request, and a replay never summarizes again."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from contextfold.context.compaction import COMPACTION_INSTRUCTION
from contextfold.context.events import ContextAdded
from contextfold.context.projection import AgentContext
from contextfold.context.rebuild import verify_requests
from contextfold.errors import CompactionError, InvalidInputError
from contextfold.journal import Journal
from contextfold.render.prefix import SessionPrefix
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.events import CompactionFinished
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.wire import ModelOutput, NeutralRequest, Usage, render_request
from tests.runtime.helpers import STREAM, Observer, events_of, recorded_of, text_of, user

BIG = 100_000  # input tokens over 0.5 of the default 128k window


def is_summary_request(request: NeutralRequest) -> bool:
    return request.messages[-1].content == COMPACTION_INSTRUCTION


class Model:
    """Answers every question; reports big usage for the request whose text holds "HEAVY".
    Records the normal and the summarizer requests apart."""

    def __init__(self, journal: Journal | None = None) -> None:
        self.requests: list[NeutralRequest] = []
        self.summaries: list[NeutralRequest] = []
        self.journal = journal

    async def __call__(self, request: NeutralRequest) -> ModelOutput:
        if is_summary_request(request):
            self.summaries.append(request)
            return ModelOutput(
                text="SUMMARY: the user asked three questions.",
                usage=Usage(input_tokens=900, output_tokens=20),
            )
        self.requests.append(request)
        n = len(self.requests)
        heavy = "HEAVY" in request.messages[-2].content
        if heavy and self.journal is not None:
            # Arrives while the measured request runs: it must survive the compaction.
            await self.journal.append(STREAM, user("mid-turn message", behaviour="none"))
        return ModelOutput(
            text=f"answer {n}", usage=Usage(input_tokens=BIG if heavy else 500, output_tokens=10)
        )


def make_prefix() -> SessionPrefix:
    prefix = SessionPrefix()

    @prefix.contributor
    async def opener(next_: Any) -> Any:
        from contextfold.wire import NeutralMessage

        return (NeutralMessage(role="user", content="<opener/>"), *await next_())

    return prefix


async def session(journal: Journal, model: Model, observer: Observer) -> Agent:
    await journal.append(STREAM, system_prompt("Agent."))
    agent = Agent(
        journal,
        STREAM,
        FunctionModel(model),
        prefix=make_prefix(),
        observer=observer,
        compaction_threshold=0.5,
    )
    for text in ("question one", "question two", "question three HEAVY"):
        await journal.append(STREAM, user(text))
        await agent.run_until_idle()
    return agent


async def test_compaction_summarizes_the_exact_request_and_rebases_history(
    journal: Journal,
) -> None:
    model = Model(journal)
    observer = Observer()
    agent = await session(journal, model, observer)
    measured = max(observer.sent)  # the HEAVY request
    [summarizer] = model.summaries
    # The summarizer got request @measured byte for byte plus the trailing instruction.
    [sent_neutral] = observer.neutral[measured]
    assert summarizer.messages[:-1] == sent_neutral.messages
    assert replace(summarizer, messages=summarizer.messages[:-1]) == sent_neutral
    bare = render_request(replace(summarizer, messages=summarizer.messages[:-1]), "openai-chat")
    assert bare.sha256 == (await recorded_of(journal, STREAM))[measured][0]
    assert summarizer.messages[-1].role == "developer"  # native developer role on openai-chat
    assert summarizer.model == sent_neutral.model

    # One developer summary item, replacing history through the measured request.
    summaries = [
        (p, e)
        for p, e in await events_of(journal, STREAM, ContextAdded)
        if e.compaction is not None
    ]
    [(summary_at, summary)] = summaries
    assert summary.role == "developer"
    assert summary.compaction.replaces_history_through == measured
    assert summary.compaction.usage is not None and summary.compaction.usage.input_tokens == 900
    assert summary.content == "SUMMARY: the user asked three questions."
    assert summary_at > measured
    assert [d.offset for d in observer.of(CompactionFinished)] == [measured]

    # The next request starts with the summary, sent as user, after system and prefix.
    await journal.append(STREAM, user("question four"))
    report = await agent.run_until_idle()
    assert report.compactions == []
    [after] = [model.requests[-1]]
    roles = [m.role for m in after.messages]
    contents = [m.content for m in after.messages]
    assert contents[0].endswith("\nAgent.") and roles[0] == "system"
    assert contents[1] == "<opener/>"
    assert roles[2] == "user" and contents[2] == f"@{summary_at}\n" + summary.content
    text = text_of(after)
    for gone in ("question one", "question two", "question three HEAVY", "answer 1"):
        assert gone not in text
    # The measured answer and what arrived while it ran survive verbatim behind it.
    assert "mid-turn message" in contents[3] and "answer 3" in contents[4]
    assert "question four" in contents[5]
    context = await journal.fold(AgentContext, STREAM)
    assert context.compacted_through == measured
    assert await verify_requests(journal, STREAM) == ()


async def test_a_replay_never_summarizes_again(journal: Journal) -> None:
    model = Model()
    await session(journal, model, Observer())
    assert len(model.summaries) == 1
    version = await journal.version(STREAM)
    for _ in range(2):
        replay = Model()
        report = await Agent(
            journal, STREAM, FunctionModel(replay), prefix=make_prefix(), compaction_threshold=0.5
        ).run_until_idle()
        assert report.requests == [] and report.compactions == []
        assert replay.requests == [] and replay.summaries == []
    assert await journal.version(STREAM) == version


@pytest.mark.parametrize("transport", ["anthropic", "openai-responses"])
async def test_summary_instruction_role_per_transport(journal: Journal, transport: str) -> None:
    model = Model()
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("HEAVY question"))
    await Agent(
        journal,
        STREAM,
        FunctionModel(model, transport=transport, model="claude-x"),  # type: ignore[arg-type]
    ).run_until_idle()
    [summarizer] = model.summaries
    expected = "user" if transport == "anthropic" else "developer"
    assert summarizer.messages[-1].role == expected
    render_request(summarizer, transport)  # type: ignore[arg-type]  # a valid wire body


async def test_the_pressure_gate_compacts_before_an_oversized_request(journal: Journal) -> None:
    """No usage report crosses the threshold, but the estimate of the next request (prefix
    included) does: the previous request is summarized before sending."""
    seen: list[NeutralRequest] = []
    summaries: list[NeutralRequest] = []

    def model(request: NeutralRequest) -> ModelOutput:
        if is_summary_request(request):
            summaries.append(request)
            return ModelOutput(text="short summary", usage=Usage(input_tokens=10, output_tokens=5))
        seen.append(request)
        return ModelOutput(text="ok", usage=Usage(input_tokens=10, output_tokens=5))

    await journal.append(STREAM, system_prompt("Agent."))
    agent = Agent(
        journal, STREAM, FunctionModel(model, model="contextfold-local"), compaction_threshold=0.5
    )
    await journal.append(STREAM, user("small question"))
    await agent.run_until_idle()
    await journal.append(STREAM, user("x" * 20_000))  # ~5k tokens of an 8k window
    report = await agent.run_until_idle()
    first = min(s for s in (await journal.fold(AgentContext, STREAM)).request_offsets)
    assert report.compactions == [first]
    assert len(summaries) == 1
    assert "small question" not in text_of(seen[-1])
    assert "short summary" in text_of(seen[-1])


async def test_no_compaction_through_another_model_than_the_recorded_one(
    journal: Journal,
) -> None:
    """A new instance with another transport never sends the old request's bytes to its
    client: the pressure gate skips it, and the new request is compacted once measured."""
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, user("first question"))
    first = Model()
    await Agent(journal, STREAM, FunctionModel(first, transport="anthropic")).run_until_idle()
    second = Model()
    await journal.append(STREAM, user("HEAVY " + "y" * 20_000))
    report = await Agent(
        journal,
        STREAM,
        FunctionModel(second, transport="openai-chat", model="contextfold-local"),
        compaction_threshold=0.5,
    ).run_until_idle()
    [measured] = report.requests
    assert report.compactions == [measured]  # not the anthropic request before it
    [summarizer] = second.summaries
    assert summarizer.messages[-1].role == "developer"  # rendered for openai-chat
    assert first.summaries == []
    assert await verify_requests(journal, STREAM) == ()


async def test_no_compaction_with_developer_messages_through_a_model_without_that_role(
    journal: Journal,
) -> None:
    """A request recorded with the developer role is not re-sent, as a summary request, to
    a model whose server is not confirmed to take it (a local server answering 500): the
    new request, logged with that model's roles, is compacted once measured."""
    await journal.append(STREAM, system_prompt("Agent."))
    await journal.append(STREAM, ContextAdded(role="developer", content="Be terse."))
    await journal.append(STREAM, user("first question"))
    first = Model()
    await Agent(journal, STREAM, FunctionModel(first)).run_until_idle()
    second = Model()
    await journal.append(STREAM, user("HEAVY " + "y" * 20_000))
    local = FunctionModel(second, model="contextfold-local", developer_role=False)
    report = await Agent(journal, STREAM, local, compaction_threshold=0.5).run_until_idle()
    [measured] = report.requests
    assert report.compactions == [measured]  # not the developer-role request before it
    [summarizer] = second.summaries
    assert "developer" not in {m.role for m in summarizer.messages}
    assert summarizer.messages[-1].role == "user"
    assert await verify_requests(journal, STREAM) == ()


async def test_catch_up_compacts_only_the_newest_over_threshold_request_once(
    journal: Journal,
) -> None:
    """An instance that never compacted (threshold 1.0) leaves two requests over another
    instance's threshold: a restarted agent summarizes only the newest, and only once."""
    usages = iter([100_000, 110_000])

    def heavy(request: NeutralRequest) -> ModelOutput:
        return ModelOutput(text="answer", usage=Usage(input_tokens=next(usages), output_tokens=10))

    await journal.append(STREAM, system_prompt("Agent."))
    before = Agent(journal, STREAM, FunctionModel(heavy), compaction_threshold=1.0)
    for text in ("question one", "question two"):
        await journal.append(STREAM, user(text))
        assert (await before.run_until_idle()).compactions == []
    first, second = (await journal.fold(AgentContext, STREAM)).request_offsets

    model = Model()
    observer = Observer()
    restarted = Agent(
        journal, STREAM, FunctionModel(model), compaction_threshold=0.5, observer=observer
    )
    report = await restarted.run_until_idle()
    assert report.compactions == [second] and report.requests == []
    [summarizer] = model.summaries
    bare = render_request(replace(summarizer, messages=summarizer.messages[:-1]), "openai-chat")
    assert bare.sha256 == (await recorded_of(journal, STREAM))[second][0]
    context = await journal.fold(AgentContext, STREAM)
    assert context.compacted_through == second and first < second
    for again in (restarted, Agent(journal, STREAM, FunctionModel(model))):
        assert (await again.run_until_idle()).compactions == []
    assert len(model.summaries) == 1


# -- context windows and compaction attempts ------------------------------------------------


async def _summaries(journal: Journal) -> list[ContextAdded]:
    return [e for _, e in await events_of(journal, STREAM, ContextAdded) if e.compaction]


async def test_the_gpt_5_window_is_272k_and_an_agent_can_override_it(journal: Journal) -> None:
    """Half of gpt-5's 272,000 input tokens is 136,000: 150,000 is over it (it was not with
    the 400,000 total window); an agent's own context_window decides instead when given."""
    tokens = {"value": 150_000}

    def model(request: NeutralRequest) -> ModelOutput:
        if is_summary_request(request):
            return ModelOutput(text="gist", usage=Usage(input_tokens=10, output_tokens=5))
        return ModelOutput(text="ok", usage=Usage(input_tokens=tokens["value"], output_tokens=5))

    gpt5 = FunctionModel(model, model="gpt-5-mini")
    await journal.append(STREAM, [system_prompt("Agent."), user("question one")])
    assert (await Agent(journal, STREAM, gpt5).run_until_idle()).compactions != []

    tokens["value"] = 100_000  # under 136,000, over half of a 150,000-token window
    other = "agents/other"
    await journal.append(other, [system_prompt("Agent."), user("question one")])
    assert (await Agent(journal, other, gpt5).run_until_idle()).compactions == []
    report = await Agent(journal, other, gpt5, context_window=150_000).run_until_idle()
    assert report.requests == [] and len(report.compactions) == 1


@pytest.mark.parametrize("window", [0, -5, 2.5, "big"])
def test_a_context_window_that_is_no_positive_int_is_refused(
    journal: Journal, window: object
) -> None:
    with pytest.raises(InvalidInputError, match="context_window"):
        Agent(journal, STREAM, FunctionModel(lambda r: "ok"), context_window=window)  # type: ignore[arg-type]


async def test_a_compaction_that_cannot_help_stops_after_two_attempts(journal: Journal) -> None:
    """Every answer reports input over the threshold: two summaries in a row leave it over,
    and then the loop raises, naming the request and its size, instead of paying a summary
    call on every turn (again: nothing is summarized or appended)."""
    model = Model()

    def always_heavy(request: NeutralRequest) -> ModelOutput:
        if is_summary_request(request):
            model.summaries.append(request)
            return ModelOutput(text="gist", usage=Usage(input_tokens=10, output_tokens=5))
        model.requests.append(request)
        return ModelOutput(text="answer", usage=Usage(input_tokens=BIG, output_tokens=5))

    await journal.append(STREAM, system_prompt("Agent."))
    agent = Agent(journal, STREAM, FunctionModel(always_heavy), compaction_threshold=0.5)
    for question in ("one", "two"):
        await journal.append(STREAM, user(f"question {question}"))
        assert len((await agent.run_until_idle()).compactions) == 1
    assert [s.compaction.attempt for s in await _summaries(journal) if s.compaction] == [1, 2]

    await journal.append(STREAM, user("question three"))
    with pytest.raises(CompactionError, match="still above threshold after 2 compaction") as err:
        await agent.run_until_idle()
    third = (await journal.fold(AgentContext, STREAM)).request_offset
    assert f"request @{third} of stream {STREAM!r} is 100,000 input tokens" in str(err.value)
    assert err.value.reason == "still-over-threshold"
    assert len(model.summaries) == 2
    version = await journal.version(STREAM)
    for again in (agent, Agent(journal, STREAM, FunctionModel(always_heavy))):
        with pytest.raises(CompactionError, match="after 2 compaction attempts"):
            await again.run_until_idle()
    assert len(model.summaries) == 2 and await journal.version(STREAM) == version


async def test_a_compaction_that_helped_starts_the_count_again(journal: Journal) -> None:
    usages = iter([BIG, 500, BIG, BIG])

    def model(request: NeutralRequest) -> ModelOutput:
        if is_summary_request(request):
            return ModelOutput(text="gist", usage=Usage(input_tokens=10, output_tokens=5))
        return ModelOutput(text="answer", usage=Usage(input_tokens=next(usages), output_tokens=5))

    await journal.append(STREAM, system_prompt("Agent."))
    agent = Agent(journal, STREAM, FunctionModel(model))
    for n in range(4):
        await journal.append(STREAM, user(f"question {n}"))
        await agent.run_until_idle()
    # The second request fitted: the summary of the third is a first attempt again.
    assert [s.compaction.attempt for s in await _summaries(journal) if s.compaction] == [1, 1, 2]


async def test_the_pressure_gate_stops_after_two_attempts_too(journal: Journal) -> None:
    """A system lane (compaction-immune) over the threshold of a small window: the gate's
    estimate stays over it after each summary, so it summarizes twice, then raises."""
    summaries: list[NeutralRequest] = []

    def model(request: NeutralRequest) -> ModelOutput:
        if is_summary_request(request):
            summaries.append(request)
            return ModelOutput(text="gist", usage=Usage(input_tokens=10, output_tokens=5))
        return ModelOutput(text="ok", usage=Usage(input_tokens=10, output_tokens=5))

    await journal.append(STREAM, system_prompt("Agent. " + "Always be thorough. " * 300))
    agent = Agent(journal, STREAM, FunctionModel(model), context_window=1_000)
    for n in range(3):
        await journal.append(STREAM, user(f"question {n}"))
        await agent.run_until_idle()
    assert len(summaries) == 2
    await journal.append(STREAM, user("question 3"))
    with pytest.raises(CompactionError, match="still above threshold after 2 compaction"):
        await agent.run_until_idle()
    assert len(summaries) == 2
