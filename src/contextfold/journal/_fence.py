"""What a fenced journal (:meth:`Journal.fenced`) hands one stream's appends to."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from ..events import Event, NewEvent, RawEvent
from ..store.base import AppendResult

__all__ = ["StreamFence", "known_to"]


class StreamFence(Protocol):
    """Appends to one stream go through it, and it may know where that stream is without
    asking the store. A lease holder's fence (``runtime.fence.StreamLease``) is one."""

    stream: str

    @property
    def known(self) -> tuple[int, str | None] | None:
        """The stream's version and head (its cursor, None when not known) as the fence
        knows them without asking the store; None when it does not: folds ask the store."""

    async def append(
        self,
        events: Event | RawEvent | NewEvent | Iterable[Event | RawEvent | NewEvent],
        *,
        expected_version: int | None,
        idempotency_key: str | None,
        run_id: str | None,
        actor: str | None,
        channels: Sequence[str],
    ) -> AppendResult:
        """Append to the stream as :meth:`Journal.append` does (through the journal the
        fence was given, not the fenced one), or raise."""


def known_to(fence: StreamFence | None, stream: str) -> dict[str, Any]:
    """Where ``fence`` knows ``stream`` is, as the fold reader takes it (empty: unknown, or
    another stream than the fence's)."""
    known = fence.known if fence is not None and stream == fence.stream else None
    if known is None:
        return {}
    version, head = known
    if head is None:
        return {"known_version": version}
    return {"known_version": version, "known_head": head}
