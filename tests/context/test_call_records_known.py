"""The set of message digests a stream has recorded (the recorder's fold state): it answers
as a plain set of everything added, across its merges."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold.context.call_records import _Known


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(alphabet="abcdef", min_size=1, max_size=3), max_size=300))
def test_known_digests_answer_as_a_set(digests: list[str]) -> None:
    known = _Known(frozenset(), ())
    added: set[str] = set()
    for digest in digests:
        known = known.add(digest)
        added.add(digest)
        assert digest in known
    for probe in {*digests, "zz", "ab", "f"}:
        assert (probe in known) == (probe in added)
