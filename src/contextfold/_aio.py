"""Small asyncio helpers shared by the stores and the runtime."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable

__all__ = ["CancelWatch", "finish"]

log = logging.getLogger("contextfold")


class CancelWatch:
    """Notices a cancel of the running task that an awaited library swallowed.

    On Python 3.11, ``asyncio.wait_for`` (used inside drivers and pools) returns normally when
    a cancel lands just as what it waits for completes. The task's cancel request stays
    counted (``Task.cancelling()``), so a long-running loop checks it at each turn rather
    than going on (a live tail polling forever, an agent making a paid model call).

    Only requests made after the watch was created count, as with ``asyncio.timeout``: a
    task that caught and kept a cancel earlier (without ``uncancel``) is not stopped by it.
    Checked from another task, the watch starts counting there.
    """

    __slots__ = ("_baseline", "_task")

    def __init__(self) -> None:
        try:
            self._task = asyncio.current_task()
        except RuntimeError:  # made outside a running loop: counting starts at the first check
            self._task = None
        self._baseline = self._task.cancelling() if self._task is not None else 0

    def requested(self) -> bool:
        """Whether the running task was asked to cancel since the watch started."""
        task = asyncio.current_task()
        if task is not self._task:
            self._task = task
            self._baseline = task.cancelling() if task is not None else 0
            return False
        return task is not None and task.cancelling() > self._baseline

    def check(self) -> None:
        """Raise CancelledError when :meth:`requested`."""
        if self.requested():
            raise asyncio.CancelledError


async def finish(cleanup: Awaitable[None]) -> None:
    """Run ``cleanup`` to its end for a caller that is handling a cancel (and re-raises it),
    even when the task is cancelled again meanwhile. ``asyncio.shield`` alone returns at the
    next cancel and leaves the cleanup running on, unawaited, after the task ended.

    A failing cleanup is logged, never raised: it must not turn the cancel into an error
    (a task cancelled at shutdown still ends cancelled). Under an anyio cancel scope, which
    re-delivers its cancel at every await, this waits in a busy loop for the cleanup's
    length (observer writes: milliseconds).
    """
    task = asyncio.ensure_future(cleanup)
    while not task.done():
        # A cancel here does not reach the cleanup; the caller re-raises the one it handles.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task})
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("cleanup after a cancel failed: %s", error, exc_info=error)
