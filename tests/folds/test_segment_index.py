"""The segment id index shared by a line of states: an attach reaches the newest segment
with its id on every state, also on older states opened again (forks) and on states that
share the index with longer ones; the vector check is by its concrete type."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict

import contextfold as cf
from contextfold.events import EventMeta
from contextfold.folds import segmented


class Open(cf.Event, type="segidx/open"):
    id: str


class Add(cf.Event, type="segidx/add"):
    id: str
    value: int


class Data(BaseModel):
    model_config = ConfigDict(frozen=True)
    values: tuple[int, ...] = ()


FOLD = cf.SegmentedFold("segment_index", data=Data, tag=None)


@FOLD.open(Open)
def _open(ev: cf.Envelope[Open]) -> cf.Segment[Data]:
    return cf.Segment(ev.payload.id, Data())


@FOLD.attach(Add, to=lambda ev: ev.payload.id, on_missing="ignore")
def _add(data: Data, ev: cf.Envelope[Add]) -> Data:
    return data.model_copy(update={"values": (*data.values, ev.payload.value)})


def _env(payload: cf.Event, position: int) -> cf.Envelope[cf.Event]:
    meta = EventMeta(f"ev-{position}", "2026-01-01T00:00:00+00:00")
    return cf.Envelope(payload, meta, "s", position, position, payload.event_type)


Model = tuple[tuple[str, tuple[int, ...]], ...]


def _model_apply(model: Model, event: cf.Event) -> Model:
    if isinstance(event, Open):
        return (*model, (event.id, ()))
    assert isinstance(event, Add)
    for index in range(len(model) - 1, -1, -1):
        if model[index][0] == event.id:
            segment_id, values = model[index]
            return (*model[:index], (segment_id, (*values, event.value)), *model[index + 1 :])
    return model


ids = st.sampled_from(["a", "b", "c", "d"])
events = st.one_of(st.builds(Open, id=ids), st.builds(Add, id=ids, value=st.integers(0, 9)))
programs = st.lists(st.tuples(st.integers(min_value=0), events), max_size=60)


@settings(max_examples=200)
@given(programs)
def test_attach_reaches_the_newest_segment_on_every_state_forks_included(
    program: list[tuple[int, cf.Event]],
) -> None:
    states: list[tuple[cf.SegmentedState[Any, Any], Model]]
    states = [(FOLD.initial_state(), ())]
    for position, (pick, event) in enumerate(program, 1):
        state, model = states[pick % len(states)]  # any earlier state: forks too
        states.append((FOLD.apply(state, _env(event, position)), _model_apply(model, event)))
    for state, model in states:
        assert tuple((s.id, s.data.values) for s in state.segments) == model
        # Reading an old state after longer ones extended its index still sees its own.
        for segment_id in ("a", "b", "c", "d"):
            probe = FOLD.apply(state, _env(Add(id=segment_id, value=7), 10_000))
            expected = _model_apply(model, Add(id=segment_id, value=7))
            assert tuple((s.id, s.data.values) for s in probe.segments) == expected


def test_an_open_by_the_newest_state_extends_the_shared_index_in_place() -> None:
    state: cf.SegmentedState[Any, Any] = FOLD.apply(FOLD.initial_state(), _env(Open(id="a"), 1))
    state = FOLD.apply(state, _env(Add(id="a", value=1), 2))  # builds the index
    index = state._ids
    assert index is not None
    for position in range(3, 50):
        state = FOLD.apply(state, _env(Open(id=f"s{position}"), position))
    assert state._ids is index  # one index for the line, not levels merged per open
    assert index.positions["s49"] == 47  # one segment with the id: its position, no list


def test_segments_that_are_not_a_vector_become_one() -> None:
    state: cf.SegmentedState[Data, Any] = cf.SegmentedState([cf.Segment("a", Data())])
    assert type(state.segments) is segmented._PVECTOR
