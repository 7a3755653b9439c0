"""Envelopes and stored events are records of named fields in one order (a stored event's
is a store's): an envelope made from a stored event equals the one built field by field
(meta, equality, hash, pickling, repr), neither equals a plain tuple, and
``StoredEvent.from_rows`` equals ``from_row`` per row."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import contextfold as cf
from contextfold.events import EventMeta, NewEvent, StoredEvent


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
    new = NewEvent(Pinged.event_type, payload.to_json(), meta)
    stored = StoredEvent.appended("ns", "chat", global_position, position, new)
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
def test_a_stored_event_is_a_record_of_its_fields_in_the_stored_order(
    meta: EventMeta, position: int, global_position: int
) -> None:
    new = NewEvent(Pinged.event_type, b'{"n":1}', meta)
    stored = StoredEvent.appended("ns", "chat", global_position, position, new)
    fields = ("ns", "chat", global_position, position, new.type, new.data, *meta[:5])
    assert stored == StoredEvent(*fields, "\x1f".join(meta.channels))
    assert stored._asdict() == {
        "namespace": "ns",
        "stream": "chat",
        "global_position": global_position,
        "position": position,
        "type": new.type,
        "data": new.data,
        "event_id": meta.event_id,
        "time": meta.time,
        "run_id": meta.run_id,
        "actor": meta.actor,
        "idempotency_key": meta.idempotency_key,
        "channels": "\x1f".join(meta.channels),
    }
    assert stored == StoredEvent(**stored._asdict()) and hash(stored) == hash(tuple(stored))
    assert stored.meta == meta and stored.cursor == str(global_position)
    assert stored.payload == {"n": 1} and stored.decode() == Pinged(n=1)
    assert pickle.loads(pickle.dumps(stored)) == stored
    assert stored != tuple(stored) and tuple(stored) != stored
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
            st.lists(_TEXT.filter(bool), max_size=3),
        ),
        max_size=10,
    )
)
def test_from_rows_equals_from_row_per_row(rows: list[tuple[Any, ...]]) -> None:
    """Rows as a SQL store gives them (channels joined by \\x1f), or with the channels as a
    list or a tuple (from_row only)."""
    joined = [(*row[:9], "\x1f".join(row[9])) for row in rows]
    many = StoredEvent.from_rows("ns", "chat", iter(joined))
    assert isinstance(many, tuple)
    assert many == tuple(StoredEvent.from_row("ns", "chat", row) for row in joined)
    for event, row in zip(many, rows, strict=True):
        assert type(event) is StoredEvent
        assert tuple(event) == ("ns", "chat", *row[:9], "\x1f".join(row[9]))
        assert event == StoredEvent.from_row("ns", "chat", row)
        assert event == StoredEvent.from_row("ns", "chat", (*row[:9], tuple(row[9])))
        assert event.meta == EventMeta(row[4], row[5], row[6], row[7], row[8], tuple(row[9]))
