"""The session prefix: request-only messages placed right after the system slot.

Contributors compose as a waterfall: each gets ``next`` and returns an extension of what
``next()`` returns, canonically a prepend (``(mine, *await next())``), so registration
order is wire order. A :class:`SessionPrefix` composes once per loop instance, lazily
before its first step; the result is frozen and reused by every request of the instance.
It never enters the derived history: its one durable record is the instance's request
header snapshot. A composition interrupted by cancellation is discarded, and the next
turn composes again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from ..errors import RenderError
from ..wire import NeutralMessage

__all__ = ["Contributor", "PrefixInstance", "SessionPrefix", "compose_prefix"]

Next = Callable[[], Awaitable[tuple[NeutralMessage, ...]]]
Contributor = Callable[[Next], Awaitable[Sequence[NeutralMessage]]]

_SEED: tuple[NeutralMessage, ...] = ()


async def compose_prefix(contributors: Sequence[Contributor]) -> tuple[NeutralMessage, ...]:
    """Run the waterfall once and return the composed, frozen prefix."""

    async def run(index: int) -> tuple[NeutralMessage, ...]:
        if index == len(contributors):
            return _SEED
        contributed = await contributors[index](lambda: run(index + 1))
        messages = tuple(contributed)
        for message in messages:
            if not isinstance(message, NeutralMessage):
                raise RenderError(
                    f"session prefix contributor {index} returned {type(message).__name__}; "
                    "contributors return NeutralMessage objects"
                )
            if message.role in ("system", "tool") or message.tool_calls:
                raise RenderError(
                    f"session prefix contributor {index}: a prefix message is user, developer "
                    f"or assistant text, not {message.role!r}"
                )
        return messages

    return await run(0)


class SessionPrefix:
    """The contributors of one agent, and the composition cached per loop instance."""

    def __init__(self, contributors: Sequence[Contributor] = ()) -> None:
        self._contributors: list[Contributor] = list(contributors)

    def contributor(self, fn: Contributor) -> Contributor:
        """Register a contributor (decorator); registration order is wire order."""
        self._contributors.append(fn)
        return fn

    def instance(self) -> PrefixInstance:
        """A new loop instance's view: composes on first use, then stays frozen."""
        return PrefixInstance(tuple(self._contributors))


class PrefixInstance:
    """The prefix of one loop instance: composed at most once successfully."""

    def __init__(self, contributors: tuple[Contributor, ...]) -> None:
        self._contributors = contributors
        self._composed: tuple[NeutralMessage, ...] | None = None
        self.compositions = 0

    @property
    def composed(self) -> tuple[NeutralMessage, ...] | None:
        return self._composed

    async def get(self) -> tuple[NeutralMessage, ...]:
        """The instance's prefix, composing it now if this is the first step.

        A cancel landing inside the composition discards it, even when a contributor
        swallowed the cancel and returned a degraded fallback: that value reaches neither
        this request nor a later one, and the next call composes again.
        """
        if self._composed is None:
            task = asyncio.current_task()
            cancels = task.cancelling() if task is not None else 0
            composed = await compose_prefix(self._contributors)
            if task is not None and task.cancelling() > cancels:
                raise asyncio.CancelledError
            self._composed = composed
            self.compositions += 1
        return self._composed
