"""Fold definitions (names, scopes, versions, one handler per event) and read-only state."""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Sequence
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

import contextfold as cf
from contextfold.folds import FoldBase
from contextfold.testing import envelope


class Said(cf.Event, type="fdef/said"):
    text: str


class Heard(cf.Event, type="fdef/heard"):
    text: str


class Turn(BaseModel):
    model_config = ConfigDict(frozen=True)
    role: Literal["user", "assistant"]
    text: str


class Chat(BaseModel):
    model_config = ConfigDict(frozen=True)
    summary: str | None = None
    turns: tuple[Turn, ...] = ()


class MutableChat(BaseModel):
    turns: list[str] = []


def env(payload: cf.Event, position: int) -> cf.Envelope[cf.Event]:
    return envelope(payload, position)


# -- names, scopes, versions -------------------------------------------------------------------


@pytest.mark.parametrize("name", ["1abc", "my-fold", "has space", "", "a.b", "émoji☃", 5, None])
def test_name_must_be_an_identifier(name: object) -> None:
    with pytest.raises(cf.FoldDefinitionError, match="identifier"):
        cf.Fold(name, initial=list)  # type: ignore[arg-type]
    with pytest.raises(cf.FoldDefinitionError, match="identifier"):
        cf.SegmentedFold(name, data=str)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["conversation", "_private", "Fold2", "ünïcode"])
def test_identifier_names_are_accepted(name: str) -> None:
    assert cf.Fold(name, initial=list).name == name


@pytest.mark.parametrize("scope", ["global", "", "Run", None, 1])
def test_scope_must_be_context_or_run(scope: object) -> None:
    with pytest.raises(cf.FoldDefinitionError, match="scope"):
        cf.Fold("f", initial=list, scope=scope)  # type: ignore[arg-type]
    with pytest.raises(cf.FoldDefinitionError, match="scope"):
        cf.SegmentedFold("f", data=str, scope=scope)  # type: ignore[arg-type]


@pytest.mark.parametrize("version", [0, -1, True, False, 1.0, 1.5, "1", None, math.inf])
def test_version_must_be_a_positive_int(version: object) -> None:
    with pytest.raises(cf.FoldDefinitionError, match="version"):
        cf.Fold("f", initial=list, version=version)  # type: ignore[arg-type]
    with pytest.raises(cf.FoldDefinitionError, match="version"):
        cf.SegmentedFold("f", data=str, version=version)  # type: ignore[arg-type]


def test_defaults_and_checkpoint_type_name_both_name_and_version() -> None:
    f: cf.Fold[list[Any]] = cf.Fold("conversation", initial=list)
    assert (f.scope, f.version) == ("context", 1)
    g: cf.Fold[list[Any]] = cf.Fold("conversation", initial=list, scope="run", version=3)
    assert (g.scope, g.version) == ("run", 3)
    assert f.checkpoint_type != g.checkpoint_type
    assert "conversation" in g.checkpoint_type and "3" in g.checkpoint_type


def test_a_fold_needs_an_initial_state() -> None:
    with pytest.raises(cf.FoldDefinitionError, match="initial"):
        cf.Fold("f")


def test_handlers_take_event_classes_with_a_type_name() -> None:
    f: cf.Fold[list[Any]] = cf.Fold("f", initial=list)

    class Abstract(cf.Event):  # no type=: an abstract base
        x: int

    for bad in (Abstract, str, "fdef/said", Said(text="x")):
        with pytest.raises(cf.FoldDefinitionError):  # none is an event class: on purpose
            f.on(bad)(lambda s, e: s)  # type: ignore[arg-type, type-var]


# -- one handler per event ---------------------------------------------------------------------


def test_two_handlers_for_one_event() -> None:
    f: cf.Fold[list[str]] = cf.Fold("f", initial=list)
    f.on(Said)(lambda s, e: [*s, e.payload.text])
    with pytest.raises(cf.FoldDefinitionError, match="already has a handler"):
        f.on(Said)(lambda s, e: s)
    assert f.event_types == ("fdef/said",)


def test_two_handlers_for_one_event_across_open_attach_on() -> None:
    seg = cf.SegmentedFold("seg", data=str, tag=None)
    seg.open(Said)(lambda e: cf.Segment("a", e.payload.text))
    with pytest.raises(cf.FoldDefinitionError):
        seg.attach(Said, to=lambda e: "a")(lambda d, e: d)
    with pytest.raises(cf.FoldDefinitionError):
        seg.on(Said)(lambda s, e: s)
    with pytest.raises(cf.FoldDefinitionError):
        seg.open(Said)(lambda e: cf.Segment("b", "x"))
    seg.attach(Heard, to=lambda e: "a")(lambda d, e: d)
    assert seg.event_types == ("fdef/said", "fdef/heard")


