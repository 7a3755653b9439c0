"""Segmented folds: open, attach (kind narrows, missing targets), on."""

from __future__ import annotations

from typing import Annotated, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, Field

import contextfold as cf
from contextfold.testing import envelope


class Prompt(cf.Event, type="seg/prompt"):
    id: str
    text: str


class Step(cf.Event, type="seg/step"):
    step_id: str
    text: str


class Result(cf.Event, type="seg/result"):
    step_id: str
    output: str


class LateResult(cf.Event, type="seg/late-result"):
    step_id: str
    output: str


class Forget(cf.Event, type="seg/forget"):
    id: str


class Noop(cf.Event, type="seg/noop"):
    step_id: str


class UserData(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["user"] = "user"
    text: str


class StepData(BaseModel):
    model_config = ConfigDict(frozen=True)
    kind: Literal["step"] = "step"
    text: str
    results: tuple[str, ...] = ()


Entry = Annotated[UserData | StepData, Field(discriminator="kind")]
State = cf.SegmentedState[UserData | StepData, str]


def make_fold(name: str = "segmented") -> cf.SegmentedFold:
    fold = cf.SegmentedFold(name, data=Entry, summary=str, tag="kind")

    @fold.open(Prompt)
    def _prompt(ev: cf.Envelope[Prompt]) -> cf.Segment[UserData]:
        return cf.Segment(ev.payload.id, UserData(text=ev.payload.text))

    @fold.open(Step)
    def _step(ev: cf.Envelope[Step]) -> cf.Segment[StepData]:
        return cf.Segment(ev.payload.step_id, StepData(text=ev.payload.text))

    @fold.attach(Result, kind="step", to=lambda ev: ev.payload.step_id)
    def _result(step: StepData, ev: cf.Envelope[Result]) -> StepData:
        return step.model_copy(update={"results": (*step.results, ev.payload.output)})

    @fold.attach(LateResult, kind="step", to=lambda ev: ev.payload.step_id, on_missing="ignore")
    def _late(step: StepData, ev: cf.Envelope[LateResult]) -> StepData:
        return step.model_copy(update={"results": (*step.results, ev.payload.output)})

    @fold.attach(Noop, to=lambda ev: ev.payload.step_id)
    def _noop(data: UserData | StepData, ev: cf.Envelope[Noop]) -> UserData | StepData:
        return data  # nothing changes

    @fold.on(Forget)
    def _forget(state: State, ev: cf.Envelope[Forget]) -> State:
        kept = [s for s in state.segments if s.id != ev.payload.id]
        return cf.SegmentedState(kept, state.summary)

    return fold


def env(payload: cf.Event, position: int) -> cf.Envelope[cf.Event]:
    return envelope(payload, position)


def ids(state: State) -> list[str]:
    return [s.id for s in state.segments]


def test_open_appends_the_newest_segment() -> None:
    fold = make_fold()
    state = fold.apply_all(
        fold.initial_state(),
        [env(Prompt(id="p1", text="hi"), 1), env(Step(step_id="s1", text="t"), 2)],
    )
    assert ids(state) == ["p1", "s1"]
    assert state.segments[0].data == UserData(text="hi")
    assert state.summary is None
    assert fold.kind(state.segments[1]) == "step"
    assert fold.kind(state.segments[1].data) == "step"
    assert fold.initial_state() == cf.SegmentedState()


def test_attach_updates_the_newest_segment_with_the_id_in_place() -> None:
    fold = make_fold()
    state = fold.apply_all(
        fold.initial_state(),
        [
            env(Step(step_id="s1", text="old"), 1),
            env(Step(step_id="s1", text="new"), 2),
            env(Prompt(id="p", text="after"), 3),
            env(Result(step_id="s1", output="r1"), 4),
            env(Result(step_id="s1", output="r2"), 5),
        ],
    )
    assert ids(state) == ["s1", "s1", "p"]  # updated in place: order unchanged
    assert state.segments[0].data.results == ()
    assert state.segments[1].data == StepData(text="new", results=("r1", "r2"))


def test_attach_with_kind_skips_a_segment_with_the_id_but_another_kind() -> None:
    fold = make_fold()
    state = fold.apply_all(
        fold.initial_state(),
        [
            env(Step(step_id="x", text="step"), 1),
            env(Prompt(id="x", text="a prompt with the same id, newer"), 2),
            env(Result(step_id="x", output="out"), 3),
        ],
    )
    assert state.segments[0].data == StepData(text="step", results=("out",))
    assert state.segments[1].data == UserData(text="a prompt with the same id, newer")


def test_attach_with_kind_reports_when_only_another_kind_has_the_id() -> None:
    fold = make_fold()
    before = fold.apply(fold.initial_state(), env(Prompt(id="x", text="p"), 1))
    after, problem = fold.apply_reporting(before, env(Result(step_id="x", output="out"), 2))
    assert problem == "missing-segment"
    assert after is before


def test_attach_returning_the_data_itself_changes_nothing() -> None:
    fold = make_fold()
    state = fold.apply(fold.initial_state(), env(Step(step_id="s", text="t"), 1))
    assert fold.apply(state, env(Noop(step_id="s"), 2)) is state


def test_on_handles_the_whole_state() -> None:
    fold = make_fold()
    state = fold.apply_all(
        fold.initial_state(),
        [
            env(Prompt(id="a", text="a"), 1),
            env(Prompt(id="b", text="b"), 2),
            env(Forget(id="a"), 3),
        ],
    )
    assert ids(state) == ["b"]


def test_open_must_return_a_segment() -> None:
    fold = cf.SegmentedFold("badopen", data=dict[str, str], tag="kind")
    # Not a Segment, on purpose: the fold refuses it at run time.
    fold.open(Prompt)(lambda ev: {"kind": "user"})  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError, match="Segment"):
        fold.apply(fold.initial_state(), env(Prompt(id="a", text="a"), 1))


