"""A step's usage in the transcript is the wire model's Usage, and rows written before it
(with the transcript's old field names) still read with the same counts."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from contextfold.transcript import StepFinishPart
from contextfold.transcript.parts import decode_part
from contextfold.wire import Usage

ROW = {"id": "s2", "session": "chat", "message_id": "m1", "kind": "step-finish", "time": "t2"}


def test_a_row_with_the_old_usage_names_reads_with_the_same_counts() -> None:
    old = {
        **ROW,
        "reason": "stop",
        "usage": {
            "input": 1200,
            "output": 340,
            "reasoning": 0,
            "cache_read": 800,
            "cache_write": 0,
        },
        "cost": 0.0,
    }
    part = decode_part(json.dumps(old))
    assert isinstance(part, StepFinishPart)
    assert part.usage == Usage(
        input_tokens=1200,
        output_tokens=340,
        cached_input_tokens=800,
        cache_write_tokens=0,
        reasoning_tokens=0,
    )
    # Written again, the row carries the wire names only.
    assert set(json.loads(part.model_dump_json())["usage"]) == {
        "input_tokens",
        "output_tokens",
        "cached_input_tokens",
        "cache_write_tokens",
        "reasoning_tokens",
    }


_optional = st.none() | st.integers(min_value=0, max_value=10**9)


@given(
    st.builds(
        Usage,
        input_tokens=st.integers(min_value=0, max_value=10**9),
        output_tokens=st.integers(min_value=0, max_value=10**9),
        cached_input_tokens=_optional,
        cache_write_tokens=_optional,
        reasoning_tokens=_optional,
    )
)
def test_a_step_keeps_its_usage_through_the_row(usage: Usage) -> None:
    part = StepFinishPart(**ROW, reason="stop", usage=usage)
    assert decode_part(part.model_dump_json()) == part
