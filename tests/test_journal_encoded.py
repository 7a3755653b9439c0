"""Encoded events: ``Journal.encode`` makes events as an append stores them, and an append
stores them as they are, each with its own meta, in one atomic batch with other events;
one that was not made right is refused like any bad event, and nothing is stored."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import contextfold as cf
from contextfold.errors import InvalidInputError, PayloadError
from contextfold.events import EventMeta, NewEvent
from contextfold.journal import Journal, encode
from contextfold.store.base import Store
from contextfold.store.memory import MemoryStore
from contextfold.testing import EPOCH, FixedClock, RecordingStore, counter_ids


class Note(cf.Event, type="test-encoded/note"):
    text: str


def _journal(store: Store | None = None) -> Journal:
    return Journal(store or MemoryStore(), clock=FixedClock(), ids=counter_ids())


async def test_encoded_events_are_stored_as_encoded_with_their_own_meta() -> None:
    journal = _journal()
    clock = journal.clock
    assert isinstance(clock, FixedClock)
    first = journal.encode(Note(text="a"), actor="agent")
    clock.advance(5)
    done = await journal.append(
        "s",
        [*first, Note(text="b")],
        actor="tool",
        channels=(),
        idempotency_key="k-1",
    )
    page = await journal.read("s")
    [a, b] = page.events
    assert (a.data, a.meta.event_id) == (first[0].data, "ev-1")
    assert a.meta.time == "2026-01-01T00:00:00+00:00"  # the encoding's clock reading
    assert (a.meta.actor, a.meta.channels) == ("agent", ("main",))
    assert (b.meta.actor, b.meta.channels, b.meta.event_id) == ("tool", (), "ev-2")
    assert b.meta.time == "2026-01-01T00:00:05+00:00"  # the append's own clock reading
    # The append's idempotency key names every event of it, the encoded one too.
    assert a.meta.idempotency_key == b.meta.idempotency_key == "k-1"
    assert (done.first_position, done.last_position) == (1, 2)


async def test_an_encoded_event_alone_is_a_batch_of_one() -> None:
    journal = _journal()
    [event] = journal.encode(Note(text="one"))
    done = await journal.append("s", event)
    assert (done.first_position, done.last_position) == (1, 1)
    [stored] = (await journal.read("s")).events
    assert stored.decode(Note) == Note(text="one")


async def test_an_append_of_encoded_events_folds_them_like_any_other() -> None:
    counted = cf.Fold("encoded_count", state=int, initial=int)

    @counted.on(Note)
    def _(state: int, ev: cf.Envelope[Note]) -> int:
        return state + len(ev.payload.text)

    journal = _journal()
    await journal.append("s", Note(text="x"))
    assert await journal.fold(counted, "s") == 1
    await journal.append("s", [*journal.encode([Note(text="yy"), Note(text="zzz")])])
    assert await journal.fold(counted, "s") == 6


def _meta(**changes: Any) -> EventMeta:
    return EventMeta("id-1", "2026-01-01T00:00:00+00:00", None, None, None, ("main",))._replace(
        **changes
    )


@pytest.mark.parametrize(
    ("event", "words", "error"),
    [
        (NewEvent("bad type", b"{}", _meta()), "events[1]: encoded event type", InvalidInputError),
        (NewEvent("e", "{}", _meta()), "events[1] (e): an encoded payload", PayloadError),  # type: ignore[arg-type]
        (NewEvent("e", b"{", _meta()), "events[1] (e): payload is not JSON", PayloadError),
        (NewEvent("e", b"NaN", _meta()), "events[1] (e): payload is not JSON", PayloadError),
        (
            NewEvent("e", b'"\\ud800"', _meta()),
            "events[1] (e): payload is not JSON",
            PayloadError,
        ),
        (NewEvent("e", b"{}", ("id", "t")), "events[1] (e): meta must be", InvalidInputError),  # type: ignore[arg-type]
        (NewEvent("e", b"{}", _meta(event_id="")), "events[1]: meta.event_id", InvalidInputError),
        (NewEvent("e", b"{}", _meta(time=None)), "events[1]: meta.time", InvalidInputError),
        (NewEvent("e", b"{}", _meta(actor="a\x00")), "events[1]: meta.actor", InvalidInputError),
        (NewEvent("e", b"{}", _meta(run_id=7)), "events[1]: meta.run_id", InvalidInputError),
        (NewEvent("e", b"{}", _meta(channels=("",))), "channel ''", InvalidInputError),
    ],
)
async def test_a_bad_encoded_event_is_refused_naming_it_and_nothing_is_stored(
    event: NewEvent, words: str, error: type[Exception]
) -> None:
    store = RecordingStore()
    journal = _journal(store)
    await journal.append("s", Note(text="keep"))
    before = list(store.calls)
    with pytest.raises(error) as info:
        await journal.append("s", [Note(text="lost"), event])
    assert str(info.value).startswith(words), str(info.value)
    assert store.calls == before, "a bad append reached the store"
    assert [e.payload["text"] for e in (await journal.read("s")).events] == ["keep"]


async def test_an_encoded_payload_over_the_limit_is_refused() -> None:
    journal = Journal(MemoryStore(), max_payload_bytes=64)
    [event] = Journal(MemoryStore()).encode(Note(text="x" * 100))
    with pytest.raises(PayloadError, match=r"events\[0\] \(test-encoded/note\): payload is"):
        await journal.append("s", event)
    assert await journal.version("s") == 0


def test_encode_refuses_what_append_refuses() -> None:
    journal = _journal()
    with pytest.raises(PayloadError, match="payload"):
        journal.encode(cf.RawEvent("e", {"x": math.nan}))
    with pytest.raises(InvalidInputError, match="got no events"):
        journal.encode([])
    with pytest.raises(InvalidInputError, match="actor"):
        journal.encode(Note(text="a"), actor="a\x00")


@given(texts=st.lists(st.text(max_size=20), min_size=1, max_size=5), split=st.integers(0, 5))
async def test_encoded_then_appended_equals_appended_at_once(texts: list[str], split: int) -> None:
    """Encoding first changes nothing stored but what the caller chose: the same payloads,
    types, times and ids as the same events appended directly."""
    notes = [Note(text=t) for t in texts]
    direct, encoded = _journal(), _journal()
    await direct.append("s", notes, actor="agent")
    cut = min(split, len(notes))
    head = encoded.encode(notes[:cut], actor="agent") if cut else ()
    await encoded.append("s", [*head, *notes[cut:]], actor="agent")
    one = (await direct.read("s")).events
    two = (await encoded.read("s")).events
    assert [(e.type, e.data, e.meta) for e in one] == [(e.type, e.data, e.meta) for e in two]
    assert [orjson.loads(e.data)["text"] for e in two] == texts


async def test_a_batch_of_encoded_events_reads_no_clock() -> None:
    """Time is read once per encoding: an append of encoded events alone reads none, so
    encoding ahead reads the clock as often as appending directly would."""
    readings: list[int] = []

    def clock() -> datetime:
        readings.append(1)
        return EPOCH

    journal = Journal(MemoryStore(), clock=clock)
    encoded = journal.encode([Note(text="a"), Note(text="b")])
    assert len(readings) == 1
    await journal.append("s", [*encoded])
    assert len(readings) == 1
    await journal.append("s", [*journal.encode(Note(text="c")), Note(text="d")])
    assert len(readings) == 3


async def test_what_the_journal_encoded_is_not_checked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its own encoding checked it: only an encoded event made elsewhere is checked (its
    bytes parsed) as an append takes it."""
    checked: list[int] = []
    check = encode._encoded

    def counting(index: int, *args: Any) -> NewEvent:
        checked.append(index)
        return check(index, *args)

    monkeypatch.setattr(encode, "_encoded", counting)
    journal = _journal()
    made = journal.encode([Note(text="a"), Note(text="b")])
    elsewhere = NewEvent(made[0].type, made[0].data, made[0].meta._replace(event_id="own-1"))
    await journal.append("s", [*made, elsewhere], idempotency_key="k")
    assert checked == [2]
    stored = (await journal.read("s")).events
    assert [e.meta.idempotency_key for e in stored] == ["k"] * 3
    assert [e.meta.event_id for e in stored] == ["ev-1", "ev-2", "own-1"]