def test_on_must_return_a_segmented_state() -> None:
    fold = cf.SegmentedFold("badon", data=dict[str, str], tag="kind")
    # Not a SegmentedState, on purpose: the fold refuses it at run time.
    fold.on(Forget)(lambda state, ev: [])  # type: ignore[arg-type, return-value]
    with pytest.raises(TypeError, match="SegmentedState"):
        fold.apply(fold.initial_state(), env(Forget(id="a"), 1))


async def test_missing_target_is_reported_once_and_the_state_is_unchanged() -> None:
    fold = make_fold()
    journal = cf.open_journal("memory://")
    await journal.append("s", [Prompt(id="p", text="hi"), Step(step_id="s1", text="t")])
    before = await journal.fold(fold, "s")

    await journal.append("s", Result(step_id="nope", output="lost"))
    after = await journal.fold(fold, "s")
    assert after == before
    skipped = [s for s in journal.folds.skipped if s.fold == fold.name]
    assert len(skipped) == 1
    assert skipped[0].reason == "missing-segment"
    assert (skipped[0].stream, skipped[0].position) == ("s", 3)

    # Read again, warm and from the start: the same event is not reported again.
    await journal.fold(fold, "s")
    journal.folds.cache.drop(lambda key: True)
    assert await journal.fold(fold, "s") == before
    assert len([s for s in journal.folds.skipped if s.fold == fold.name]) == 1

    # Another journal object (another "plane") reports it once more, once.
    other = cf.Journal(journal.store)
    assert await other.fold(fold, "s") == before
    await other.fold(fold, "s")
    assert [s.reason for s in other.folds.skipped] == ["missing-segment"]


async def test_missing_target_ignored_is_not_reported() -> None:
    fold = make_fold()
    journal = cf.open_journal("memory://")
    await journal.append("s", Step(step_id="s1", text="t"))
    before = await journal.fold(fold, "s")
    await journal.append("s", [LateResult(step_id="compacted-away", output="late")])
    assert await journal.fold(fold, "s") == before
    journal.folds.cache.drop(lambda key: True)
    assert await journal.fold(fold, "s") == before
    assert journal.folds.skipped == []

    # A late result whose step exists still attaches.
    await journal.append("s", LateResult(step_id="s1", output="late"))
    assert (await journal.fold(fold, "s")).segments[0].data.results == ("late",)


# -- the id index ------------------------------------------------------------------------------


