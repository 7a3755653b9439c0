"""What the store contract's suites share: the samples, how the suite makes events, and
the base that opens a fresh store for each test (see :mod:`contextfold.store.contract`)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from .. import canonical
from ..events import EventMeta, NewEvent, StoredEvent
from .base import AppendResult, ReadResult, Store, TailReset

__all__ = [
    "ABSURD_CURSORS",
    "JSON_SAMPLES",
    "NAMESPACE",
    "ContractBase",
    "deep",
    "new_event",
]

NAMESPACE = "contract"
"""The namespace the suite writes to (one test also uses two others)."""

JSON_SAMPLES: tuple[Any, ...] = (
    {},
    [],
    {"empty": {}, "list": [], "null": None, "t": True, "f": False},
    {"text": 'héllo wörld ✓ 日本語 🚀 \u0000 \u2028 "quoted" \\ back'},
    {"ints": [0, 1, -1, 2**31, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1]},
    {"floats": [0.1, -2.5, 1e308, 5e-324, 1.7976931348623157e308, 123456789.123456789]},
    {"deep": [[[[[[[[[[[[[[[[[[[[{"x": 1}]]]]]]]]]]]]]]]]]]]]},
    {"order": {"z": 1, "a": 2, "m": {"b": 1, "a": 2}}},
    "a bare string",
    12345,
)


ABSURD_CURSORS: tuple[str, ...] = (
    str(2**63),
    "9" * 19,
    str(2**64),
    "1" * 20,
    "7" * 10_000,
    "１２",  # fullwidth digits
    "\u0663",  # an Arabic-Indic digit
    "\ud800",
    " 1",
    "1 ",
    "+1",
    "-1",
    "0x1",
    "1.0",
)
"""Cursors no store ever hands out: each one is an unknown cursor, never an error."""

_IDS = itertools.count()


def new_event(
    type_name: str,
    payload: Any,
    *,
    run_id: str | None = None,
    actor: str | None = None,
    idempotency_key: str | None = None,
    channels: Sequence[str] = ("main",),
) -> NewEvent:
    """An event as the journal hands it to a store: canonical JSON, a fresh id, a time."""
    meta = EventMeta(
        f"contract-{next(_IDS)}",
        "2026-01-01T00:00:00+00:00",
        run_id,
        actor,
        idempotency_key,
        tuple(channels),
    )
    return NewEvent(type_name, canonical.dumps(payload), meta)


def _batch(type_name: str, payloads: Sequence[Any]) -> list[NewEvent]:
    return [new_event(type_name, p) for p in payloads]


async def _append(
    store: Store,
    stream: str,
    events: NewEvent | Sequence[NewEvent],
    *,
    expected_version: int | None = None,
    idempotency_key: str | None = None,
    namespace: str = NAMESPACE,
) -> AppendResult:
    batch = [events] if isinstance(events, NewEvent) else list(events)
    return await store.append(
        namespace, stream, batch, expected_version=expected_version, idempotency_key=idempotency_key
    )


async def _read(
    store: Store,
    stream: str,
    *,
    after: str | None = None,
    types: Sequence[str] | None = None,
    limit: int | None = None,
    namespace: str = NAMESPACE,
) -> ReadResult:
    return await store.read(namespace, stream, after=after, types=types, limit=limit)


def _payloads(page: ReadResult, field: str) -> list[Any]:
    return [e.payload[field] for e in page.events]


def _tail(
    store: Store, stream: str, *, after: str | None = None, poll_interval: float = 0.05
) -> AsyncIterator[StoredEvent | TailReset]:
    return store.subscribe(NAMESPACE, stream, after=after, poll_interval=poll_interval)


async def _next_event(tail: AsyncIterator[StoredEvent | TailReset]) -> StoredEvent:
    item = await anext(tail)
    assert isinstance(item, StoredEvent), f"expected an event, the tail yielded {item!r}"
    return item


async def _close(tail: AsyncIterator[Any]) -> None:
    aclose = getattr(tail, "aclose", None)
    if aclose is not None:
        await aclose()


class ContractBase:
    """Opens a fresh store per test: implement ``make_store``; override ``run`` if needed."""

    def make_store(self) -> Store:
        raise NotImplementedError("StoreContract subclasses implement make_store()")

    def run(self, test: Callable[[Store], Awaitable[None]]) -> None:
        async def main() -> None:
            store = self.make_store()
            try:
                await store.open()
                await test(store)
            finally:
                await store.close()

        asyncio.run(main())


def deep(depth: int) -> Any:
    value: Any = {"leaf": True}
    for i in range(depth):
        value = {"level": i, "next": value} if i % 2 else [value]
    return value
