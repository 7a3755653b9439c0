"""Canonical JSON's one-pass check agrees with the path-naming walk: whatever it passes the
walk passes, and plain finite JSON always passes it (so an append walks a payload once)."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold import canonical
from contextfold.errors import PayloadError


class Text(str):
    """A str subclass: the walk accepts it, the one-pass check leaves it to the walk."""


_plain = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.lists(inner, max_size=3).map(tuple)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)
_odd = st.sampled_from(
    [
        math.nan,
        math.inf,
        -math.inf,
        2**64,
        -(2**63) - 1,
        object(),
        Text("t"),
        {1: "x"},
        {Text("k"): 1},
    ]
)
_any = st.recursive(
    _plain | _odd,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


def _walk_passes(value: Any) -> bool:
    try:
        canonical.check_json_value(value)
    except PayloadError:
        return False
    return True


@given(_plain)
def test_plain_finite_json_passes_in_one_pass(value: Any) -> None:
    assert canonical.is_plain_json(value)
    assert _walk_passes(value)


@given(_any)
def test_what_the_one_pass_check_passes_the_walk_passes(value: Any) -> None:
    if canonical.is_plain_json(value):
        assert _walk_passes(value)
    if not _walk_passes(value):
        assert not canonical.is_plain_json(value)


@pytest.mark.parametrize("depth", [249, 250, 251, 260])
def test_nesting_at_the_depth_limit_is_left_to_the_walk(depth: int) -> None:
    value: Any = None
    for _ in range(depth):
        value = [value]
    assert canonical.is_plain_json(value) == _walk_passes(value) == (depth <= 250)


@given(_any)
def test_encode_checked_refuses_what_orjson_cannot_write_and_nulls_the_walk_refuses(
    value: Any,
) -> None:
    try:
        written: bytes | None = orjson.dumps(value)
    except TypeError:
        written = None
    refused = written is None or (b"null" in written and not _walk_passes(value))
    try:
        data = canonical.encode_checked(value, where="payload")
    except PayloadError:
        assert refused
        return
    assert not refused and data == written