class CountedId(str):
    """A segment id that counts how often it is compared."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountedId.compared += 1
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        CountedId.compared += 1
        return str.__ne__(self, other)

    __hash__ = str.__hash__


def test_a_late_result_does_not_scan_the_segments() -> None:
    fold = cf.SegmentedFold("counted", data=StepData, tag="kind")
    fold.open(Step)(lambda ev: cf.Segment(CountedId(ev.payload.step_id), StepData(text="t")))

    @fold.attach(Result, kind="step", to=lambda ev: ev.payload.step_id)
    def _result(step: StepData, ev: cf.Envelope[Result]) -> StepData:
        return step.model_copy(update={"results": (*step.results, ev.payload.output)})

    state = fold.initial_state()
    for i in range(2000):
        state = fold.apply(state, env(Step(step_id=f"s{i}", text="t"), i))
    state = fold.apply(state, env(Result(step_id="s1999", output="first"), 2000))  # indexes
    CountedId.compared = 0
    for i in range(100):
        state = fold.apply(state, env(Step(step_id=f"n{i}", text="t"), 3000 + i))
        state = fold.apply(state, env(Result(step_id=f"s{i}", output="late"), 4000 + i))
    assert CountedId.compared <= 10 * 100  # not the ~2,000 a scan from the newest makes each
    assert [s.data.results for s in list(state.segments)[:2]] == [("late",), ("late",)]
    assert state.segments[1999].data.results == ("first",)


def test_attach_finds_the_newest_of_an_id_opened_again_after_indexing() -> None:
    fold = make_fold()
    state = fold.apply_all(
        fold.initial_state(),
        [
            env(Step(step_id="a", text="first"), 1),
            env(Result(step_id="a", output="1"), 2),  # the first attach indexes the state
            env(Step(step_id="a", text="second"), 3),
            env(Prompt(id="a", text="a prompt, same id"), 4),
            env(Result(step_id="a", output="2"), 5),
        ],
    )
    assert [s.data.results for s in state.segments[:2]] == [("1",), ("2",)]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("prompt"), st.sampled_from("abc")),
        st.tuples(st.just("step"), st.sampled_from("abc")),
        st.tuples(st.just("step"), st.sampled_from("abc")),
        st.tuples(st.just("result"), st.sampled_from("abcd")),
        st.tuples(st.just("late"), st.sampled_from("abcd")),
        st.tuples(st.just("noop"), st.sampled_from("abcd")),
        st.tuples(st.just("forget"), st.sampled_from("abc")),
        st.tuples(st.just("restore")),
    ),
    max_size=40,
)


def scanned(state: State, target: str, kind: str | None) -> int | None:
    """The newest segment with the id (and kind): the index must agree with this scan."""
    for index in range(len(state.segments) - 1, -1, -1):
        segment = state.segments[index]
        if segment.id == target and (kind is None or segment.data.kind == kind):
            return index
    return None


def event_of(op: tuple[str, ...], position: int) -> cf.Event:
    kind, target = op
    if kind == "prompt":
        return Prompt(id=target, text="p")
    if kind == "step":
        return Step(step_id=target, text="s")
    if kind == "result":
        return Result(step_id=target, output=str(position))
    if kind == "late":
        return LateResult(step_id=target, output=str(position))
    if kind == "noop":
        return Noop(step_id=target)
    return Forget(id=target)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_attach_finds_the_segment_a_scan_from_the_newest_finds(ops: list[tuple[str, ...]]) -> None:
    fold = make_fold("indexed")
    state = fold.initial_state()
    for position, op in enumerate(ops, start=1):
        if op[0] == "restore":  # a checkpoint: a state without an index
            state = fold.decode_state(fold.encode_state(state))
            continue
        after, problem = fold.apply_reporting(state, env(event_of(op, position), position))
        if op[0] in ("result", "late"):
            expected = scanned(state, op[1], "step")
            changed = [
                i for i, (a, b) in enumerate(zip(state, after, strict=True)) if a.data != b.data
            ]
            assert changed == ([] if expected is None else [expected])
            assert problem == (
                "missing-segment" if expected is None and op[0] == "result" else None
            )
        state = after
    assert fold.decode_state(fold.encode_state(state)) == state
