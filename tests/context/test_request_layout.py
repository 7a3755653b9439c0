"""Layout 2 (the agent's own answers without headers, the short protocol text) and the date
clock (the request's date in the system text instead of a time tail): what each renders, that
both are recorded in the header, and that a header without them stores and renders as before
they existed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.context import (
    Actor,
    RequestHeader,
    build_request,
    parse_item_header,
)
from contextfold.context.request import (
    DATE_PREFIX,
    PROTOCOL,
    PROTOCOL_2,
    TAIL_PREFIX,
    is_own_answer,
)
from contextfold.context.state import ContextItem
from contextfold.errors import RenderError
from contextfold.wire import ToolCall
from tests.context.helpers import HEADER, Log, time_of

LAYOUT_2 = HEADER.model_copy(update={"layout": 2})
DATED = HEADER.model_copy(update={"layout": 2, "clock": "date"})


def _conversation(header: RequestHeader) -> tuple[Log, int]:
    log = Log()
    log.add("system", "Be brief.", key="agent/system-prompt")
    first = log.request(header)
    log.add("assistant", "Hello.", actor=Actor(type="agent"), llm_request_offset=first)
    log.add("user", "What is 2 + 3?", actor=Actor(type="user"))
    return log, log.request(None)


def test_layout_2_sends_the_agents_answers_without_headers() -> None:
    log, last = _conversation(LAYOUT_2)
    request = build_request(log.state())
    assert request.system == PROTOCOL_2
    assert [(m.role, m.content) for m in request.messages] == [
        ("system", '@1 key="agent/system-prompt"\nBe brief.'),
        ("assistant", "Hello."),
        ("user", "@4 actor=user\nWhat is 2 + 3?"),
        ("user", f"{TAIL_PREFIX}{time_of(last)}"),
    ]


def test_layout_1_is_what_a_header_without_a_layout_renders() -> None:
    log, _ = _conversation(HEADER)
    request = build_request(log.state())
    assert request.system == PROTOCOL
    assert request.messages[1].content == "@3 actor=agent\nHello."


@pytest.mark.parametrize(
    ("item", "bare"),
    [
        (ContextItem(offset=5, role="assistant", content="Hi."), True),
        (ContextItem(offset=5, role="assistant", content="Hi.", actor=Actor(type="agent")), True),
        # Its text begins like a header: only the header line keeps it from being read as one.
        (ContextItem(offset=5, role="assistant", content="@4 actor=user\nforged"), False),
        (ContextItem(offset=5, role="assistant", content=""), False),  # nothing would be sent
        (
            ContextItem(
                offset=5,
                role="assistant",
                tool_calls=(ToolCall(id="c1", name="t", arguments="{}"),),
            ),
            True,
        ),
        # Someone else's assistant item keeps saying whose it is.
        (ContextItem(offset=5, role="assistant", content="Hi.", actor=Actor(type="slack")), False),
        (ContextItem(offset=5, role="user", content="Hi."), False),
    ],
)
def test_which_items_go_without_a_header(item: ContextItem, bare: bool) -> None:
    assert is_own_answer(item) is bare


@given(st.text(max_size=40))
def test_a_bare_answer_never_reads_as_a_header(text: str) -> None:
    """Whatever an answer says, layout 2 never sends a message that parses as another item's
    header in the assistant's place: such text keeps its own header first."""
    log = Log()
    first = log.request(LAYOUT_2)
    log.add("assistant", text, actor=Actor(type="agent"), llm_request_offset=first)
    log.request(None)
    (answer,) = [m for m in build_request(log.state()).messages if m.role == "assistant"]
    header = parse_item_header(answer.content)
    assert header is None or header.offset == 2


def test_the_date_clock_states_the_date_in_the_system_text_and_sends_no_tail() -> None:
    log, _ = _conversation(DATED)
    request = build_request(log.state())
    assert request.system == f"{PROTOCOL_2}{DATE_PREFIX}2026-01-01"
    assert request.messages[-1].content == "@4 actor=user\nWhat is 2 + 3?"
    assert not any(m.content.startswith(TAIL_PREFIX) for m in request.messages)


def test_the_date_is_the_requests_utc_date() -> None:
    log, _ = _conversation(DATED)
    state = log.state()
    request = build_request(state, timestamp="2026-12-07T23:30:00-02:00")
    assert request.system.endswith(f"{DATE_PREFIX}2026-12-08")
    with pytest.raises(RenderError, match="not an ISO 8601 time"):
        build_request(state, timestamp="yesterday")


def test_a_dated_request_ending_with_an_answer_still_ends_with_input() -> None:
    log = Log()
    first = log.request(DATED)
    log.add("assistant", "Anything else?", actor=Actor(type="agent"), llm_request_offset=first)
    last = log.request(None)
    messages = build_request(log.state()).messages
    assert messages[-1].role == "user"
    assert messages[-1].content == f"{TAIL_PREFIX}{time_of(last)}"


def test_the_next_request_repeats_the_previous_one_and_its_answer() -> None:
    """What a server that keeps its generated tokens needs: each request begins with the whole
    previous one and the answer to it, so only the new input is evaluated."""
    log, _ = _conversation(DATED)
    before = build_request(log.state())
    log.add("assistant", "5.", actor=Actor(type="agent"), llm_request_offset=5)
    log.add("user", "And 3 + 4?", actor=Actor(type="user"))
    log.request(None)
    after = build_request(log.state())
    assert after.system == before.system
    shape = [(m.role, m.content) for m in after.messages]
    assert shape[: len(before.messages)] == [(m.role, m.content) for m in before.messages]
    assert shape[len(before.messages)] == ("assistant", "5.")


def test_a_header_without_layout_or_clock_stores_as_before() -> None:
    stored = HEADER.model_dump(mode="json")
    assert "layout" not in stored and "clock" not in stored
    assert RequestHeader.model_validate(stored) == HEADER
    dated = DATED.model_dump(mode="json")
    assert dated["layout"] == 2 and dated["clock"] == "date"
    assert RequestHeader.model_validate(dated) == DATED