def test_attach_options_are_checked() -> None:
    untagged = cf.SegmentedFold("untagged", data=str, tag=None)
    with pytest.raises(cf.FoldDefinitionError, match="tag"):
        untagged.attach(Said, to=lambda e: "a", kind="step")
    tagged = cf.SegmentedFold("tagged", data=dict[str, str], tag="kind")
    with pytest.raises(cf.FoldDefinitionError, match="on_missing"):
        tagged.attach(Said, to=lambda e: "a", on_missing="raise")  # type: ignore[arg-type]


# -- no handler at all -------------------------------------------------------------------------


def test_a_fold_without_handlers_fails_validate() -> None:
    folds: tuple[FoldBase[Any], ...] = (
        cf.Fold("empty", initial=list),
        cf.SegmentedFold("empty_seg", data=str),
    )
    for fold in folds:
        with pytest.raises(cf.FoldDefinitionError, match="no handler"):
            fold.validate()


async def test_a_fold_without_handlers_fails_on_first_read() -> None:
    journal = cf.open_journal("memory://")
    await journal.append("s", Said(text="hi"))
    folds: tuple[FoldBase[Any], ...] = (
        cf.Fold("empty", initial=list),
        cf.SegmentedFold("empty_seg", data=str),
    )
    for fold in folds:
        with pytest.raises(cf.FoldDefinitionError, match="no handler"):
            await journal.fold(fold, "s")


def test_a_fold_with_a_handler_validates() -> None:
    f: cf.Fold[list[Any]] = cf.Fold("f", initial=list)
    f.on(Said)(lambda s, e: s)
    f.validate()


# -- pure use ----------------------------------------------------------------------------------


def test_apply_all_without_a_journal() -> None:
    f: cf.Fold[Chat] = cf.Fold("conversation", state=Chat)

    @f.on(Said)
    def _said(state: Chat, ev: cf.Envelope[Said]) -> Chat:
        return state.model_copy(
            update={"turns": (*state.turns, Turn(role="user", text=ev.payload.text))}
        )

    @f.on(Heard)
    def _heard(state: Chat, ev: cf.Envelope[Heard]) -> Chat:
        turn = Turn(role="assistant", text=ev.payload.text)
        return state.model_copy(update={"turns": (*state.turns, turn)})

    state = f.apply_all(f.initial_state(), [env(Said(text="hi"), 1), env(Heard(text="hello"), 2)])
    assert [t.text for t in state.turns] == ["hi", "hello"]
    assert f.initial_state() == Chat()
    assert f.can_checkpoint


def test_initial_runs_on_every_start() -> None:
    calls: list[int] = []

    def initial() -> list[str]:
        calls.append(1)
        return []

    f = cf.Fold("f", initial=initial)
    f.initial_state()
    f.initial_state()
    assert len(calls) == 2


def test_events_without_a_handler_leave_the_state_as_is() -> None:
    f: cf.Fold[list[str]] = cf.Fold("f", initial=list)
    f.on(Said)(lambda s, e: [*s, e.payload.text])
    state = f.initial_state()
    assert f.apply(state, env(Heard(text="x"), 1)) is state


# -- read state is immutable -------------------------------------------------------------------


# A Sequence, not a list: a read hands the state back frozen, a FrozenList (a tuple).
Items = Sequence[dict[str, object]]


def plain_fold() -> cf.Fold[Items]:
    f: cf.Fold[Items] = cf.Fold("plain", initial=list)

    @f.on(Said)
    def _said(state: Items, ev: cf.Envelope[Said]) -> Items:
        return [*state, {"text": ev.payload.text, "tags": ["a"], "meta": {"n": 1}}]

    return f


async def test_plain_fold_state_is_deeply_frozen() -> None:
    journal = cf.open_journal("memory://")
    await journal.append("s", [Said(text="one"), Said(text="two")])
    state = await journal.fold(plain_fold(), "s")
    assert isinstance(state, cf.FrozenList)
    assert isinstance(state[0], cf.FrozenDict)
    assert isinstance(state[0]["tags"], cf.FrozenList)
    assert isinstance(state[0]["meta"], cf.FrozenDict)
    assert state == (
        {"text": "one", "tags": ("a",), "meta": {"n": 1}},
        {"text": "two", "tags": ("a",), "meta": {"n": 1}},
    )

    with pytest.raises(TypeError):
        state[0] = {}  # type: ignore[index]
    with pytest.raises(AttributeError):
        state.append({})  # type: ignore[attr-defined]
    item = state[0]
    with pytest.raises(TypeError):
        item["text"] = "changed"
    with pytest.raises(TypeError):
        del item["text"]
    for method, args in [
        ("update", ({"x": 1},)),
        ("setdefault", ("x", 1)),
        ("pop", ("text",)),
        ("popitem", ()),
        ("clear", ()),
    ]:
        with pytest.raises(TypeError):
            getattr(item, method)(*args)
    with pytest.raises(TypeError):
        item |= {"x": 1}
    nested = state[0]["meta"]
    with pytest.raises(TypeError):
        nested["n"] = 2
    # Nothing changed: another fold object (a cache of its own) folds the same state.
    assert state[0]["text"] == "one"
    assert await journal.fold(plain_fold(), "s") == state


