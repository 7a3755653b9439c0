"""The store contract: one test suite every backend must pass, shipped for users' backends.

Subclass :class:`StoreContract` in a pytest module and implement :meth:`make_store`::

    class TestMyStore(StoreContract):
        def make_store(self) -> Store:
            return MyStore(...)

Each test opens a fresh store, runs against it through a :class:`~contextfold.Journal`,
and closes it. Tests are plain synchronous methods (each runs its own event loop), so
the suite needs pytest and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import (
    IdempotencyConflictError,
    InvalidInputError,
    InvalidStreamNameError,
    PayloadError,
    UnknownEventTypeError,
    WrongExpectedVersionError,
)
from ..events import RawEvent, StoredEvent
from ..journal import Journal
from .base import MAX_LIMIT, Store, TailReset

__all__ = ["JSON_SAMPLES", "StoreContract"]

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

LONE_SURROGATES: tuple[str, ...] = ("\ud800", "\udfff", "ok\udbffend")


def _deep(depth: int) -> Any:
    value: Any = {"leaf": True}
    for i in range(depth):
        value = {"level": i, "next": value} if i % 2 else [value]
    return value


class StoreContract:
    """What every store must do. Implement ``make_store``; override ``run`` if needed."""

    def make_store(self) -> Store:
        raise NotImplementedError("StoreContract subclasses implement make_store()")

    def run(self, test: Callable[[Journal], Awaitable[None]]) -> None:
        async def main() -> None:
            journal = Journal(self.make_store())
            try:
                await test(journal)
            finally:
                await journal.close()

        asyncio.run(main())

    # -- atomicity and positions -------------------------------------------------------------

    def test_batch_gets_consecutive_positions(self) -> None:
        async def t(j: Journal) -> None:
            a = await j.append("s", [RawEvent("e", {"i": i}) for i in range(3)])
            b = await j.append("s", [RawEvent("e", {"i": i}) for i in range(3, 5)])
            assert (a.first_position, a.last_position) == (1, 3)
            assert (b.first_position, b.last_position) == (4, 5)
            page = await j.read("s")
            assert [e.position for e in page.events] == [1, 2, 3, 4, 5]
            assert [e.payload["i"] for e in page.events] == [0, 1, 2, 3, 4]
            assert page.cursor == b.cursor
            assert await j.version("s") == 5

        self.run(t)

    def test_bad_event_in_batch_writes_nothing(self) -> None:
        async def t(j: Journal) -> None:
            await j.append("s", RawEvent("e", {"i": 0}))
            bad = [RawEvent("e", {"i": 1}), RawEvent("e", {"x": float("nan")})]
            try:
                await j.append("s", bad)
            except PayloadError as exc:
                assert "NaN" in str(exc) or "nan" in str(exc)
            else:
                raise AssertionError("a NaN payload was accepted")
            assert await j.version("s") == 1

        self.run(t)

    def test_positions_only_grow_while_a_cursor_is_out(self) -> None:
        async def t(j: Journal) -> None:
            await j.append("s", RawEvent("e", {"i": 0}))
            first = await j.read("s")
            await j.append("other", RawEvent("e", {"i": 99}))
            await j.append("s", [RawEvent("e", {"i": 1}), RawEvent("e", {"i": 2})])
            after = await j.read("s", after=first.cursor)
            assert not after.reset
            assert [e.payload["i"] for e in after.events] == [1, 2]
            globals_ = [e.global_position for e in first.events + after.events]
            assert globals_ == sorted(globals_) and len(set(globals_)) == len(globals_)
            again = await j.read("s", after=after.cursor)
            assert again.events == () and again.cursor == after.cursor and not again.reset

        self.run(t)

    def test_concurrent_appends_leave_no_gap(self) -> None:
        async def t(j: Journal) -> None:
            results = await asyncio.gather(
                *(
                    j.append("s", [RawEvent("e", {"w": w, "k": k}) for k in range(3)])
                    for w in range(20)
                )
            )
            page = await j.read("s")
            assert [e.position for e in page.events] == list(range(1, 61))
            spans = sorted((r.first_position, r.last_position) for r in results)
            assert all(b - a == 2 for a, b in spans)
            for r in results:  # each batch stayed contiguous
                batch = page.events[r.first_position - 1 : r.last_position]
                assert len({e.payload["w"] for e in batch}) == 1

        self.run(t)

    # -- JSON ------------------------------------------------------------------------------

    def test_json_in_equals_json_out(self) -> None:
        async def t(j: Journal) -> None:
            samples = [*JSON_SAMPLES, _deep(200)]
            await j.append("json", [RawEvent("sample", s) for s in samples])
            page = await j.read("json")
            assert [e.payload for e in page.events] == samples
            from .. import canonical

            assert [e.data for e in page.events] == [canonical.dumps(s) for s in samples]

        self.run(t)

    def test_unknown_event_type_reads_raw(self) -> None:
        async def t(j: Journal) -> None:
            await j.append("s", RawEvent("never-defined-anywhere", {"a": 1}))
            (event,) = (await j.read("s")).events
            assert event.type == "never-defined-anywhere" and event.payload == {"a": 1}
            try:
                event.decode()
            except UnknownEventTypeError as exc:
                assert "never-defined-anywhere" in str(exc)
            else:
                raise AssertionError("decode of an unregistered type succeeded")

        self.run(t)

    def test_meta_round_trips(self) -> None:
        async def t(j: Journal) -> None:
            await j.append(
                "s",
                RawEvent("e", {}),
                run_id="run-1",
                actor="webhook",
                channels=("main", "client"),
                idempotency_key="k1",
            )
            await j.append("s", RawEvent("checkpoint", {}), channels=())
            a, b = (await j.read("s")).events
            assert (a.meta.run_id, a.meta.actor, a.meta.channels) == (
                "run-1",
                "webhook",
                ("main", "client"),
            )
            assert a.meta.idempotency_key == "k1" and a.meta.event_id and a.meta.time
            assert b.meta.channels == () and b.meta.run_id is None
            assert a.namespace == j.namespace and a.stream == "s"

        self.run(t)

    # -- cursors ---------------------------------------------------------------------------

    def test_unknown_cursor_resets(self) -> None:
        async def t(j: Journal) -> None:
            await j.append("s", [RawEvent("e", {"i": i}) for i in range(3)])
            other = await j.append("o", RawEvent("e", {}))
            for cursor in ("987654321", "not-a-cursor", "", "-1", other.cursor):
                page = await j.read("s", after=cursor)
                assert page.reset, cursor
                assert [e.position for e in page.events] == [1, 2, 3]
            assert not (await j.read("s")).reset

        self.run(t)

    def test_deleted_stream_resets_cursor(self) -> None:
        async def t(j: Journal) -> None:
            old = await j.append("s", [RawEvent("e", {"gen": 1}) for _ in range(3)])
            assert await j.delete_stream("s")
            assert not await j.delete_stream("s")
            assert await j.version("s") == 0
            assert (await j.read("s")).events == ()
            new = await j.append("s", [RawEvent("e", {"gen": 2})])
            assert new.first_position == 1
            page = await j.read("s", after=old.cursor)
            assert page.reset and [e.payload["gen"] for e in page.events] == [2]
            assert not await j.contains("s", old.cursor)
            assert await j.contains("s", new.cursor)

        self.run(t)

    def test_head_is_the_newest_cursor(self) -> None:
        async def t(j: Journal) -> None:
            assert await j.head("s") is None
            await j.append("s", [RawEvent("e", {"i": 0}), RawEvent("e", {"i": 1})])
            last = await j.append("s", RawEvent("e", {"i": 2}))
            await j.append("other", RawEvent("e", {}))
            assert await j.head("s") == last.cursor
            page = await j.read("s", after=await j.head("s"))
            assert page.events == () and not page.reset
            await j.delete_stream("s")
            assert await j.head("s") is None

        self.run(t)

    def test_pagination_over_ten_thousand_events(self) -> None:
        async def t(j: Journal) -> None:
            for start in range(0, 10_000, 1000):
                await j.append("big", [RawEvent("e", {"i": i}) for i in range(start, start + 1000)])
            seen: list[int] = []
            cursor = None
            pages = 0
            while True:
                page = await j.read("big", after=cursor, limit=333)
                seen.extend(e.payload["i"] for e in page.events)
                cursor = page.cursor
                pages += 1
                if not page.more:
                    break
            assert seen == list(range(10_000))
            assert pages == 31
            assert [e.position async for e in j.read_all("big", page_size=4000)] == list(
                range(1, 10_001)
            )

        self.run(t)

    def test_read_filters_types(self) -> None:
        async def t(j: Journal) -> None:
            await j.append(
                "s", [RawEvent("a", {"i": 1}), RawEvent("b", {"i": 2}), RawEvent("a", {"i": 3})]
            )
            page = await j.read("s", types=["a"])
            assert [e.payload["i"] for e in page.events] == [1, 3]

        self.run(t)

    # -- idempotency and optimistic concurrency ----------------------------------------------

    def test_idempotent_retry_returns_original_and_writes_nothing(self) -> None:
        async def t(j: Journal) -> None:
            await j.append("s", RawEvent("e", {"before": True}))
            batch = [RawEvent("e", {"i": 1}), RawEvent("e", {"i": 2})]
            first = await j.append("s", batch, idempotency_key="req-1")
            await j.append("s", RawEvent("e", {"between": True}))
            retry = await j.append("s", batch, idempotency_key="req-1")
            assert not first.deduplicated and retry.deduplicated
            assert (retry.first_position, retry.last_position) == (
                first.first_position,
                first.last_position,
            )
            assert retry.cursor == first.cursor
            assert await j.version("s") == 4
            try:
                await j.append("s", [RawEvent("e", {"i": 999})], idempotency_key="req-1")
            except IdempotencyConflictError as exc:
                assert "req-1" in str(exc) and exc.stream == "s"
            else:
                raise AssertionError("the same key with another payload was accepted")
            assert await j.version("s") == 4
            other = await j.append("t", batch, idempotency_key="req-1")
            assert not other.deduplicated  # keys are per stream

        self.run(t)

    def test_wrong_expected_version_writes_nothing(self) -> None:
        async def t(j: Journal) -> None:
            r = await j.append("s", RawEvent("e", {}), expected_version=0)
            assert r.version == 1
            for wrong in (0, 2, 7):
                try:
                    await j.append("s", RawEvent("e", {"bad": wrong}), expected_version=wrong)
                except WrongExpectedVersionError as exc:
                    assert (exc.expected, exc.actual, exc.stream) == (wrong, 1, "s")
                else:
                    raise AssertionError(f"expected_version={wrong} was accepted at version 1")
            assert await j.version("s") == 1
            assert (await j.append("s", RawEvent("e", {}), expected_version=1)).version == 2

        self.run(t)

    def test_expected_version_race_has_one_winner(self) -> None:
        async def t(j: Journal) -> None:
            await j.append("s", RawEvent("e", {}))
            outcomes = await asyncio.gather(
                *(j.append("s", RawEvent("e", {"w": w}), expected_version=1) for w in range(8)),
                return_exceptions=True,
            )
            wins = [o for o in outcomes if not isinstance(o, BaseException)]
            losses = [o for o in outcomes if isinstance(o, WrongExpectedVersionError)]
            assert len(wins) == 1 and len(losses) == 7
            assert await j.version("s") == 2

        self.run(t)

    # -- namespaces, listing, latest ---------------------------------------------------------

    def test_namespaces_are_isolated(self) -> None:
        async def t(j: Journal) -> None:
            a, b = j.with_namespace("tenant-a"), j.with_namespace("tenant-b")
            ra = await a.append("s", RawEvent("e", {"t": "a"}), idempotency_key="k")
            rb = await b.append("s", RawEvent("e", {"t": "b"}), idempotency_key="k")
            assert not rb.deduplicated and rb.first_position == 1
            assert [e.payload["t"] for e in (await a.read("s")).events] == ["a"]
            assert [e.payload["t"] for e in (await b.read("s")).events] == ["b"]
            assert (await b.read("s", after=ra.cursor)).reset
            assert await a.delete_stream("s")
            assert await b.version("s") == 1 and await a.version("s") == 0
            assert [s.stream for s in await b.list_streams()] == ["s"]
            assert [s.stream for s in await a.list_streams()] == []

        self.run(t)

    def test_list_streams(self) -> None:
        async def t(j: Journal) -> None:
            for name in ("chat/2", "chat/1", "chat%x", "chat_y", "other"):
                await j.append(name, RawEvent("e", {}))
            await j.append("chat/1", RawEvent("e", {}))
            infos = await j.list_streams()
            assert [(s.stream, s.version) for s in infos] == [
                ("chat%x", 1),
                ("chat/1", 2),
                ("chat/2", 1),
                ("chat_y", 1),
                ("other", 1),
            ]
            assert [s.stream for s in await j.list_streams(prefix="chat/")] == ["chat/1", "chat/2"]
            assert [s.stream for s in await j.list_streams(prefix="chat%")] == ["chat%x"]
            assert len(await j.list_streams(limit=2)) == 2

        self.run(t)

    def test_latest_of_types(self) -> None:
        async def t(j: Journal) -> None:
            await j.append(
                "s", [RawEvent("cp", {"n": 1}), RawEvent("e", {}), RawEvent("cp", {"n": 2})]
            )
            await j.append("s", RawEvent("e", {}))
            (newest,) = await j.latest("s", ["cp"])
            assert newest.payload == {"n": 2}
            two = await j.latest("s", ["cp"], limit=5)
            assert [e.payload["n"] for e in two] == [2, 1]
            older = await j.latest("s", ["cp"], before=newest.cursor)
            assert [e.payload["n"] for e in older] == [1]
            assert await j.latest("s", ["nope"]) == ()
            assert await j.latest("missing", ["cp"]) == ()

        self.run(t)

    # -- bad input ---------------------------------------------------------------------------

    def test_bad_input_is_refused_and_nothing_lost(self) -> None:
        async def t(j: Journal) -> None:
            await j.append("s", RawEvent("e", {"keep": True}))
            bad_calls: list[tuple[Any, type[Exception]]] = [
                (j.append("", RawEvent("e", {})), InvalidStreamNameError),
                (j.append(" s", RawEvent("e", {})), InvalidStreamNameError),
                (j.append("a\nb", RawEvent("e", {})), InvalidStreamNameError),
                (j.append("x" * 600, RawEvent("e", {})), InvalidStreamNameError),
                (j.append("s", RawEvent("e", {"f": float("inf")})), PayloadError),
                (j.append("s", RawEvent("e", {"o": object()})), PayloadError),
                (j.append("s", RawEvent("e", {"big": 2**70})), PayloadError),
                (j.append("s", RawEvent("e", {1: "non-str key"})), PayloadError),
                (
                    j.append("s", RawEvent("e", {"x": "y" * (j.max_payload_bytes + 1)})),
                    PayloadError,
                ),
            ]
            for call, error in bad_calls:
                try:
                    await call
                except error:
                    pass
                else:
                    raise AssertionError(f"{error.__name__} not raised")
            page = await j.read("s")
            assert [e.payload for e in page.events] == [{"keep": True}]

        self.run(t)

    def test_absurd_cursors_are_unknown_cursors(self) -> None:
        async def t(j: Journal) -> None:
            await j.append("s", [RawEvent("e", {"i": i}) for i in range(3)])
            for cursor in ABSURD_CURSORS:
                page = await j.read("s", after=cursor)
                assert page.reset, cursor
                assert [e.position for e in page.events] == [1, 2, 3], cursor
                assert not await j.contains("s", cursor), cursor
                # No bound that names no event: the newest events, as with no ``before``.
                assert [e.position for e in await j.latest("s", ["e"], before=cursor)] == [3]
            assert await j.version("s") == 3

        self.run(t)

    def test_limits_out_of_bounds_are_refused(self) -> None:
        async def t(j: Journal) -> None:
            await j.append("s", [RawEvent("e", {"i": i}) for i in range(3)])
            await j.append("t", RawEvent("e", {}))
            for bad in (0, -1, MAX_LIMIT + 1, 2**63, 2**70, True, 1.5, "2"):
                calls: list[tuple[str, Awaitable[Any]]] = [
                    ("read", j.read("s", limit=bad)),  # type: ignore[arg-type]
                    ("latest", j.latest("s", ["e"], limit=bad)),  # type: ignore[arg-type]
                    ("list_streams", j.list_streams(limit=bad)),  # type: ignore[arg-type]
                ]
                for method, call in calls:
                    try:
                        await call
                    except InvalidInputError as exc:
                        message = str(exc)
                        assert "limit" in message and f"1 to {MAX_LIMIT}" in message, message
                        assert repr(bad) in message, message
                    else:
                        raise AssertionError(f"{method}(limit={bad!r}) was accepted")
            try:
                async for _ in j.read_all("s", page_size=0):
                    pass
            except InvalidInputError as exc:
                assert "page_size" in str(exc) and f"1 to {MAX_LIMIT}" in str(exc)
            else:
                raise AssertionError("read_all(page_size=0) was accepted")
            # The bounds themselves are accepted.
            assert [e.position for e in (await j.read("s", limit=1)).events] == [1]
            assert len((await j.read("s", limit=MAX_LIMIT)).events) == 3
            assert len(await j.latest("s", ["e"], limit=MAX_LIMIT)) == 3
            assert [i.stream for i in await j.list_streams(limit=1)] == ["s"]
            assert len(await j.list_streams(limit=MAX_LIMIT)) == 2
            assert await j.version("s") == 3

        self.run(t)

    def test_lone_surrogates_are_refused_naming_the_argument(self) -> None:
        async def t(j: Journal) -> None:
            await j.append("s", RawEvent("e", {"keep": True}))
            ok = RawEvent("e", {})
            for bad in LONE_SURROGATES:
                calls: list[tuple[str, Awaitable[Any]]] = [
                    ("stream name", j.append("s" + bad, ok)),
                    ("stream name", j.read(bad)),
                    ("stream name", j.version(bad)),
                    ("stream name", j.delete_stream(bad)),
                    ("run_id", j.append("s", ok, run_id=bad)),
                    ("actor", j.append("s", ok, actor=bad)),
                    ("idempotency_key", j.append("s", ok, idempotency_key=bad)),
                    ("channels[1]", j.append("s", ok, channels=("main", bad))),
                    ("prefix", j.list_streams(prefix=bad)),
                    ("types[1]", j.read("s", types=["e", bad])),
                    ("types[0]", j.latest("s", [bad])),
                    ("stream name", anext(j.subscribe(bad))),
                ]
                for name, call in calls:
                    try:
                        await call
                    except InvalidInputError as exc:
                        assert str(exc).startswith(name) and "surrogate" in str(exc), str(exc)
                    else:
                        raise AssertionError(f"{name} {bad!r} was accepted")
                try:
                    j.with_namespace("ns" + bad)
                except InvalidInputError as exc:
                    assert str(exc).startswith("namespace") and "surrogate" in str(exc)
                else:
                    raise AssertionError(f"namespace {bad!r} was accepted")
            # Valid text beyond the BMP is no surrogate: stored and read back as given.
            await j.append("s-🚀", ok, actor="🚀", run_id="run-🚀", channels=("🚀",))
            (event,) = (await j.read("s-🚀")).events
            assert (event.meta.actor, event.meta.run_id, event.meta.channels) == (
                "🚀",
                "run-🚀",
                ("🚀",),
            )
            assert [i.stream for i in await j.list_streams()] == ["s", "s-🚀"]
            assert [e.payload for e in (await j.read("s")).events] == [{"keep": True}]

        self.run(t)

    # -- live tail -------------------------------------------------------------------------

    def test_subscribe_sees_history_then_live_events(self) -> None:
        async def t(j: Journal) -> None:
            first = await j.append("s", [RawEvent("e", {"i": 0}), RawEvent("e", {"i": 1})])
            received: list[int] = []

            async def tail() -> None:
                async for event in j.subscribe("s", after=None, poll_interval=0.02):
                    received.append(event.payload["i"])
                    if len(received) == 4:
                        return

            task = asyncio.create_task(tail())
            await asyncio.sleep(0.05)
            await j.append("other", RawEvent("e", {"i": 100}))
            await j.append("s", RawEvent("e", {"i": 2}))
            await j.append("s", RawEvent("e", {"i": 3}))
            await asyncio.wait_for(task, 10)
            assert received == [0, 1, 2, 3]
            # a tail from a cursor starts after it
            got = []
            async for event in j.subscribe("s", after=first.cursor):
                got.append(event.payload["i"])
                if len(got) == 2:
                    break
            assert got == [2, 3]

        self.run(t)

    def test_a_cancelled_tail_ends_even_as_an_append_wakes_it(self) -> None:
        """Cancelling a waiting tail at any moment around a wake-up ends it: a lost cancel
        would leave an abandoned tail polling forever (and whoever awaits it hanging)."""

        async def t(j: Journal) -> None:
            async def tail() -> None:
                async for _ in j.subscribe("s", after=None, poll_interval=10):
                    pass

            for ticks in range(6):
                task = asyncio.create_task(tail())
                await asyncio.sleep(0.02)  # the tail has drained the history and waits
                await j.append("s", RawEvent("e", {"i": ticks}))
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

        async def t(j: Journal) -> None:
            await j.append("s", RawEvent("e", {"i": 1}))

            async def carry_on_then_tail() -> int:
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.sleep(60)  # cancelled below; the task decides to go on
                async for event in j.subscribe("s", after=None, poll_interval=0.05):
                    return int(event.payload["i"])
                raise AssertionError("unreachable: subscribe never ends")

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

        async def t(j: Journal) -> None:
            await j.append("s", RawEvent("e", {}))
            ran_on = False

            async def consume() -> None:
                nonlocal ran_on
                tail = j.subscribe("s", after=None)
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
        wake-up sent between the tail's read and its wait must not wait for the next poll."""

        async def t(j: Journal) -> None:
            await j.append("s", RawEvent("e", {"i": 0}))
            tail = j.subscribe("s", after=None, poll_interval=60)
            try:
                assert (await anext(tail)).payload == {"i": 0}
                await j.append("s", RawEvent("e", {"i": 1}))  # the tail is not waiting yet
                async with asyncio.timeout(10):  # the tail polls only every 60 s
                    later = await anext(tail)
                assert later.payload == {"i": 1}
            finally:
                await tail.aclose()  # type: ignore[attr-defined]

        self.run(t)

    def test_a_tail_signals_each_reset_of_its_stream(self) -> None:
        """A tail with ``resets=True`` yields a TailReset when the history it follows is
        deleted (and recreated), then the new history from position 1."""

        async def t(j: Journal) -> None:
            await j.append("s", [RawEvent("e", {"gen": 1, "i": i}) for i in range(2)])
            tail = j.subscribe("s", poll_interval=0.02, resets=True)
            try:
                async with asyncio.timeout(10):  # a guard: the tail wakes on the append
                    old = [await anext(tail), await anext(tail)]
                    assert isinstance(old[-1], StoredEvent) and isinstance(old[0], StoredEvent)
                    # Deleted and recreated while the consumer holds an event.
                    await j.delete_stream("s")
                    await j.append("s", RawEvent("e", {"gen": 2, "i": 0}))
                    reset, new = await anext(tail), await anext(tail)
                    assert reset == TailReset("s", old[-1].cursor)
                    assert isinstance(reset, TailReset) and reset.kind == "reset"
                    assert isinstance(new, StoredEvent)
                    assert (new.position, new.payload) == (1, {"gen": 2, "i": 0})
                    # Deleted while the tail waits, recreated after it saw the deletion.
                    await j.delete_stream("s")
                    assert await anext(tail) == TailReset("s", new.cursor)
                    await j.append("s", RawEvent("e", {"gen": 3, "i": 0}))
                    newer = await anext(tail)
                    assert isinstance(newer, StoredEvent)
                    assert (newer.position, newer.payload) == (1, {"gen": 3, "i": 0})
            finally:
                await tail.aclose()  # type: ignore[attr-defined]

        self.run(t)

    def test_a_tail_from_an_unknown_cursor_starts_with_a_reset(self) -> None:
        async def t(j: Journal) -> None:
            await j.append("s", [RawEvent("e", {"i": i}) for i in range(2)])
            elsewhere = await j.append("other", RawEvent("e", {}))
            for cursor in (elsewhere.cursor, str(2**63)):
                tail = j.subscribe("s", after=cursor, resets=True)
                try:
                    async with asyncio.timeout(10):
                        got = [await anext(tail) for _ in range(3)]
                finally:
                    await tail.aclose()  # type: ignore[attr-defined]
                assert got[0] == TailReset("s", cursor)
                assert [e.position for e in got[1:] if isinstance(e, StoredEvent)] == [1, 2]

        self.run(t)

    def test_a_tail_without_resets_follows_the_new_history_silently(self) -> None:
        """The default tail yields only events (what existing consumers expect)."""

        async def t(j: Journal) -> None:
            first = await j.append("s", RawEvent("e", {"gen": 1}))
            tail = j.subscribe("s", after=first.cursor, poll_interval=0.02)
            try:
                await j.delete_stream("s")
                await j.append("s", [RawEvent("e", {"gen": 2}), RawEvent("e", {"gen": 3})])
                async with asyncio.timeout(10):
                    got = [await anext(tail), await anext(tail)]
            finally:
                await tail.aclose()  # type: ignore[attr-defined]
            assert [(e.position, e.payload["gen"]) for e in got] == [(1, 2), (2, 3)]

        self.run(t)
