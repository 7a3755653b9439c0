"""A message answering several tool calls at once (a pydantic-ai request, an ADK content):
each call it answers holds it to the message making the call."""

from __future__ import annotations

from contextfold.context.calls import CallTool, Readable, pair_links, split_pairs, view_start


def _history() -> list[Readable]:
    calls = (CallTool(id="a", name="t"), CallTool(id="b", name="t"))
    return [
        Readable(role="user", text="go"),
        Readable(role="assistant", tool_calls=calls),
        Readable(role="tool", text="both", tool_call_id="a", also_answers=("b",)),
        Readable(role="assistant", text="done"),
        Readable(role="user", text="again"),
    ]


def test_every_call_a_message_answers_links_it() -> None:
    history = _history()
    assert history[2].answered() == ("a", "b")
    assert Readable(role="tool", also_answers=("c",)).answered() == ("c",)
    assert pair_links(history) == [0, 1, 1, 3, 4]
    assert split_pairs(history) == 0
    assert split_pairs(history[:2]) == 2  # both calls unanswered
    assert split_pairs(history[2:]) == 2  # both results without their call


def test_a_view_never_starts_between_the_calls_and_their_results() -> None:
    history = _history()
    tokens = [1.0, 1.0, 50.0, 1.0, 1.0]
    start = view_start(history, tokens, budget=10, keep=1)
    assert start == 3
    assert view_start(history, tokens, budget=100, keep=1) == 0


def test_a_view_of_user_starts_opens_on_a_user_message() -> None:
    history = [
        *_history(),
        Readable(role="assistant", tool_calls=(CallTool(id="c", name="t"),)),
        Readable(role="tool", text="r", tool_call_id="c"),
        Readable(role="assistant", text="late"),
    ]
    tokens = [1.0] * len(history)
    assert view_start(history, tokens, budget=3, keep=1) == 5  # on the assistant's call
    start = view_start(history, tokens, budget=3, keep=1, starts="user")
    assert start == 4 and history[start].role == "user"  # the newest turn, whatever it costs
    assert view_start(history, tokens, budget=100, keep=1, starts="user") == 0
