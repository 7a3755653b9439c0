"""The strict JSON parser's refusals belong to the error tree: a PayloadError (so a
ValueError) naming the place at fault, reachable from the top package."""

from __future__ import annotations

import pytest

import contextfold as cf
from contextfold import errors
from contextfold.server import strict_json


def test_the_strict_json_error_is_a_payload_error_of_the_tree() -> None:
    assert cf.StrictJsonError is errors.StrictJsonError
    assert issubclass(cf.StrictJsonError, cf.PayloadError)
    assert issubclass(cf.StrictJsonError, ValueError)
    assert "StrictJsonError" not in strict_json.__all__  # defined once, in the tree


@pytest.mark.parametrize(
    ("body", "place", "what"),
    [
        (b'{"events": [{"payload": {"n": 18446744073709551616}}]}', "events[0].payload.n", "bits"),
        (b'{"a": {"b": 1, "b": 2}}', "a.b", "more than once"),
        (b"-9223372036854775809", "the body", "64 bits"),
    ],
)
def test_a_refusal_is_caught_as_a_payload_error_naming_the_place(
    body: bytes, place: str, what: str
) -> None:
    with pytest.raises(cf.PayloadError) as caught:
        strict_json.loads(body)
    assert isinstance(caught.value, cf.StrictJsonError)
    assert str(caught.value).startswith(f"{place}: ") and what in str(caught.value)


def test_nesting_too_deep_to_check_is_a_payload_error() -> None:
    deep = b"[" * 1000 + b"18446744073709551616" + b"]" * 1000
    with pytest.raises(cf.PayloadError, match="nests too deeply"):
        strict_json.loads(deep)
