"""A framework's model calls, recorded framework-neutrally: the pair-safe choice of
messages (property tests), the compaction cut, and record → read → verify on a journal."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.canonical import sha256_hex
from contextfold.context.call_records import (
    CallRecorder,
    Message,
    call_body,
    read_calls,
    verify_calls,
)
from contextfold.context.calls import (
    CallRequested,
    CallTool,
    Readable,
    compaction_cut,
    message_digest,
    split_pairs,
    view_start,
)
from contextfold.errors import InvalidInputError
from contextfold.integrations._call_engine import CallEngine


def _user(text: str) -> Readable:
    return Readable(role="user", text=text)


@st.composite
def histories(draw: st.DrawFn) -> list[Readable]:
    """A well-formed history: system messages, user turns, assistant steps making tool
    calls (each answered by its results, in any order) and answers."""
    out: list[Readable] = []
    if draw(st.booleans()):
        out.append(Readable(role="system", text="be brief"))
    calls = 0
    for turn in range(draw(st.integers(0, 6))):
        out.append(_user(f"q{turn}"))
        for _ in range(draw(st.integers(0, 3))):
            ids = [f"c{calls + i}" for i in range(draw(st.integers(1, 3)))]
            calls += len(ids)
            out.append(
                Readable(role="assistant", tool_calls=tuple(CallTool(id=i, name="t") for i in ids))
            )
            for call in draw(st.permutations(ids)):
                out.append(Readable(role="tool", text="x" * 5, tool_call_id=call))
            if draw(st.booleans()):
                out.append(Readable(role="system", text="note"))
        if draw(st.booleans()):
            out.append(Readable(role="assistant", text=f"a{turn}"))
    return out


def _sent(history: Sequence[Readable], start: int) -> list[Readable]:
    return [m for m in history[:start] if m.role == "system"] + list(history[start:])


@settings(max_examples=300, deadline=None)
@given(
    histories(),
    st.lists(st.integers(0, 50), min_size=64, max_size=64),
    st.integers(0, 400),
    st.integers(0, 3),
)
def test_view_never_splits_a_pair_and_fits_unless_kept(
    history: list[Readable], costs: list[int], budget: int, keep: int
) -> None:
    tokens = [float(costs[i % len(costs)]) for i in range(len(history))]
    start = view_start(history, tokens, budget=budget, keep=keep)
    assert split_pairs(_sent(history, start)) == 0
    assert start in (0, len(history)) or history[start].role != "tool"

    safe = [
        i
        for i in range(len(history) - 1, -1, -1)
        if split_pairs(history[i:]) == 0 and (i == 0 or history[i].role != "tool")
    ]
    if not safe:
        assert start == 0
        return
    # Kept whatever it costs among the newest `keep` starts; otherwise it fits...
    if start not in safe[:keep] and start < len(history):  # (the system messages always go)
        assert _window(tokens, history, start) <= budget
    # ...and the next older pair-safe start would not have.
    older = [i for i in safe if i < start]
    if older:
        assert _window(tokens, history, older[0]) > budget


def _window(tokens: list[float], history: list[Readable], start: int) -> float:
    """Tokens of the window from ``start``: every system message and the rest from it on."""
    pinned = sum(t for t, m in zip(tokens, history, strict=False) if m.role == "system")
    rest = sum(
        t for t, m in zip(tokens[start:], history[start:], strict=False) if m.role != "system"
    )
    return pinned + rest


@settings(max_examples=300, deadline=None)
@given(
    histories(),
    st.lists(st.integers(0, 50), min_size=64, max_size=64),
    st.integers(0, 300),
    st.integers(0, 4),
)
def test_compaction_cut_is_pair_safe_and_keeps_the_newest_answer(
    history: list[Readable], costs: list[int], keep_tokens: int, lowest: int
) -> None:
    tokens = [float(costs[i % len(costs)]) for i in range(len(history))]
    lowest = min(lowest, len(history))
    if split_pairs(history[lowest:]) or (lowest < len(history) and history[lowest].role == "tool"):
        lowest = 0
    cut = compaction_cut(history, tokens, lowest=lowest, keep_tokens=keep_tokens)
    if cut is None:
        return
    assert lowest < cut <= len(history)
    assert split_pairs(history[cut:]) == 0 and history[cut].role != "tool"
    answers = [i for i, m in enumerate(history) if m.role == "assistant" and not m.tool_calls]
    if answers:
        assert cut <= answers[-1]


def test_split_pairs_counts_orphans_both_ways() -> None:
    call = Readable(role="assistant", tool_calls=(CallTool(id="a", name="t"),))
    result = Readable(role="tool", tool_call_id="a")
    assert split_pairs([call, result]) == 0
    assert split_pairs([call]) == 1
    assert split_pairs([result]) == 1
    assert split_pairs([result, call]) == 2


def _msg(readable: Readable) -> Message:
    return Message(readable.model_dump(mode="json", exclude_defaults=True), readable)


async def _summarize(prompt: str) -> tuple[str, cf.Usage | None]:
    return f"summary of {prompt.count('[')} lines", cf.Usage(input_tokens=len(prompt))


def _engine(journal: cf.Journal, **options: object) -> CallEngine:
    return CallEngine(
        CallRecorder(journal, "s", "test"),
        count=lambda m: float(len(m.readable.text) + 4 * len(m.readable.tool_calls) + 1),
        summary_message=lambda text: _msg(_user(text)),
        **options,  # type: ignore[arg-type]
    )


def _conversation(turns: int) -> list[Readable]:
    out: list[Readable] = []
    for n in range(turns):
        out += [
            _user(f"question {n} " + "q" * 20),
            Readable(role="assistant", tool_calls=(CallTool(id=f"c{n}", name="look"),)),
            Readable(role="tool", text="r" * 30, tool_call_id=f"c{n}"),
            Readable(role="assistant", text=f"answer {n}"),
        ]
    return out


async def test_engine_records_requests_and_compactions_that_verify(sqlite_path: str) -> None:
    async with cf.open_journal(f"sqlite:///{sqlite_path}") as journal:
        engine = _engine(journal, budget=120, compact_at=200, keep_tokens=60, summarize=_summarize)
        history: list[Message] = []
        for turn in _conversation(8):
            history.append(_msg(turn))
            if turn.role == "assistant":  # the model is called after a question or results
                continue
            prepared = await engine.prepare(history)
            position = await engine.record(prepared, model="m", options={"tools": []})
            assert position is not None
            assert split_pairs([m.readable for m in prepared.messages]) == 0
        calls = await read_calls(journal, "s")
        assert calls.compactions, "the history grew past compact_at: a compaction is recorded"
        assert verify_calls(calls) == []
        # Every summarized original is still on the stream, readable.
        for done in calls.compactions.values():
            assert all(d in calls.messages for d in done.summarized)
        # A request rebuilds to its digest.
        position, sent = max(calls.requests.items())
        assert sha256_hex(call_body(calls, position)) == sent.sha256
        assert sent.view is not None and sent.view.summary in sent.messages


async def test_verify_names_a_request_whose_messages_are_not_its_view(sqlite_path: str) -> None:
    async with cf.open_journal(f"sqlite:///{sqlite_path}") as journal:
        engine = _engine(journal, budget=60)
        history = [_msg(m) for m in _conversation(3)[:-1]]
        prepared = await engine.prepare(history)
        await engine.record(prepared, model="m", options={})
        calls = await read_calls(journal, "s")
        assert verify_calls(calls) == []
        ((position, sent),) = calls.requests.items()
        assert sent.view is not None
        # The same record, sending one message more than its view chooses.
        forged = sent.model_copy(update={"messages": (sent.view.history[0], *sent.messages)})
        await journal.append("s", forged)
        calls = await read_calls(journal, "s")
        problems = verify_calls(calls)
        assert [p.problem for p in problems if p.position != position] == [
            "the request rebuilt from the journal does not have its recorded digest",
            "its messages are not the ones its view chooses",
        ]
        with pytest.raises(InvalidInputError, match="no recorded framework request"):
            call_body(calls, 1)


async def test_a_message_is_stored_once_per_stream(sqlite_path: str) -> None:
    async with cf.open_journal(f"sqlite:///{sqlite_path}") as journal:
        engine = _engine(journal)
        history = [_msg(_user("hi"))]
        for n in range(3):
            await engine.record(await engine.prepare(history), model="m", options={})
            history += [_msg(Readable(role="assistant", text=f"a{n}")), _msg(_user(f"u{n}"))]
        calls = await read_calls(journal, "s")
        assert len(calls.messages) == len(history) - 2
        assert all(message_digest(m.message) == d for d, (_, m) in calls.messages.items())
        assert all(isinstance(r, CallRequested) for r in calls.requests.values())


async def _stored_requests(journal: cf.Journal) -> list[tuple[int, CallRequested]]:
    """The requests of stream "s" as stored (not made whole)."""
    return [
        (e.position, cast(CallRequested, e.decode(CallRequested)))
        async for e in journal.read_all("s", types=[CallRequested])
    ]


async def test_a_request_is_stored_as_what_it_adds_and_read_back_whole(sqlite_path: str) -> None:
    async with cf.open_journal(f"sqlite:///{sqlite_path}") as journal:
        engine = _engine(journal, budget=150, compact_at=400, keep_tokens=80, summarize=_summarize)
        history: list[Message] = []
        recorded: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        for turn in _conversation(30):
            history.append(_msg(turn))
            if turn.role == "assistant":
                continue
            prepared = await engine.prepare(history)
            position = await engine.record(prepared, model="m", options={})
            assert position is not None
            sent = tuple(message_digest(m.json) for m in prepared.messages)
            recorded[position] = (prepared.view.history, sent)
        stored: dict[int, CallRequested] = dict(await _stored_requests(journal))
        # Each request after the first names only the history messages its call added,
        # and lists no message its view chooses anyway: the record grows with the
        # conversation, not with its square.
        _first, *later = sorted(stored)
        views = [stored[p].view for p in later]
        assert all(v is not None and v.extends is not None and len(v.history) <= 2 for v in views)
        assert all(stored[p].messages == () for p in later)
        calls = await read_calls(journal, "s")
        assert {p: (r.view.history, r.messages) for p, r in calls.requests.items() if r.view} == (
            recorded
        )
        assert verify_calls(calls) == []


async def test_a_request_after_another_history_is_stored_whole(sqlite_path: str) -> None:
    async with cf.open_journal(f"sqlite:///{sqlite_path}") as journal:
        engine = _engine(journal, budget=1000)
        ours = [_msg(_user("one"))]
        theirs = [_msg(_user("another thread"))]
        await engine.record(await engine.prepare(ours), model="m", options={})
        await engine.record(await engine.prepare(theirs), model="m", options={})
        ours += [_msg(Readable(role="assistant", text="a")), _msg(_user("two"))]
        last = await engine.record(await engine.prepare(ours), model="m", options={})
        assert last is not None
        view = dict(await _stored_requests(journal))[last].view
        assert view is not None and view.extends is None and len(view.history) == 3
        assert verify_calls(await read_calls(journal, "s")) == []


async def test_a_view_continuing_no_request_is_a_problem(sqlite_path: str) -> None:
    async with cf.open_journal(f"sqlite:///{sqlite_path}") as journal:
        engine = _engine(journal, budget=1000)
        history = [_msg(_user("one"))]
        first = await engine.record(await engine.prepare(history), model="m", options={})
        history += [_msg(Readable(role="assistant", text="a")), _msg(_user("two"))]
        second = await engine.record(await engine.prepare(history), model="m", options={})
        calls = await read_calls(journal, "s")
        assert verify_calls(calls) == [] and first is not None and second is not None
        stored = (await _stored_requests(journal))[-1][1]
        assert stored.view is not None and stored.view.extends == first
        forged = stored.model_copy(update={"view": stored.view.model_copy(update={"extends": 1})})
        await journal.append("s", forged)
        problems = verify_calls(await read_calls(journal, "s"))
        assert [p.problem for p in problems] == [
            "its view continues the history of @1, which holds no recorded request with a view"
        ]
