"""Picking the request to compact from a batch of usage reports: the newest over its
model's threshold above the cutoff, the same as asking ``needs_compaction`` of each, with
each model's window looked up once per batch."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.context import LlmResponse, needs_compaction, pick_compaction
from contextfold.context import compaction as compaction_module
from contextfold.wire import Usage

MODELS = ("gpt-4o", "gpt-4", "claude-sonnet-4", "my-local-model")

responses = st.builds(
    LlmResponse,
    request_offset=st.integers(min_value=1, max_value=60),
    model=st.sampled_from(MODELS),
    usage=st.one_of(
        st.none(), st.builds(Usage, input_tokens=st.integers(min_value=0, max_value=200_000))
    ),
)


@given(
    batch=st.lists(responses, max_size=30),
    threshold=st.sampled_from([0.25, 0.5, 1.0]),
    cutoff=st.integers(min_value=0, max_value=60),
    window=st.one_of(st.none(), st.integers(min_value=1, max_value=300_000)),
)
def test_the_pick_is_the_newest_response_needs_compaction_accepts(
    batch: list[LlmResponse], threshold: float, cutoff: int, window: int | None
) -> None:
    over = [
        r
        for r in batch
        if r.usage is not None
        and r.request_offset > cutoff
        and needs_compaction(r.usage.input_tokens, r.model, threshold=threshold, window=window)
    ]
    expected = max(over, key=lambda r: r.request_offset, default=None)
    picked = pick_compaction(batch, threshold=threshold, compacted_through=cutoff, window=window)
    assert picked is expected


def test_each_models_window_is_looked_up_once_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up: list[str] = []
    known = compaction_module.context_window

    def counting(model: str, *args: object) -> int:
        looked_up.append(model)
        return known(model)

    monkeypatch.setattr(compaction_module, "context_window", counting)
    batch = [
        LlmResponse(request_offset=n, model=MODELS[n % 2], usage=Usage(input_tokens=n * 1_000))
        for n in range(1, 201)
    ]
    picked = pick_compaction(batch)
    assert picked is not None and picked.request_offset == 200
    assert sorted(looked_up) == sorted(MODELS[:2])
