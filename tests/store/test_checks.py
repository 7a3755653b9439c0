"""The journal's argument checks every backend relies on, and the stores' cursor parsing, as
properties over arbitrary input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.errors import InvalidInputError, InvalidStreamNameError
from contextfold.journal.encode import check_label, check_limit, check_stream, check_text
from contextfold.store.base import MAX_LIMIT, parse_cursor

# Every code point, lone surrogates included (hypothesis leaves them out by default).
any_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF, exclude_categories=()))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@given(any_text)
def test_check_text_refuses_exactly_what_utf8_cannot_store(text: str) -> None:
    if _utf8(text):
        assert check_text("field", text) == text
    else:
        with pytest.raises(InvalidInputError) as info:
            check_text("field", text)
        message = str(info.value)
        assert message.startswith("field ") and "lone surrogate" in message
        assert _utf8(message)  # the message itself is storable and printable


@given(any_text)
def test_a_stream_name_that_passes_is_storable_text(name: str) -> None:
    try:
        assert check_stream(name) == name
    except InvalidStreamNameError as exc:
        assert str(exc).startswith("stream name") and _utf8(str(exc))
    else:
        assert _utf8(name)


@given(any_text)
def test_a_label_that_passes_is_storable_text_without_nul(label: str) -> None:
    try:
        assert check_label("actor", label) == label
    except InvalidInputError as exc:
        assert str(exc).startswith("actor") and _utf8(str(exc))
    else:
        assert _utf8(label) and "\x00" not in label


@given(any_text)
def test_parse_cursor_never_fails_and_stays_within_64_bits(cursor: str) -> None:
    position = parse_cursor(cursor)
    assert position is None or 0 <= position <= 2**63 - 1


@given(st.integers(min_value=0, max_value=2**63 - 1))
def test_every_storable_position_round_trips_as_a_cursor(position: int) -> None:
    assert parse_cursor(str(position)) == position


@given(st.integers(min_value=2**63, max_value=10**19 - 1))
def test_a_19_digit_cursor_past_64_bits_is_unknown(position: int) -> None:
    assert parse_cursor(str(position)) is None


@given(st.one_of(st.integers(), st.booleans(), st.floats(), st.text(max_size=3), st.none()))
def test_check_limit_takes_exactly_the_ints_within_its_bounds(value: object) -> None:
    good = type(value) is int and 1 <= value <= MAX_LIMIT
    if good:
        assert check_limit(value) == value
    else:
        with pytest.raises(InvalidInputError, match=f"limit must be an int from 1 to {MAX_LIMIT}"):
            check_limit(value)


@pytest.mark.parametrize("url", ["memory://", "sqlite:///:memory:"])
def test_a_read_after_any_cursor_resets_or_continues_never_fails(url: str) -> None:
    with cf.open_journal_sync(url) as journal:
        known = [journal.append("s", cf.RawEvent("e", {"i": i})).cursor for i in range(3)]

        @settings(max_examples=200, deadline=None)
        @given(st.one_of(any_text, st.sampled_from(known), st.integers().map(str)))
        def read_after(cursor: str) -> None:
            page = journal.read("s", after=cursor)
            position = parse_cursor(cursor)  # "0" is the start, "01" the cursor "1"
            if position is not None and (position == 0 or str(position) in known):
                assert not page.reset
                assert [e.cursor for e in page.events] == [c for c in known if int(c) > position]
            else:
                assert page.reset and [e.cursor for e in page.events] == known

        read_after()