async def test_a_growing_tuple_state_is_not_walked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each event builds (*state, new): freezing it must only walk what the handler added, or
    # folding n events costs O(n²) walks. Recursive calls go through the module's global.
    module = sys.modules["contextfold.folds.freeze"]
    walked: list[object] = []
    original = module.freeze

    def counting(value: object) -> object:
        walked.append(value)
        return original(value)

    monkeypatch.setattr(module, "freeze", counting)
    f: cf.Fold[tuple[tuple[Turn, tuple[str, ...]], ...]] = cf.Fold("growing", initial=tuple)

    @f.on(Said)
    def _said(
        state: tuple[tuple[Turn, tuple[str, ...]], ...], ev: cf.Envelope[Said]
    ) -> tuple[tuple[Turn, tuple[str, ...]], ...]:
        return (*state, (Turn(role="user", text=ev.payload.text), ("tag",)))

    events = 300
    state = f.apply_all(f.initial_state(), [env(Said(text=str(i)), i) for i in range(events)])
    assert len(walked) <= 3 * events  # the new pair and its tags, not the whole history
    assert isinstance(state, cf.FrozenList) and isinstance(state[0], cf.FrozenList)
    assert isinstance(state[0][1], cf.FrozenList) and state[-1][1] == ("tag",)
    assert original(state) is state
    with pytest.raises(AttributeError):
        state[0][1].append("x")  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):
        state[0][0].text = "x"


async def test_a_handler_that_writes_to_its_state_fails_the_read() -> None:
    f: cf.Fold[dict[str, int]] = cf.Fold("writer", initial=dict)

    @f.on(Said)
    def _said(state: dict[str, int], ev: cf.Envelope[Said]) -> dict[str, int]:
        state[ev.payload.text] = 1  # wrong: must derive a new value
        return state

    journal = cf.open_journal("memory://")
    await journal.append("s", Said(text="x"))
    with pytest.raises(TypeError, match="read-only"):
        await journal.fold(f, "s")


async def test_schema_fold_state_is_a_frozen_model() -> None:
    f: cf.Fold[Chat] = cf.Fold("schema", state=Chat)

    @f.on(Said)
    def _said(state: Chat, ev: cf.Envelope[Said]) -> Chat:
        return state.model_copy(
            update={"turns": (*state.turns, Turn(role="user", text=ev.payload.text))}
        )

    journal = cf.open_journal("memory://")
    await journal.append("s", Said(text="hi"))
    state = await journal.fold(f, "s")
    with pytest.raises(ValidationError):
        state.summary = "x"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        state.turns[0].text = "x"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        state.turns.append(Turn(role="user", text="x"))  # type: ignore[attr-defined]
    assert state.turns[0].text == "hi"


async def test_mutable_models_are_refused_in_state() -> None:
    f: cf.Fold[MutableChat] = cf.Fold("mutable", state=MutableChat)
    f.on(Said)(lambda s, e: s)
    journal = cf.open_journal("memory://")
    with pytest.raises(TypeError, match="frozen"):
        await journal.fold(f, "s")


class UserEntry(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["user"] = "user"
    text: str


async def test_segmented_state_is_immutable() -> None:
    seg = cf.SegmentedFold("segimm", data=UserEntry, summary=str, tag="kind")
    seg.open(Said)(lambda e: cf.Segment(f"p{e.position}", UserEntry(text=e.payload.text)))
    journal = cf.open_journal("memory://")
    await journal.append("s", [Said(text="a"), Said(text="b")])
    state = await journal.fold(seg, "s")
    assert len(state.segments) == 2

    # The segments are a persistent vector: "append" returns a new one, never in place.
    grown = state.segments.append(cf.Segment("x", UserEntry(text="x")))  # type: ignore[attr-defined]
    assert len(grown) == 3 and len(state.segments) == 2
    with pytest.raises(TypeError):
        state.segments[0] = cf.Segment("x", UserEntry(text="x"))  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.summary = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.segments = ()  # type: ignore[misc]
    segment: cf.Segment[UserEntry] = state.segments[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        segment.data = UserEntry(text="x")  # type: ignore[misc]
    with pytest.raises(ValidationError):
        segment.data.text = "x"  # type: ignore[misc]
    assert [s.data.text for s in await journal.fold(seg, "s")] == ["a", "b"]


async def test_plain_segment_data_is_frozen_too() -> None:
    seg = cf.SegmentedFold("segdict", data=dict[str, object], tag="kind")
    seg.open(Said)(
        lambda e: cf.Segment(f"p{e.position}", {"kind": "user", "parts": [e.payload.text]})
    )
    journal = cf.open_journal("memory://")
    await journal.append("s", Said(text="a"))
    state = await journal.fold(seg, "s")
    data = state.segments[0].data
    assert isinstance(data, cf.FrozenDict) and isinstance(data["parts"], cf.FrozenList)
    with pytest.raises(TypeError):
        data["kind"] = "x"
