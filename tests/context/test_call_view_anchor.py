"""A budgeted view that keeps its previous start while it fits (a stable prompt-cache
prefix) and trims below the budget when it does not: still pair-safe, within the budget
unless kept, holding the newest units; equal to the plain view without an anchor; and a
growing conversation trimmed this way moves its start far less often."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.context.call_records import CallRecorder, Message, read_calls, verify_calls
from contextfold.context.calls import CallTool, Readable, _starts, split_pairs, view_start
from contextfold.integrations._call_engine import CallEngine, Prepared
from tests.context.test_calls import histories


def _sent(history: Sequence[Readable], start: int) -> list[Readable]:
    return [m for m in history[:start] if m.role == "system"] + list(history[start:])


def _window(tokens: Sequence[float], history: Sequence[Readable], start: int) -> float:
    pinned = sum(t for t, m in zip(tokens, history, strict=True) if m.role == "system")
    rest = sum(
        t for t, m in zip(tokens[start:], history[start:], strict=True) if m.role != "system"
    )
    return pinned + rest


@settings(max_examples=400, deadline=None)
@given(
    histories(),
    st.lists(st.integers(0, 50), min_size=64, max_size=64),
    st.integers(1, 400),
    st.integers(0, 3),
    st.integers(0, 40),
    st.sampled_from([None, 0.5, 0.8, 1.0]),
)
def test_an_anchored_view_is_pair_safe_and_keeps_its_anchor_while_it_fits(
    history: list[Readable],
    costs: list[int],
    budget: int,
    keep: int,
    anchor: int,
    trim_to: float | None,
) -> None:
    tokens = [float(costs[i % len(costs)]) for i in range(len(history))]
    plain = view_start(history, tokens, budget=budget, keep=keep)
    assert view_start(history, tokens, budget=budget, keep=keep, anchor=None) == plain
    start = view_start(history, tokens, budget=budget, keep=keep, anchor=anchor, trim_to=trim_to)
    assert split_pairs(_sent(history, start)) == 0
    safe = list(_starts(history, 0))  # newest first
    if not safe:
        return
    newest_kept = safe[min(keep, len(safe)) - 1] if keep else len(history)
    assert start <= newest_kept or start == len(history)  # the newest `keep` units stay
    fits = _window(tokens, history, anchor) <= budget if anchor < len(history) else False
    if anchor in safe and anchor <= newest_kept and fits:
        assert start == anchor
    elif start not in safe[:keep] and start < len(history):
        target = budget if trim_to is None else budget * trim_to
        assert _window(tokens, history, start) <= target


def _turns(n: int) -> list[Readable]:
    out: list[Readable] = []
    for turn in range(n):
        out += [
            Readable(role="user", text=f"q{turn}"),
            Readable(role="assistant", tool_calls=(CallTool(id=f"c{turn}", name="t"),)),
            Readable(role="tool", text="r" * 40, tool_call_id=f"c{turn}"),
            Readable(role="assistant", text=f"a{turn}"),
        ]
    return out


async def test_a_growing_conversation_keeps_its_prefix_between_trims() -> None:
    conversation = [Message(r.model_dump(mode="json"), r) for r in _turns(60)]
    async with cf.open_journal("memory://") as journal:
        starts: dict[float | None, list[int]] = {}
        for trim_to in (None, 0.6):
            stream = f"s{trim_to}"
            engine = CallEngine(
                CallRecorder(journal, stream, "test"),
                count=lambda m: float(len(m.readable.text) + 5),
                summary_message=lambda text: Message({"text": text}, Readable(role="user")),
                budget=400,
                trim_to=trim_to,
            )
            previous: Prepared | None = None
            seen = starts.setdefault(trim_to, [])
            for end in range(1, len(conversation) + 1):
                if conversation[end - 1].readable.role == "assistant":
                    continue  # the model is called after a question or a result
                previous = await engine.prepare(conversation[:end], previous=previous)
                await engine.record(previous, model="m", options={})
                seen.append(previous.view.start)
            assert verify_calls(await read_calls(journal, stream)) == []
    moved = {key: sum(a != b for a, b in itertools.pairwise(seen)) for key, seen in starts.items()}
    assert moved[0.6] * 4 < moved[None]
