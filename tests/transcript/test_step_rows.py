"""A step's start and finish are two rows: a finish never overwrites its start, and a journal
written when the two shared one id rebuilds into both rows, in stream order."""

from __future__ import annotations

from typing import Any

import pytest

import contextfold as cf
from contextfold.errors import InvalidInputError
from contextfold.transcript import (
    MessageStarted,
    SQLiteTranscriptStore,
    StepFinished,
    StepFinishPart,
    StepStarted,
    StepStartPart,
    TextEnd,
    TextStart,
    TranscriptStore,
    TranscriptWriter,
    read_history,
    rebuild,
)
from contextfold.transcript.projector import LEGACY_FINISH_SUFFIX
from contextfold.wire import Usage

S = "session-1"
M = "msg-a"


async def test_a_step_finish_reusing_the_step_start_id_is_refused(store: TranscriptStore) -> None:
    writer = TranscriptWriter(store)
    await writer.publish(MessageStarted(session=S, message_id=M, role="assistant", time="t0"))
    start = await writer.publish(StepStarted(session=S, message_id=M, part_id="step", time="t1"))
    finish = StepFinished(session=S, message_id=M, part_id="step", time="t2", reason="stop")
    with pytest.raises(InvalidInputError, match="'step' of session 'session-1' is a step-start"):
        await writer.publish(finish)
    with pytest.raises(InvalidInputError, match="is a step-start part"):
        await TranscriptWriter(store).publish(finish)  # read back from the store
    assert await store.get_part(S, "step") == start
    # And a step-start never replaces a finished step's row either.
    await writer.publish(finish.model_copy(update={"part_id": "step-end"}))
    with pytest.raises(InvalidInputError, match="is a step-finish part"):
        await writer.publish(StepStarted(session=S, message_id=M, part_id="step-end", time="t3"))


async def test_a_journal_with_shared_step_ids_rebuilds_both_rows_in_stream_order(
    tmp_path: Any,
) -> None:
    usage = Usage(input_tokens=12, output_tokens=3)
    async with cf.open_journal(f"sqlite:///{tmp_path / 'journal.db'}") as journal:
        await journal.append(
            S,
            [
                MessageStarted(session=S, message_id=M, role="assistant", time="t0"),
                StepStarted(session=S, message_id=M, part_id="step-1", time="t1"),
                TextStart(session=S, message_id=M, part_id="text-1", time="t1"),
                TextEnd(session=S, message_id=M, part_id="text-1", time="t2", text="hi"),
                StepFinished(
                    session=S, message_id=M, part_id="step-1", time="t2", reason="stop", usage=usage
                ),
            ],
        )
        async with SQLiteTranscriptStore(tmp_path / "rebuilt.db") as store:
            assert await rebuild(journal, S, store) == 4
            [entry] = await read_history(store, S)
    assert [p.kind for p in entry.parts] == ["step-start", "text", "step-finish"]
    start, _text, finish = entry.parts
    assert isinstance(start, StepStartPart) and start.id == "step-1" and start.time == "t1"
    assert isinstance(finish, StepFinishPart) and finish.usage == usage
    assert finish.id == "step-1" + LEGACY_FINISH_SUFFIX
