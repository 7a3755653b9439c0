"""A cold fold read keeps the garbage collector to young collections and always restores it."""

from __future__ import annotations

import gc

import pytest

import contextfold as cf
from contextfold.examples import coding_assistant as ca


async def test_the_older_generations_wait_while_folding_and_are_restored_after() -> None:
    seen: list[tuple[int, ...]] = []
    thresholds = gc.get_threshold()
    journal = cf.open_journal("memory://")
    try:
        await journal.append("s", [ca.UserPrompt(text=f"q{i}") for i in range(5)])
        original = ca.Conversation.apply_reporting

        def spy(state: object, envelope: object) -> object:
            seen.append(gc.get_threshold())
            return original(state, envelope)  # type: ignore[arg-type]

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ca.Conversation, "apply_reporting", spy)
            assert gc.isenabled()
            state = await journal.fold(ca.Conversation, "s")
        assert len(state.segments) == 5
        assert seen == [(thresholds[0], 2**31 - 1, 2**31 - 1)] * 5  # young ones only
        assert gc.isenabled() and gc.get_threshold() == thresholds
        gc.disable()  # a caller that disabled it keeps it disabled
        try:
            await journal.append("s", ca.UserPrompt(text="more"))
            await journal.fold(ca.Conversation, "s")
            assert not gc.isenabled()
        finally:
            gc.enable()
    finally:
        await journal.close()
