"""Helpers of the store tests."""

from __future__ import annotations

import asyncio

__all__ = ["until"]


async def until(condition: object) -> None:
    """Yield to the loop until ``condition()`` holds (no timing: each turn lets the worker
    and the loop's callbacks run)."""
    assert callable(condition)
    for _ in range(20_000):
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("condition never held")
