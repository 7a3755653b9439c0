"""The store contract's live-tail cases: ``subscribe`` sees history then live events,
resumes after cursors, resets on unknown ones. Part of
:class:`~contextfold.store.contract.StoreContract`."""

from __future__ import annotations

import asyncio
import contextlib

from ..events import StoredEvent
from ._contract_support import (
    NAMESPACE,
    ContractBase,
    _append,
    _batch,
    _close,
    _next_event,
    _tail,
    new_event,
)
from .base import TAIL_BUFFER_BYTES, Store, TailReset

__all__ = ["TailContract"]


class TailContract(ContractBase):
    """What a store's ``subscribe`` must do."""

    def test_subscribe_sees_history_then_live_events(self) -> None:
        async def t(s: Store) -> None:
            first = await _append(s, "s", _batch("e", [{"i": 0}, {"i": 1}]))
            tail = _tail(s, "s", poll_interval=0.02)
            try:
                async with asyncio.timeout(10):
                    history = [await _next_event(tail), await _next_event(tail)]
                    await _append(s, "other", new_event("e", {"i": 100}))
                    await _append(s, "s", new_event("e", {"i": 2}))
                    await _append(s, "s", new_event("e", {"i": 3}))
                    live = [await _next_event(tail), await _next_event(tail)]
            finally:
                await _close(tail)
            assert [e.payload["i"] for e in history + live] == [0, 1, 2, 3]
            # a tail from a cursor starts after it
            later = _tail(s, "s", after=first.cursor)
            try:
                async with asyncio.timeout(10):
                    got = [await _next_event(later), await _next_event(later)]
            finally:
                await _close(later)
            assert [e.payload["i"] for e in got] == [2, 3]

        self.run(t)

    def test_a_cancelled_tail_ends_even_as_an_append_wakes_it(self) -> None:
        """Cancelling a waiting tail at any moment around a wake-up ends it: a lost cancel
        would leave an abandoned tail polling forever (and whoever awaits it hanging)."""

        async def t(s: Store) -> None:
            async def tail() -> None:
                async for _ in _tail(s, "s", poll_interval=10):
                    pass

            for ticks in range(6):
                task = asyncio.create_task(tail())
                await asyncio.sleep(0.02)  # the tail has drained the history and waits
                await _append(s, "s", new_event("e", {"i": ticks}))
                for _ in range(ticks):
                    await asyncio.sleep(0)
                task.cancel()
                done, _ = await asyncio.wait({task}, timeout=10)
                assert task in done, f"a tail cancelled {ticks} tick(s) after a wake-up ran on"
                assert task.cancelled()

        self.run(t)

    def test_a_task_that_kept_an_earlier_cancel_can_still_tail(self) -> None:
        """A task that caught a cancel and carried on (without ``uncancel``) still counts it
        in ``Task.cancelling()``: only cancels requested while the tail runs may end it."""

        async def t(s: Store) -> None:
            await _append(s, "s", new_event("e", {"i": 1}))

            async def carry_on_then_tail() -> int:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(60)  # cancelled below; the task decides to go on
                tail = _tail(s, "s")
                try:
                    return int((await _next_event(tail)).payload["i"])
                finally:
                    await _close(tail)

            task = asyncio.create_task(carry_on_then_tail())
            await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=10)
            assert task in done and not task.cancelled(), "the tail ended on a stale cancel"
            assert task.result() == 1

        self.run(t)

    def test_a_cancel_landing_as_a_tail_closes_is_not_lost(self) -> None:
        """A consumer cancelled just as it closes its tail stays cancelled: a backend's
        clean-up (stopping a listener, say) must not swallow the consumer's cancel."""

        async def t(s: Store) -> None:
            await _append(s, "s", new_event("e", {}))
            ran_on = False

            async def consume() -> None:
                nonlocal ran_on
                tail = _tail(s, "s")
                async with contextlib.aclosing(tail):  # type: ignore[type-var]
                    async for _ in tail:
                        # Requested while running: it lands on the tail's clean-up awaits.
                        task = asyncio.current_task()
                        assert task is not None
                        task.cancel()
                        break
                await asyncio.sleep(0)
                ran_on = True

            task = asyncio.create_task(consume())
            done, _ = await asyncio.wait({task}, timeout=10)
            assert task in done, "the consumer did not end"
            assert not ran_on, "the cancel was lost while the tail closed"
            assert task.cancelled()

        self.run(t)

    def test_an_append_while_the_consumer_holds_an_event_wakes_the_tail(self) -> None:
        """An append made while the tail is handed out (not yet waiting) still wakes it: a
        wake-up sent between the tail's read and its wait must not wait for the next poll.
        A backend on the default ``subscribe`` passes by notifying ``self.wakeups``."""

        async def t(s: Store) -> None:
            await _append(s, "s", new_event("e", {"i": 0}))
            tail = _tail(s, "s", poll_interval=60)
            try:
                assert (await _next_event(tail)).payload == {"i": 0}
                await _append(s, "s", new_event("e", {"i": 1}))  # the tail is not waiting yet
                async with asyncio.timeout(10):  # the tail polls only every 60 s
                    later = await _next_event(tail)
                assert later.payload == {"i": 1}
            finally:
                await _close(tail)

        self.run(t)

    def test_a_tail_signals_each_reset_of_its_stream(self) -> None:
        """A tail yields a TailReset when the history it follows is deleted (and recreated),
        then the new history from position 1."""

        async def t(s: Store) -> None:
            await _append(s, "s", _batch("e", [{"gen": 1, "i": i} for i in range(2)]))
            tail = _tail(s, "s", poll_interval=0.02)
            try:
                async with asyncio.timeout(10):  # a guard: the tail wakes on the append
                    old = [await _next_event(tail), await _next_event(tail)]
                    # Deleted and recreated while the consumer holds an event.
                    await s.delete_stream(NAMESPACE, "s")
                    await _append(s, "s", new_event("e", {"gen": 2, "i": 0}))
                    reset = await anext(tail)
                    assert reset == TailReset("s", old[-1].cursor)
                    assert isinstance(reset, TailReset) and reset.kind == "reset"
                    new = await _next_event(tail)
                    assert (new.position, new.payload) == (1, {"gen": 2, "i": 0})
                    # Deleted while the tail waits, recreated after it saw the deletion.
                    await s.delete_stream(NAMESPACE, "s")
                    assert await anext(tail) == TailReset("s", new.cursor)
                    await _append(s, "s", new_event("e", {"gen": 3, "i": 0}))
                    newer = await _next_event(tail)
                    assert (newer.position, newer.payload) == (1, {"gen": 3, "i": 0})
            finally:
                await _close(tail)

        self.run(t)

    def test_a_tail_from_an_unknown_cursor_starts_with_a_reset(self) -> None:
        async def t(s: Store) -> None:
            await _append(s, "s", _batch("e", [{"i": i} for i in range(2)]))
            elsewhere = await _append(s, "other", new_event("e", {}))
            for cursor in (elsewhere.cursor, str(2**63)):
                tail = _tail(s, "s", after=cursor)
                try:
                    async with asyncio.timeout(10):
                        got = [await anext(tail) for _ in range(3)]
                finally:
                    await _close(tail)
                assert got[0] == TailReset("s", cursor)
                assert [e.position for e in got[1:] if isinstance(e, StoredEvent)] == [1, 2]

        self.run(t)

    def test_a_tail_hands_out_events_larger_than_its_buffer_each_once_in_order(self) -> None:
        """A tail holds at most TAIL_BUFFER_BYTES of a page: pages of large events are cut
        and read on from the cut, so every event still comes once, in order, then the live
        ones."""

        async def t(s: Store) -> None:
            third = TAIL_BUFFER_BYTES // 3
            sizes = [third, third, third, 10, 10, 2 * TAIL_BUFFER_BYTES, 10, third, third, 10]
            payloads = [{"i": i, "pad": "x" * size} for i, size in enumerate(sizes)]
            await _append(s, "s", _batch("e", payloads[:5]))
            await _append(s, "s", _batch("e", payloads[5:]))
            tail = _tail(s, "s", poll_interval=0.02)
            try:
                async with asyncio.timeout(20):
                    got = [await _next_event(tail) for _ in sizes]
                    await _append(s, "s", new_event("e", {"i": len(sizes), "pad": ""}))
                    got.append(await _next_event(tail))
            finally:
                await _close(tail)
            assert [e.payload["i"] for e in got] == list(range(len(sizes) + 1))
            assert [len(e.payload["pad"]) for e in got[:-1]] == sizes

        self.run(t)
