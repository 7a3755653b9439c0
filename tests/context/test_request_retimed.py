"""A request retimed (``request.retimed``) equals the request built at the new time from the
same state and header, for any history; one without a tail cannot be retimed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold.context import build_request
from contextfold.context.request import retimed
from contextfold.errors import RenderError
from tests.context.test_request_incremental import HEADER, _Log, ops

times = st.sampled_from(
    ["2026-01-01T00:00:00+00:00", "2026-01-01T00:00:00.000001+00:00", "now", "2027-12-31"]
)


@settings(max_examples=200, deadline=None)
@given(played=ops, before=times, after=times)
def test_a_retimed_request_equals_the_request_built_at_that_time(
    played: list[tuple[str, str | None, str, str]], before: str, after: str
) -> None:
    log = _Log()
    for op in played:
        log.play(op)
    state = log.state()
    try:
        earlier = build_request(state, HEADER, timestamp=before)
    except RenderError:
        return  # what no time can build (an unanswered verified call) is not retimed
    assert retimed(earlier, after) == build_request(state, HEADER, timestamp=after)


@given(played=ops)
def test_a_request_without_a_tail_is_not_retimed(
    played: list[tuple[str, str | None, str, str]],
) -> None:
    log = _Log()
    for op in played:
        if op[0] != "request":  # no request: no time to put in a tail
            log.play(op)
    state = log.state()
    assert state.request_time is None
    try:
        untimed = build_request(state, HEADER)
    except RenderError:
        return
    with pytest.raises(RenderError, match="without a tail"):
        retimed(untimed, "now")
