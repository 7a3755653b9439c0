"""The scheduler keeps only the usage reports catch-up compaction may still pick: for any
responses, threshold, window and cutoff, the pick among the kept reports is the pick among
every report the agent received; and a long session without compaction keeps few."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from contextfold.context import LlmResponse, pick_compaction
from contextfold.events import Envelope, EventMeta
from contextfold.runtime.scheduling import AGENT, Scheduler, SchedulerState
from contextfold.wire import Usage

# (model, input tokens, a second report of the same request)
responses = st.lists(
    st.tuples(
        st.sampled_from(["gpt-4o", "claude-sonnet-4", "local"]),
        # About the thresholds of these models' windows, and of the windows given.
        st.sampled_from([0, 3_000, 5_000, 60_000, 70_000, 100_000, 120_000, 150_000, 190_000]),
        st.booleans(),
    ),
    max_size=12,
)


def _fold(made: list[tuple[str, int, bool]]) -> tuple[SchedulerState, list[LlmResponse]]:
    """Each response answers the latest request, as the agent records them."""
    state = Scheduler.initial_state()
    received: list[LlmResponse] = []
    meta = EventMeta("e", "2026-12-07T00:00:00+00:00", actor=AGENT)
    position = 0
    for model, tokens, again in made:
        position += 2
        request = position - 1
        state = state.model_copy(update={"last_request": request, "answered": False})
        response = LlmResponse(
            request_offset=request, model=model, usage=Usage(input_tokens=tokens)
        )
        if again and received:  # a second report of the previous request replaces it
            request = received[-1].request_offset
            state = state.model_copy(update={"last_request": request})
            response = response.model_copy(update={"request_offset": request})
            received = [r for r in received if r.request_offset != request]
        received.append(response)
        envelope = Envelope(response, meta, "s", position, position, LlmResponse.event_type)
        state = Scheduler.apply(state, envelope)
    return state, received


@given(
    made=responses,
    threshold=st.sampled_from([0.1, 0.5, 0.75, 0.9]),
    window=st.sampled_from([None, 8_000, 128_000]),
    cutoff=st.integers(min_value=0, max_value=60),
)
# An older report over the threshold, a newer one of the same model under it; then an older
# one over its model's threshold, a newer one with more tokens under another model's.
@example(
    made=[("gpt-4o", 5_000, False), ("gpt-4o", 3_000, False)], threshold=0.5, window=8_000, cutoff=0
)
@example(
    made=[("gpt-4o", 100_000, False), ("claude-sonnet-4", 120_000, False)],
    threshold=0.75,
    window=None,
    cutoff=0,
)
def test_the_pick_among_kept_reports_is_the_pick_among_every_report(
    made: list[tuple[str, int, bool]], threshold: float, window: int | None, cutoff: int
) -> None:
    state, received = _fold(made)
    every = [r.model_copy(update={"text": "", "tool_calls": ()}) for r in received]
    kept, all_of_them = (
        pick_compaction(reports, threshold=threshold, window=window, compacted_through=cutoff)
        for reports in (state.reports, every)
    )
    assert kept == all_of_them


def test_growing_reports_of_one_model_keep_one() -> None:
    state, received = _fold([("gpt-4o", 1_000 + 10 * n, False) for n in range(500)])
    assert len(received) == 500 and len(state.reports) == 1
    assert state.reports[0].request_offset == received[-1].request_offset
