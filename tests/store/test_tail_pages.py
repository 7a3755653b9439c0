"""A live tail's reads hold at most ``TAIL_BUFFER_BYTES`` of events (one event at least),
so a reader that stops reading keeps little of the journal in memory."""

from __future__ import annotations

from contextfold.store import MemoryStore
from contextfold.store.base import TAIL_BUFFER_BYTES, TailPages
from contextfold.store.contract import new_event
from contextfold.testing import RecordingStore

NAMESPACE = "default"


async def test_each_read_holds_at_most_the_buffer_and_every_event_comes_once() -> None:
    store = MemoryStore()
    quarter = TAIL_BUFFER_BYTES // 4
    sizes = [quarter] * 9 + [3 * TAIL_BUFFER_BYTES] + [10] * 3
    events = [new_event("e", {"i": i, "pad": "x" * size}) for i, size in enumerate(sizes)]
    await store.append(NAMESPACE, "s", events, expected_version=None, idempotency_key=None)
    pages = TailPages(store, NAMESPACE, "s", None)
    handed: list[int] = []
    held: list[int] = []
    while True:
        reset, stack = await pages.read()
        assert reset is None
        held.append(sum(len(event.data) for event in stack))
        if len(stack) > 1:
            assert held[-1] <= TAIL_BUFFER_BYTES
        while stack:
            handed.append(stack.pop().payload["i"])
        if not pages.more:
            break
    assert handed == list(range(len(sizes)))
    assert max(held) > TAIL_BUFFER_BYTES  # the large event, alone
    assert len(held) > 4  # the quarter-sized events came in pages of three


async def test_a_read_after_an_unknown_cursor_says_reset_first() -> None:
    store = MemoryStore()
    await store.append(
        NAMESPACE, "s", [new_event("e", {"i": 1})], expected_version=None, idempotency_key=None
    )
    pages = TailPages(store, NAMESPACE, "s", "999")
    reset, stack = await pages.read()
    assert reset is not None and reset.after == "999"
    assert [event.payload["i"] for event in reversed(stack)] == [1]


async def test_the_first_read_asks_for_a_small_page_then_pages_grow() -> None:
    store = RecordingStore()
    events = [new_event("e", {"i": i}) for i in range(200)]
    await store.append(NAMESPACE, "s", events, expected_version=None, idempotency_key=None)
    pages = TailPages(store, NAMESPACE, "s", None)
    handed = 0
    while True:
        _, stack = await pages.read()
        handed += len(stack)
        if not pages.more:
            break
    limits = [call.args["limit"] for call in store.reads]
    assert handed == 200
    assert limits[0] <= 16
    assert limits[:4] == [16, 32, 64, 128]  # doubled while whole pages fitted
