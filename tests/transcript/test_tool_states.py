"""Tool parts move only pending → running → completed | error; a late transition is refused
(nothing written, appended or broadcast) and the part keeps its state and output."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import contextfold as cf
from contextfold.errors import InvalidInputError
from contextfold.transcript import (
    MessageStarted,
    SQLiteTranscriptStore,
    ToolPart,
    ToolStateChanged,
    TranscriptBus,
    TranscriptStore,
    TranscriptWriter,
    project,
    read_history,
    rebuild,
)
from contextfold.transcript.parts import ToolState

S = "session-1"
M = "msg-a"
TOOL = {"session": S, "message_id": M, "part_id": "call", "call_id": "c1", "tool": "grep"}
RANK = {"pending": 0, "running": 1, "completed": 2, "error": 2}


def move(state: ToolState, time: str, **fields: Any) -> ToolStateChanged:
    if state == "completed":
        fields.setdefault("output", f"output at {time}")
    if state == "error":
        fields.setdefault("error", f"error at {time}")
    return ToolStateChanged(**TOOL, state=state, time=time, **fields)


async def started(store: TranscriptStore, **options: Any) -> TranscriptWriter:
    writer = TranscriptWriter(store, **options)
    await writer.publish(MessageStarted(session=S, message_id=M, role="assistant", time="t0"))
    return writer


@pytest.mark.parametrize(
    ("final", "late"),
    [
        ("completed", "error"),
        ("completed", "running"),
        ("completed", "pending"),
        ("completed", "completed"),  # another output would replace the first
        ("error", "completed"),
        ("error", "running"),
    ],
)
async def test_a_late_transition_after_a_final_state_is_refused(
    store: TranscriptStore, tmp_path: Any, final: ToolState, late: ToolState
) -> None:
    bus = TranscriptBus()
    sub = bus.subscribe(S)
    journal = cf.open_journal(f"sqlite:///{tmp_path / 'journal.db'}")
    writer = await started(store, bus=bus, journal=journal)
    await writer.publish(move("pending", "t1"))
    await writer.publish(move("running", "t2", input={"pattern": "x"}))
    closed = await writer.publish(move(final, "t3"))
    sub.drain()
    head = await journal.head(S)

    with pytest.raises(InvalidInputError, match=rf"'call' of session '{S}' is already {final}"):
        await writer.publish(move(late, "t4"))
    # A new writer (the row read from the store, not from memory) refuses it too.
    with pytest.raises(InvalidInputError, match="refused"):
        await TranscriptWriter(store).publish(move(late, "t4"))

    part = await store.get_part(S, "call")
    assert part == closed
    assert isinstance(part, ToolPart) and part.state == final
    assert (part.output, part.error) == (closed.output, closed.error)  # type: ignore[union-attr]
    assert sub.pending == 0  # nothing announced
    assert await journal.head(S) == head  # nothing appended
    await journal.close()


async def test_a_transition_back_is_refused(store: TranscriptStore) -> None:
    writer = await started(store)
    await writer.publish(move("running", "t1", input={"a": 1}))
    with pytest.raises(InvalidInputError, match="cannot move back to pending"):
        await writer.publish(move("pending", "t2"))
    part = await store.get_part(S, "call")
    assert isinstance(part, ToolPart) and (part.state, part.input) == ("running", {"a": 1})


async def test_the_same_final_transition_replayed_changes_nothing(store: TranscriptStore) -> None:
    bus = TranscriptBus()
    sub = bus.subscribe(S)
    writer = await started(store, bus=bus)
    await writer.publish(move("running", "t1"))
    done = await writer.publish(move("completed", "t2", output="3 matches"))
    sub.drain()
    replay = move("completed", "t2", output="3 matches")
    assert await writer.publish(replay) == done
    assert await TranscriptWriter(store).publish(replay) == done
    assert sub.pending == 0 and await store.get_part(S, "call") == done


async def test_rebuild_skips_a_late_transition_in_the_journal(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A journal holding a late transition (written by hand, or before the rule) rebuilds
    the part as it was when it reached its final state, and says what it skipped."""
    async with cf.open_journal(f"sqlite:///{tmp_path / 'journal.db'}") as journal:
        await journal.append(
            S,
            [
                MessageStarted(session=S, message_id=M, role="assistant", time="t0"),
                move("running", "t1"),
                move("completed", "t2", output="kept"),
                move("error", "t3", error="late"),
            ],
        )
        async with SQLiteTranscriptStore(tmp_path / "rebuilt.db") as store:
            await rebuild(journal, S, store)
            [entry] = await read_history(store, S)
    [part] = entry.parts
    assert isinstance(part, ToolPart) and (part.state, part.output) == ("completed", "kept")
    assert "already completed" in caplog.text and f"{S}#4" in caplog.text


states = st.sampled_from(["pending", "running", "completed", "error"])


@given(
    st.lists(
        st.tuples(states, st.sampled_from(["t1", "t2"]), st.sampled_from(["a", "b"])),
        max_size=12,
    )
)
def test_a_part_only_moves_forward_and_a_final_part_never_changes(
    moves: list[tuple[ToolState, str, str]],
) -> None:
    row: ToolPart | None = None
    for state, time, text in moves:
        event = move(state, time, output=text) if state == "completed" else move(state, time)
        try:
            new = project(event, row)
        except InvalidInputError:
            assert row is not None
            assert row.state in ("completed", "error") or RANK[state] < RANK[row.state]
            continue
        assert isinstance(new, ToolPart)
        if row is not None:
            assert RANK[new.state] >= RANK[row.state]
            if row.state in ("completed", "error"):
                assert new == row  # only an exact replay passes, and changes nothing
        row = new
