"""The session prefix instance discards a composition a cancel landed in."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from contextfold.render.prefix import SessionPrefix
from contextfold.wire import NeutralMessage


async def test_a_swallowed_cancel_is_not_cached_and_the_next_call_composes_again() -> None:
    entered, calls = asyncio.Event(), []
    prefix = SessionPrefix()

    @prefix.contributor
    async def abort_aware(next_: Any) -> tuple[NeutralMessage, ...]:
        calls.append(1)
        if len(calls) == 1:
            entered.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.Event().wait()
            return (NeutralMessage(role="user", content="DEGRADED"), *await next_())
        return (NeutralMessage(role="user", content="fresh"), *await next_())

    instance = prefix.instance()
    task = asyncio.create_task(instance.get())
    await entered.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert task.cancelled() and instance.composed is None and instance.compositions == 0
    assert [m.content for m in await instance.get()] == ["fresh"]
    assert [m.content for m in await instance.get()] == ["fresh"] and instance.compositions == 1
