"""The bus: per-session topics, publish order, and the policy for slow subscribers."""

from __future__ import annotations

import asyncio
import json

import pytest

from contextfold.errors import InvalidInputError
from contextfold.transcript import (
    BusOverflowError,
    Message,
    MessageUpdated,
    PartDelta,
    PartUpdated,
    TextPart,
    TranscriptBus,
    encode_bus_event,
)


def delta(i: int, session: str = "s", namespace: str = "default") -> PartDelta:
    return PartDelta(
        namespace=namespace,
        session=session,
        message_id="m",
        part_id="p",
        part_kind="text",
        delta=str(i),
    )


async def test_a_subscriber_receives_events_in_publish_order() -> None:
    bus = TranscriptBus()
    sub = bus.subscribe("s")
    received: list[str] = []

    async def consume() -> None:
        async for event in sub:
            assert isinstance(event, PartDelta)
            received.append(event.delta)

    task = asyncio.create_task(consume())
    for i in range(500):
        assert bus.publish(delta(i)) == 1
        if i % 50 == 0:
            await asyncio.sleep(0)  # let the consumer run in between
    sub.close()
    await asyncio.wait_for(task, 5)
    assert received == [str(i) for i in range(500)]
    assert bus.subscribers("s") == 0


async def test_topics_are_per_namespace_and_session() -> None:
    bus = TranscriptBus()
    a, b, c = bus.subscribe("s"), bus.subscribe("t"), bus.subscribe("s", namespace="other")
    bus.publish(delta(1, "s"))
    bus.publish(delta(2, "t"))
    bus.publish(delta(3, "s", namespace="other"))
    assert bus.publish(delta(4, "nobody")) == 0
    assert [e.delta for e in a.drain()] == ["1"]  # type: ignore[union-attr]
    assert [e.delta for e in b.drain()] == ["2"]  # type: ignore[union-attr]
    assert [e.delta for e in c.drain()] == ["3"]  # type: ignore[union-attr]


async def test_a_slow_subscriber_is_cut_off_and_never_blocks_the_writer() -> None:
    bus = TranscriptBus()
    slow = bus.subscribe("s", maxsize=5)
    fast = bus.subscribe("s")
    loop = asyncio.get_running_loop()
    began = loop.time()
    reached = [bus.publish(delta(i)) for i in range(10_000)]
    assert loop.time() - began < 2  # publish never waited for the slow subscriber
    assert reached[:5] == [2] * 5 and reached[5:] == [1] * 9_995
    assert slow.overflowed and bus.subscribers("s") == 1
    assert fast.pending == 10_000

    got = []
    with pytest.raises(BusOverflowError, match="re-read the transcript rows") as info:
        async for event in slow:
            got.append(event)
    assert [e.delta for e in got] == ["0", "1", "2", "3", "4"]  # type: ignore[union-attr]
    assert info.value.session == "s"
    with pytest.raises(BusOverflowError):  # it stays cut off
        await slow.__anext__()
    assert len(fast.drain()) == 10_000 and not fast.overflowed


async def test_a_subscriber_holding_too_many_bytes_is_cut_off() -> None:
    """The bound is in bytes too: a few large events cut off a reader that stopped reading,
    long before its count of events would; consumed events make room again."""
    bus = TranscriptBus()
    big = PartDelta(
        namespace="default",
        session="s",
        message_id="m",
        part_id="p",
        part_kind="text",
        delta="x" * 1000,
    )
    size = len(encode_bus_event(big))
    stalled = bus.subscribe("s", max_bytes=3 * size)
    reading = bus.subscribe("s", max_bytes=3 * size)
    for _ in range(3):
        assert bus.publish(big) == 2
    assert reading.drain() == [big] * 3  # a reader that reads stays subscribed
    assert bus.publish(big) == 1  # the fourth is over the stalled one's bytes
    assert stalled.overflowed and not reading.overflowed
    with pytest.raises(BusOverflowError, match=f"{3 * size} bytes behind"):
        async for _ in stalled:
            pass
    # One event larger than the bound still reaches a subscriber with nothing pending.
    small = bus.subscribe("s", max_bytes=size // 2)
    assert bus.publish(big) == 2 and small.drain() == [big]


async def test_close_delivers_what_was_queued_then_ends() -> None:
    bus = TranscriptBus()
    async with bus.subscribe("s") as sub:
        bus.publish(delta(1))
        sub.close()
        bus.publish(delta(2))  # after close: not delivered
        assert [e.delta async for e in sub] == ["1"]  # type: ignore[union-attr]
        assert [e async for e in sub] == []
    assert sub.pending == 0


async def test_a_waiting_subscriber_wakes_on_publish() -> None:
    bus = TranscriptBus()
    sub = bus.subscribe("s")
    waiter = asyncio.create_task(sub.__anext__())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    bus.publish(delta(7))
    event = await asyncio.wait_for(waiter, 10)
    assert isinstance(event, PartDelta) and event.delta == "7"


def test_maxsize_must_be_positive() -> None:
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InvalidInputError, match="maxsize"):
            TranscriptBus().subscribe("s", maxsize=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="max_bytes"):
            TranscriptBus().subscribe("s", max_bytes=bad)  # type: ignore[arg-type]


def test_events_encode_as_json_for_sse() -> None:
    message = Message(id="m", session="s", role="user", created="t")
    part = TextPart(id="p", session="s", message_id="m", text="hi")
    encoded = [
        json.loads(encode_bus_event(e))
        for e in (
            MessageUpdated(namespace="n", session="s", message=message),
            PartUpdated(namespace="n", session="s", part=part),
            delta(1),
        )
    ]
    assert [e["type"] for e in encoded] == ["message-updated", "part-updated", "part-delta"]
    assert encoded[0]["message"]["role"] == "user"
    assert encoded[1]["part"] == part.model_dump(mode="json")
    assert encoded[2] == {
        "type": "part-delta",
        "session": "s",
        "message_id": "m",
        "part_id": "p",
        "part_kind": "text",
        "delta": "1",
    }
