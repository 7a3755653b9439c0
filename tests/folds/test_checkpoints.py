"""Checkpoints: journal.checkpoint(fold, stream, next), restoring, ignoring unusable ones, races."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

import contextfold as cf
from contextfold.folds import FoldBase
from contextfold.store.memory import MemoryStore
from contextfold.store.sqlite import SQLiteStore
from contextfold.testing import RecordingStore, envelopes


class Said(cf.Event, type="ckp/said"):
    text: str


class Turn(BaseModel):
    model_config = ConfigDict(frozen=True)
    role: Literal["user", "assistant"] = "user"
    text: str


class Chat(BaseModel):
    model_config = ConfigDict(frozen=True)
    summary: str | None = None
    turns: tuple[Turn, ...] = ()


class ChatV2(BaseModel):
    """A changed state shape: old checkpoints of Chat no longer decode with it."""

    model_config = ConfigDict(frozen=True)
    summary: str | None = None
    turns: tuple[Turn, ...] = ()
    count: int


def chat_fold(version: int = 1) -> cf.Fold[Chat]:
    fold: cf.Fold[Chat] = cf.Fold("chat", state=Chat, version=version)

    @fold.on(Said)
    def _said(state: Chat, ev: cf.Envelope[Said]) -> Chat:
        return state.model_copy(update={"turns": (*state.turns, Turn(text=ev.payload.text))})

    return fold


def chat_v2_fold() -> cf.Fold[ChatV2]:
    fold: cf.Fold[ChatV2] = cf.Fold("chat", state=ChatV2, initial=lambda: ChatV2(count=0))

    @fold.on(Said)
    def _said(state: ChatV2, ev: cf.Envelope[Said]) -> ChatV2:
        turns = (*state.turns, Turn(text=ev.payload.text))
        return state.model_copy(update={"turns": turns, "count": state.count + 1})

    return fold


def texts(state: Chat) -> list[str]:
    return [t.text for t in state.turns]


def summarize_all_but(keep: int, label: str = "summary") -> Callable[[Chat], Chat]:
    def next_state(state: Chat) -> Chat:
        older = state.turns[:-keep] if keep else state.turns
        kept = state.turns[-keep:] if keep else ()
        summary = f"{label}: {state.summary or ''}|{','.join(t.text for t in older)}"
        return Chat(summary=summary, turns=kept)

    return next_state


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, sqlite_path: str) -> AsyncIterator[RecordingStore]:
    inner: cf.Store = MemoryStore() if request.param == "memory" else SQLiteStore(sqlite_path)
    recording = RecordingStore(inner)
    await recording.open()
    try:
        yield recording
    finally:
        await recording.close()


async def cold(store: cf.Store, fold: FoldBase[Any], stream: str = "s") -> object:
    """A cold rebuild: a fresh journal (its own fold cache) on the same store."""
    return await cf.Journal(store).fold(fold, stream)


# -- round trip --------------------------------------------------------------------------------


async def test_checkpoint_next_round_trip(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = chat_fold()
    appended = await journal.append("s", [Said(text="a"), Said(text="b"), Said(text="c")])
    compacted = await journal.checkpoint(fold, "s", summarize_all_but(1))
    assert compacted == Chat(summary="summary: |a,b", turns=(Turn(text="c"),))
    assert await journal.fold(fold, "s") == compacted
    assert await cold(store, fold) == compacted

    [checkpoint] = await journal.latest("s", [fold.checkpoint_type])
    assert checkpoint.payload == {
        "fold": "chat",
        "version": 1,
        "through": appended.cursor,
        "state": {"summary": "summary: |a,b", "turns": [{"role": "user", "text": "c"}]},
    }
    assert checkpoint.meta.channels == ()  # never replayed on a channel

    await journal.append("s", Said(text="d"))
    after = Chat(summary="summary: |a,b", turns=(Turn(text="c"), Turn(text="d")))
    assert await journal.fold(fold, "s") == after
    assert await cold(store, fold) == after


async def test_checkpoint_next_may_be_async_and_gets_the_read_state(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = chat_fold()
    await journal.append("s", [Said(text="a"), Said(text="b")])
    seen: list[Chat] = []

    async def next_state(state: Chat) -> Chat:
        seen.append(state)
        await asyncio.sleep(0)
        return Chat(summary="async", turns=())

    assert await journal.checkpoint(fold, "s", next_state) == Chat(summary="async")
    assert texts(seen[0]) == ["a", "b"]
    assert await cold(store, fold) == Chat(summary="async")


async def test_checkpoint_on_an_empty_stream(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = chat_fold()
    assert await journal.checkpoint(fold, "s", lambda s: Chat(summary="nothing yet")) == Chat(
        summary="nothing yet"
    )
    await journal.append("s", Said(text="a"))
    expected = Chat(summary="nothing yet", turns=(Turn(text="a"),))
    assert await journal.fold(fold, "s") == expected
    assert await cold(store, fold) == expected


# -- restoring ---------------------------------------------------------------------------------


async def test_a_cold_read_restores_the_newest_checkpoint(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = chat_fold()
    await journal.append("s", [Said(text="a"), Said(text="b")])
    await journal.checkpoint(fold, "s", summarize_all_but(0, "first"))
    through = (await journal.append("s", [Said(text="c"), Said(text="d")])).cursor
    second = await journal.checkpoint(fold, "s", summarize_all_but(1, "second"))
    await journal.append("s", Said(text="e"))
    expected = second.model_copy(update={"turns": (*second.turns, Turn(text="e"))})
    assert await journal.fold(fold, "s") == expected

    store.clear()
    assert await cold(store, fold) == expected
    # It started from the newest checkpoint's through, not from the start of the stream.
    assert store.reads[0].after == through


async def test_a_warm_read_rebases_on_a_checkpoint_another_journal_wrote(
    store: RecordingStore,
) -> None:
    reader_journal, writer_journal = cf.Journal(store), cf.Journal(store)
    fold = chat_fold()
    await reader_journal.append("s", [Said(text="a"), Said(text="b")])
    assert texts(await reader_journal.fold(fold, "s")) == ["a", "b"]
    compacted = await writer_journal.checkpoint(fold, "s", summarize_all_but(1))
    assert await reader_journal.fold(fold, "s") == compacted


async def test_a_checkpoint_of_another_version_is_ignored(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    v1, v2 = chat_fold(1), chat_fold(2)  # different versions: no FoldDefinitionError
    await journal.append("s", [Said(text="a"), Said(text="b")])
    assert texts(await journal.fold(v2, "s")) == ["a", "b"]  # v2 cached (warm) from here

    compacted_v1 = await journal.checkpoint(v1, "s", summarize_all_but(0, "v1"))
    assert await journal.fold(v2, "s") == Chat(turns=(Turn(text="a"), Turn(text="b")))
    assert await cold(store, v2) == Chat(turns=(Turn(text="a"), Turn(text="b")))

    compacted_v2 = await journal.checkpoint(v2, "s", summarize_all_but(0, "v2"))
    assert await journal.fold(v1, "s") == compacted_v1
    assert await cold(store, v1) == compacted_v1
    assert await cold(store, v2) == compacted_v2
    assert compacted_v1 != compacted_v2


async def test_a_checkpoint_with_an_unknown_through_is_ignored_and_reported(
    store: RecordingStore,
) -> None:
    journal = cf.Journal(store)
    fold = chat_fold()
    await journal.append("s", [Said(text="a"), Said(text="b")])
    good = await journal.checkpoint(fold, "s", summarize_all_but(1))
    other_stream_cursor = (await journal.append("elsewhere", Said(text="x"))).cursor
    bad = await journal.append(
        "s",
        [
            cf.RawEvent(
                fold.checkpoint_type,
                {"fold": "chat", "version": 1, "through": through, "state": {"summary": "bad"}},
            )
            for through in ("999999999", "not-a-cursor", other_stream_cursor)
        ],
        channels=(),
    )
    await journal.append("s", Said(text="c"))
    expected = good.model_copy(update={"turns": (*good.turns, Turn(text="c"))})
    assert await journal.fold(fold, "s") == expected  # warm
    fresh = cf.Journal(store)
    assert await fresh.fold(fold, "s") == expected  # cold: falls back to the older one
    for reader in (journal, fresh):
        reports = sorted((s.reason, s.position) for s in reader.folds.skipped)
        assert reports == [
            ("checkpoint", p) for p in range(bad.first_position, bad.last_position + 1)
        ]


async def test_a_checkpoint_that_no_longer_decodes_is_ignored_and_reported(
    store: RecordingStore,
) -> None:
    old_journal = cf.Journal(store)
    await old_journal.append("s", [Said(text="a"), Said(text="b")])
    await old_journal.checkpoint(chat_fold(), "s", summarize_all_but(0))
    await old_journal.append("s", Said(text="c"))

    # The state's schema changed without a version bump: the checkpoint is skipped and the
    # fold starts from scratch (from the start of the history).
    journal = cf.Journal(store)
    changed = chat_v2_fold()
    state = await journal.fold(changed, "s")
    assert (state.summary, [t.text for t in state.turns], state.count) == (None, ["a", "b", "c"], 3)
    assert [s.reason for s in journal.folds.skipped] == ["checkpoint"]
    journal.folds.cache.drop(lambda key: True)
    assert await journal.fold(changed, "s") == state
    assert len(journal.folds.skipped) == 1  # reported once

    # A garbage state written under the fold's name is skipped the same way.
    await journal.append(
        "s",
        cf.RawEvent(changed.checkpoint_type, {"through": None, "state": {"count": "many"}}),
        channels=(),
    )
    assert await journal.fold(changed, "s") == state
    assert [s.reason for s in journal.folds.skipped] == ["checkpoint", "checkpoint"]

    # The next compaction writes a checkpoint that decodes: from then on it is used.
    compacted = await journal.checkpoint(
        changed, "s", lambda s: ChatV2(summary="new shape", turns=(), count=s.count)
    )
    assert compacted == ChatV2(summary="new shape", count=3)
    assert await cold(store, changed) == compacted


async def test_a_checkpoint_of_a_deleted_history_is_ignored(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = chat_fold()
    await journal.append("s", [Said(text="old-a"), Said(text="old-b")])

    async def next_state(state: Chat) -> Chat:
        # The context is deleted and starts again while the summary is written.
        await journal.delete_stream("s")
        await journal.append("s", Said(text="new-a"))
        return Chat(summary="summary of the old history")

    result = await journal.checkpoint(fold, "s", next_state)
    assert result == Chat(turns=(Turn(text="new-a"),))
    assert await cold(store, fold) == result
    assert [s.reason for s in journal.folds.skipped] == ["checkpoint"]


class ContainsHook(RecordingStore):
    """Runs ``hook`` once, right after the next ``contains`` answered."""

    hook: Callable[[], Awaitable[None]] | None = None

    async def contains(self, namespace: str, stream: str, cursor: str) -> bool:
        found = await super().contains(namespace, stream, cursor)
        hook, self.hook = self.hook, None
        if hook is not None:
            await hook()
        return found


async def test_a_history_deleted_again_during_a_reset_read_is_read_from_its_start() -> None:
    # A stale cursor resets the read to the newest checkpoint; when the history is deleted
    # again right after that checkpoint was checked, the read resets once more. It must not
    # return (and cache) the checkpoint of the deleted history as the state.
    store = ContainsHook(MemoryStore())
    journal = cf.Journal(store)
    fold = chat_fold()
    await journal.append("s", Said(text="first"))
    await journal.fold(fold, "s")  # cached, with a cursor of the first history
    await journal.delete_stream("s")
    await journal.append("s", [Said(text="second-a"), Said(text="second-b")])
    await cf.Journal(store).checkpoint(fold, "s", summarize_all_but(0, "second"))

    async def start_again() -> None:
        await journal.delete_stream("s")
        await journal.append("s", Said(text="third"))

    store.hook = start_again
    assert await journal.fold(fold, "s") == Chat(turns=(Turn(text="third"),))
    assert await journal.fold(fold, "s") == await cold(store, fold)


class ForgetsCursors(RecordingStore):
    """A broken store: contains() knows every cursor, read() after any cursor resets."""

    async def read(
        self,
        namespace: str,
        stream: str,
        *,
        after: str | None,
        types: Sequence[str] | None,
        limit: int | None,
    ) -> cf.ReadResult:
        page = await super().read(namespace, stream, after=None, types=types, limit=limit)
        return dataclasses.replace(page, reset=after is not None)


async def test_a_store_resetting_every_read_fails_the_read_instead_of_looping() -> None:
    store = ForgetsCursors(MemoryStore())
    fold = chat_fold()
    await cf.Journal(store.inner).append("s", [Said(text="a"), Said(text="b")])
    await cf.Journal(store.inner).checkpoint(fold, "s", summarize_all_but(0))
    with pytest.raises(cf.StoreError, match="reset the history of stream 's' on 4 reads"):
        await cf.Journal(store).fold(fold, "s")


# -- what cannot checkpoint --------------------------------------------------------------------


async def test_an_invalid_new_state_is_rejected_and_nothing_is_appended(
    store: RecordingStore,
) -> None:
    journal = cf.Journal(store)
    fold = chat_fold()
    await journal.append("s", [Said(text="a")])
    before = await journal.fold(fold, "s")
    version = await journal.version("s")
    invalid: list[object] = [
        "not a chat",
        {"turns": "nope"},
        {"summary": 5, "turns": []},
        # Strict encoding: a field the schema does not know is an error, not dropped.
        {"summary": "x", "turns": [], "unknown": 1},
        {"turns": [{"role": "user", "text": "t", "extra": True}]},
    ]
    for bad in invalid:

        def next_state(state: Chat, bad: object = bad) -> object:
            return bad

        with pytest.raises(cf.CheckpointError) as caught:
            await journal.checkpoint(fold, "s", next_state)  # type: ignore[arg-type]
        assert caught.value.reason == "invalid-state"
        assert isinstance(caught.value.__cause__, ValidationError)
    assert await journal.version("s") == version
    assert await journal.fold(fold, "s") == before


async def test_an_invalid_segmented_state_is_rejected(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = cf.SegmentedFold("segchat", data=Turn, summary=str, tag=None)
    fold.open(Said)(lambda ev: cf.Segment(f"p{ev.position}", Turn(text=ev.payload.text)))
    await journal.append("s", Said(text="a"))
    version = await journal.version("s")
    invalid: list[object] = [
        ("not", "a", "state"),
        cf.SegmentedState([cf.Segment("x", {"role": "robot", "text": "t"})]),
        cf.SegmentedState([cf.Segment("x", {"role": "user", "text": "t", "extra": 1})]),
        cf.SegmentedState([], summary=5),
    ]
    for bad in invalid:

        def next_state(state: cf.SegmentedState[Any, Any], bad: object = bad) -> object:
            return bad

        with pytest.raises(cf.CheckpointError) as caught:
            await journal.checkpoint(fold, "s", next_state)  # type: ignore[arg-type]
        assert caught.value.reason == "invalid-state"
    assert await journal.version("s") == version


async def test_an_error_in_next_publishes_nothing(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = chat_fold()
    await journal.append("s", Said(text="a"))
    boom = RuntimeError("model unavailable")

    async def failing(state: Chat) -> Chat:
        raise boom

    with pytest.raises(cf.CheckpointError) as caught:
        await journal.checkpoint(fold, "s", failing)
    assert caught.value.__cause__ is boom and caught.value.reason == "next-failed"
    assert await journal.version("s") == 1


async def test_folds_that_take_no_checkpoints_are_unsupported(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    plain: cf.Fold[tuple[str, ...]] = cf.Fold("plain", initial=tuple)
    plain.on(Said)(lambda s, ev: (*s, ev.payload.text))
    run_scoped: cf.Fold[Chat] = cf.Fold("run_chat", state=Chat, scope="run")
    run_scoped.on(Said)(lambda s, ev: s)
    run_segmented = cf.SegmentedFold("run_seg", data=str, summary=str, scope="run", tag=None)
    run_segmented.open(Said)(lambda ev: cf.Segment("x", ev.payload.text))
    await journal.append("s", Said(text="a"), run_id="r")
    folds: tuple[FoldBase[Any], ...] = (plain, run_scoped, run_segmented)
    for fold in folds:
        assert not fold.can_checkpoint
        with pytest.raises(cf.CheckpointError) as caught:
            await journal.checkpoint(fold, "s", lambda s: s)
        assert caught.value.reason == "unsupported"
    assert await journal.version("s") == 1


async def test_a_fold_made_with_checkpoints_false_never_uses_them(
    store: RecordingStore,
) -> None:
    journal = cf.Journal(store)
    fold: cf.Fold[Chat] = cf.Fold("cutoff_chat", state=Chat, checkpoints=False)
    fold.on(Said)(
        lambda s, ev: s.model_copy(update={"turns": (*s.turns, Turn(text=ev.payload.text))})
    )
    await journal.append("s", [Said(text="a"), Said(text="b")])
    assert not fold.can_checkpoint
    with pytest.raises(cf.CheckpointError) as caught:
        await journal.checkpoint(fold, "s", summarize_all_but(1))
    assert caught.value.reason == "unsupported"
    assert await journal.version("s") == 2  # nothing published

    # A checkpoint stored under its name anyway is never read, warm or cold.
    await journal.append(
        "s",
        cf.RawEvent(fold.checkpoint_type, {"through": None, "state": {"summary": "forged"}}),
        channels=(),
    )
    await journal.append("s", Said(text="c"))
    pure = fold.apply_all(
        fold.initial_state(),
        envelopes(Said(text=t) for t in "abc"),
    )
    assert await journal.fold(fold, "s") == pure
    assert await cf.Journal(store).fold(fold, "s") == pure


async def test_the_agent_context_compacts_by_cutoff_only(store: RecordingStore) -> None:
    # Request rebuilds fold its events alone: a checkpoint would make live requests differ.
    journal = cf.Journal(store)
    await journal.append("s", cf.ContextAdded(role="user", content="hi"))
    assert not cf.AgentContext.can_checkpoint
    with pytest.raises(cf.CheckpointError) as caught:
        await journal.checkpoint(cf.AgentContext, "s", lambda state: state)
    assert caught.value.reason == "unsupported"
    assert await journal.version("s") == 1


async def test_compacting_the_agent_context_says_what_compacts_it(store: RecordingStore) -> None:
    """The obvious first try, journal.compact(cf.AgentContext, …), names what to call."""
    journal = cf.Journal(store)
    await journal.append("s", cf.ContextAdded(role="user", content="hi"))
    view = cf.ContextView(cf.SegmentedFold("unrelated", data=str, tag=None))
    with pytest.raises(cf.CompactionError) as caught:
        await journal.compact(
            cf.AgentContext,  # type: ignore[arg-type]
            "s",
            view=view,
            budget=100,
            summarize=lambda **_: "summary",
        )
    message = str(caught.value)
    assert caught.value.reason == "unsupported" and "agent_context" in message
    for named in ("compaction_threshold", "build_summary_request", "summary_item"):
        assert named in message, named
    assert await journal.version("s") == 1
    # A plain fold of one's own is pointed at checkpoints instead.
    plain: cf.Fold[int] = cf.Fold("plain_count", initial=lambda: 0)
    with pytest.raises(cf.CompactionError, match=r"journal\.checkpoint\(fold, stream, next\)"):
        await journal.compact(plain, "s", view=view, budget=100, summarize=str)  # type: ignore[arg-type]


# -- events during a checkpoint, races -----------------------------------------------------------


async def test_events_appended_while_next_runs_are_folded_on_top(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = chat_fold()
    await journal.append("s", [Said(text="a"), Said(text="b")])

    async def next_state(state: Chat) -> Chat:
        await journal.append("s", Said(text="during-1"))
        await asyncio.sleep(0)
        await journal.append("s", Said(text="during-2"))
        return Chat(summary=",".join(texts(state)))

    result = await journal.checkpoint(fold, "s", next_state)
    assert result == Chat(summary="a,b", turns=(Turn(text="during-1"), Turn(text="during-2")))
    assert await journal.fold(fold, "s") == result
    assert await cold(store, fold) == result


async def test_concurrent_checkpoints_the_one_appended_last_wins(
    store: RecordingStore,
) -> None:
    journal = cf.Journal(store)
    fold = chat_fold()
    await journal.append("s", [Said(text="a"), Said(text="b")])
    read, gate = asyncio.Event(), asyncio.Event()

    async def slow(state: Chat) -> Chat:  # computed from the older read, appended last
        read.set()
        await gate.wait()
        return Chat(summary="slow:" + ",".join(texts(state)))

    slow_task = asyncio.create_task(journal.checkpoint(fold, "s", slow))
    # The slow compaction has read [a, b] and waits. Not a sleep: on a slow machine the
    # store could still be reading when "c" is appended.
    await read.wait()
    await journal.append("s", Said(text="c"))
    fast = await journal.checkpoint(fold, "s", lambda s: Chat(summary="fast:" + ",".join(texts(s))))
    assert fast == Chat(summary="fast:a,b,c")
    gate.set()
    slow_result = await slow_task

    # The slow checkpoint was appended last: it wins, and "c" (after its through) is on top.
    expected = Chat(summary="slow:a,b", turns=(Turn(text="c"),))
    assert slow_result == expected
    assert await journal.fold(fold, "s") == expected
    assert await cold(store, fold) == expected


async def test_gathered_checkpoints_agree_with_a_rebuild(store: RecordingStore) -> None:
    journal = cf.Journal(store)
    fold = chat_fold()
    await journal.append("s", [Said(text=str(i)) for i in range(5)])

    async def keep(n: int, state: Chat) -> Chat:
        await asyncio.sleep(0)
        return summarize_all_but(n, f"keep{n}")(state)

    results = await asyncio.gather(
        journal.checkpoint(fold, "s", lambda s: keep(1, s)),
        journal.checkpoint(fold, "s", lambda s: keep(2, s)),
    )
    final = await journal.fold(fold, "s")
    assert final == await cold(store, fold)
    [winner] = await journal.latest("s", [fold.checkpoint_type])
    assert final.summary == winner.payload["state"]["summary"]
    assert results[-1] == final or results[0] == final


# -- identity ----------------------------------------------------------------------------------


async def test_two_checkpointing_folds_with_one_name_and_version_fail(
    store: RecordingStore,
) -> None:
    journal = cf.Journal(store)
    first, second = chat_fold(), chat_fold()
    await journal.append("s", Said(text="a"))
    await journal.fold(first, "s")
    with pytest.raises(cf.FoldDefinitionError, match="fold-checkpoint-shared"):
        await journal.fold(second, "s")
    with pytest.raises(cf.FoldDefinitionError, match="fold-checkpoint-shared"):
        await journal.checkpoint(second, "s", lambda s: s)
    # The same object, read again, and other journals are fine.
    await journal.fold(first, "s")
    assert await cf.Journal(store).fold(second, "s") == await journal.fold(first, "s")


async def test_checkpointing_folds_sharing_a_name_across_versions_warn(
    store: RecordingStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Of one name, two versions restore only their own checkpoints (no failure), but they
    share the name's metrics: that is warned, once per fold object."""
    journal = cf.Journal(store)
    first, second = chat_fold(version=1), chat_fold(version=2)
    await journal.append("s", Said(text="a"))
    with caplog.at_level(logging.WARNING, logger="contextfold.folds"):
        await journal.fold(first, "s")
        await journal.checkpoint(second, "s", summarize_all_but(0))
        await journal.fold(second, "s")
    [warned] = [r.getMessage() for r in caplog.records if "fold-name-shared" in r.getMessage()]
    assert "'chat'" in warned and "versions 1 and 2" in warned
    assert texts(await journal.fold(first, "s")) == ["a"]  # v2's checkpoint is not v1's


async def test_folds_sharing_a_name_but_no_checkpoints_only_warn(
    store: RecordingStore, caplog: pytest.LogCaptureFixture
) -> None:
    journal = cf.Journal(store)
    calls: list[str] = []

    def plain() -> cf.Fold[tuple[str, ...]]:
        fold: cf.Fold[tuple[str, ...]] = cf.Fold("shared", initial=tuple)

        @fold.on(Said)
        def _said(state: tuple[str, ...], ev: cf.Envelope[Said]) -> tuple[str, ...]:
            calls.append(ev.payload.text)
            return (*state, ev.payload.text)

        return fold

    first, second = plain(), plain()
    await journal.append("s", Said(text="a"))
    with caplog.at_level(logging.WARNING, logger="contextfold.folds"):
        assert await journal.fold(first, "s") == ("a",)
        assert await journal.fold(second, "s") == ("a",)
        await journal.append("s", Said(text="b"))
        assert await journal.fold(second, "s") == ("a", "b")
    # Once per fold object, not per read: its definition is checked once.
    assert caplog.text.count("fold-name-shared") == 1
    assert calls == ["a", "a", "b", "b"]  # each fold object has a state of its own
