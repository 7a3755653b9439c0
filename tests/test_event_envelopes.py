"""Envelopes and stored events are records of named fields in one order: an envelope made
from a stored event equals the one built field by field (meta, equality, hash, pickling,
repr), neither equals a plain tuple, and ``StoredEvent.from_rows`` equals ``from_row`` per
row."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

import contextfold as cf
from contextfold.events import EventMeta, StoredEvent


class Pinged(cf.Event, type="envelopes/pinged"):
    n: int


_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x1f"))
_META = st.builds(
    EventMeta,
    _TEXT,
    _TEXT,
    st.none() | _TEXT,
    st.none() | _TEXT,
    st.none() | _TEXT,
    st.lists(_TEXT.filter(bool), max_size=3).map(tuple),
)


@given(meta=_META, position=st.integers(1, 10**9), global_position=st.integers(1, 10**12))
def test_an_envelope_of_a_stored_event_equals_the_one_built_field_by_field(
    meta: EventMeta, position: int, global_position: int
) -> None:
    payload = Pinged(n=position)
    stored = StoredEvent(
        "ns", "chat", position, global_position, Pinged.event_type, payload.to_json(), meta
    )
    fast = cf.Envelope.of(stored, payload)
    built = cf.Envelope(payload, meta, "chat", position, global_position, Pinged.event_type)
    assert fast == built
    assert not fast != built  # noqa: SIM202 - __ne__ is its own method
    assert hash(fast) == hash(built)
    assert fast.meta == meta == built.meta
    assert (fast.payload, fast.stream, fast.position, fast.global_position, fast.type) == (
        payload,
        "chat",
        position,
        global_position,
        Pinged.event_type,
    )
    assert fast.cursor == built.cursor == str(global_position)
    assert repr(fast) == repr(built)
    assert pickle.loads(pickle.dumps(fast)) == built
    assert fast != cf.Envelope(payload, meta, "other", position, global_position, "x")


def test_an_envelope_is_read_only() -> None:
    envelope = cf.Envelope(Pinged(n=1), EventMeta("e", "t"), "s", 1, 1, Pinged.event_type)
    with pytest.raises(AttributeError):
        envelope.position = 2  # type: ignore[misc]
    fields = (Pinged(n=1), EventMeta("e", "t"), "s", 1, 1, Pinged.event_type)
    assert envelope != fields and fields != envelope


@given(meta=_META, position=st.integers(1, 10**9), global_position=st.integers(1, 10**12))
def test_a_stored_event_is_a_record_of_its_fields_in_one_order(
    meta: EventMeta, position: int, global_position: int
) -> None:
    fields = ("ns", "chat", position, global_position, Pinged.event_type, b'{"n":1}', meta)
    stored = StoredEvent(*fields)
    named = StoredEvent(
        namespace="ns",
        stream="chat",
        position=position,
        global_position=global_position,
        type=Pinged.event_type,
        data=b'{"n":1}',
        meta=meta,
    )
    assert stored == named and hash(stored) == hash(named)
    assert stored._asdict() == dict(zip(StoredEvent._fields, fields, strict=True))
    assert stored.cursor == str(global_position) and stored.payload == {"n": 1}
    assert pickle.loads(pickle.dumps(stored)) == stored
    assert stored != fields and fields != stored
    with pytest.raises(AttributeError):
        stored.position = 2  # type: ignore[misc]


@given(
    rows=st.lists(
        st.tuples(
            st.integers(1, 10**9),
            st.integers(1, 10**6),
            _TEXT,
            st.binary(max_size=20),
            _TEXT,
            _TEXT,
            st.none() | _TEXT,
            st.none() | _TEXT,
            st.none() | _TEXT,
            st.one_of(_TEXT, st.lists(_TEXT.filter(bool), max_size=3).map(tuple)),
        ),
        max_size=10,
    )
)
def test_from_rows_equals_from_row_per_row(rows: list[tuple[object, ...]]) -> None:
    many = StoredEvent.from_rows("ns", "chat", iter(rows))
    assert isinstance(many, tuple)
    assert many == tuple(StoredEvent.from_row("ns", "chat", row) for row in rows)
    for event, row in zip(many, rows, strict=True):
        assert type(event) is StoredEvent
        assert (event.namespace, event.stream, event.global_position, event.position) == (
            "ns",
            "chat",
            row[0],
            row[1],
        )
        assert event.meta == StoredEvent.from_row("ns", "chat", row).meta
