"""The store contract: one test suite every backend must pass, shipped for users' backends.

Subclass :class:`StoreContract` in a pytest module and implement :meth:`make_store`::

    class TestMyStore(StoreContract):
        def make_store(self) -> Store:
            return MyStore(...)

Each test opens a fresh store, drives its :class:`~contextfold.store.Store` methods
directly, and closes it. Stores receive checked input (the journal checks every argument
first), so the suite passes only valid arguments: what a bad argument gets is the journal's
business, tested with the journal. Tests are plain synchronous methods (each runs its own
event loop), so the suite needs pytest and nothing else.
"""

from __future__ import annotations

import asyncio

from .. import canonical
from ..errors import IdempotencyConflictError, UnknownEventTypeError, WrongExpectedVersionError
from ._contract_support import (
    ABSURD_CURSORS,
    JSON_SAMPLES,
    NAMESPACE,
    _append,
    _batch,
    _payloads,
    _read,
    new_event,
)
from ._contract_support import deep as _deep
from ._contract_tail import TailContract
from .base import MAX_LIMIT, Store

__all__ = ["ABSURD_CURSORS", "JSON_SAMPLES", "NAMESPACE", "StoreContract", "new_event"]


class StoreContract(TailContract):
    """What every store must do. Implement ``make_store``; override ``run`` if needed."""

    # -- atomicity and positions -------------------------------------------------------------

    def test_batch_gets_consecutive_positions(self) -> None:
        async def t(s: Store) -> None:
            a = await _append(s, "s", _batch("e", [{"i": i} for i in range(3)]))
            b = await _append(s, "s", _batch("e", [{"i": i} for i in range(3, 5)]))
            assert (a.first_position, a.last_position) == (1, 3)
            assert (b.first_position, b.last_position) == (4, 5)
            assert not a.deduplicated and a.stream == "s" and a.version == 3
            page = await _read(s, "s")
            assert [e.position for e in page.events] == [1, 2, 3, 4, 5]
            assert _payloads(page, "i") == [0, 1, 2, 3, 4]
            assert page.cursor == b.cursor and page.events[2].cursor == a.cursor
            assert await s.version(NAMESPACE, "s") == 5
            assert await s.version(NAMESPACE, "missing") == 0

        self.run(t)

    def test_positions_only_grow_while_a_cursor_is_out(self) -> None:
        async def t(s: Store) -> None:
            await _append(s, "s", new_event("e", {"i": 0}))
            first = await _read(s, "s")
            await _append(s, "other", new_event("e", {"i": 99}))
            await _append(s, "s", _batch("e", [{"i": 1}, {"i": 2}]))
            after = await _read(s, "s", after=first.cursor)
            assert not after.reset
            assert _payloads(after, "i") == [1, 2]
            globals_ = [e.global_position for e in first.events + after.events]
            assert globals_ == sorted(globals_) and len(set(globals_)) == len(globals_)
            again = await _read(s, "s", after=after.cursor)
            assert again.events == () and again.cursor == after.cursor and not again.reset

        self.run(t)

    def test_concurrent_appends_leave_no_gap(self) -> None:
        async def t(s: Store) -> None:
            results = await asyncio.gather(
                *(
                    _append(s, "s", _batch("e", [{"w": w, "k": k} for k in range(3)]))
                    for w in range(20)
                )
            )
            page = await _read(s, "s")
            assert [e.position for e in page.events] == list(range(1, 61))
            spans = sorted((r.first_position, r.last_position) for r in results)
            assert all(b - a == 2 for a, b in spans)
            for r in results:  # each batch stayed contiguous
                batch = page.events[r.first_position - 1 : r.last_position]
                assert len({e.payload["w"] for e in batch}) == 1

        self.run(t)

    # -- JSON ------------------------------------------------------------------------------

    def test_json_in_equals_json_out(self) -> None:
        async def t(s: Store) -> None:
            samples = [*JSON_SAMPLES, _deep(200)]
            await _append(s, "json", _batch("sample", samples))
            page = await _read(s, "json")
            assert [e.payload for e in page.events] == samples
            assert [e.data for e in page.events] == [canonical.dumps(v) for v in samples]

        self.run(t)

    def test_unknown_event_type_reads_raw(self) -> None:
        async def t(s: Store) -> None:
            await _append(s, "s", new_event("never-defined-anywhere", {"a": 1}))
            (event,) = (await _read(s, "s")).events
            assert event.type == "never-defined-anywhere" and event.payload == {"a": 1}
            try:
                event.decode()
            except UnknownEventTypeError as exc:
                assert "never-defined-anywhere" in str(exc)
            else:
                raise AssertionError("decode of an unregistered type succeeded")

        self.run(t)

    def test_meta_round_trips(self) -> None:
        async def t(s: Store) -> None:
            sent = new_event(
                "e",
                {},
                run_id="run-1",
                actor="webhook",
                channels=("main", "client"),
                idempotency_key="k1",
            )
            await _append(s, "s", sent, idempotency_key="k1")
            await _append(s, "s", new_event("checkpoint", {}, channels=()))
            a, b = (await _read(s, "s")).events
            assert a.meta == sent.meta
            assert b.meta.channels == () and b.meta.run_id is None and b.meta.actor is None
            assert a.namespace == NAMESPACE and a.stream == "s"

        self.run(t)

    def test_text_beyond_the_basic_plane_round_trips(self) -> None:
        async def t(s: Store) -> None:
            await _append(s, "s", new_event("e", {"keep": True}))
            sent = new_event("e", {}, actor="🚀", run_id="run-🚀", channels=("🚀",))
            await _append(s, "s-🚀", sent)
            (event,) = (await _read(s, "s-🚀")).events
            assert event.meta == sent.meta and event.stream == "s-🚀"
            assert [i.stream for i in await s.list_streams(NAMESPACE)] == ["s", "s-🚀"]

        self.run(t)

    # -- cursors ---------------------------------------------------------------------------

    def test_unknown_cursor_resets(self) -> None:
        async def t(s: Store) -> None:
            await _append(s, "s", _batch("e", [{"i": i} for i in range(3)]))
            other = await _append(s, "o", new_event("e", {}))
            for cursor in ("987654321", "not-a-cursor", "", "-1", other.cursor):
                page = await _read(s, "s", after=cursor)
                assert page.reset, cursor
                assert [e.position for e in page.events] == [1, 2, 3]
            assert not (await _read(s, "s")).reset

        self.run(t)

    def test_deleted_stream_resets_cursor(self) -> None:
        async def t(s: Store) -> None:
            old = await _append(s, "s", _batch("e", [{"gen": 1}] * 3))
            assert await s.delete_stream(NAMESPACE, "s")
            assert not await s.delete_stream(NAMESPACE, "s")
            assert await s.version(NAMESPACE, "s") == 0
            assert (await _read(s, "s")).events == ()
            new = await _append(s, "s", new_event("e", {"gen": 2}))
            assert new.first_position == 1
            page = await _read(s, "s", after=old.cursor)
            assert page.reset and _payloads(page, "gen") == [2]
            assert not await s.contains(NAMESPACE, "s", old.cursor)
            assert await s.contains(NAMESPACE, "s", new.cursor)

        self.run(t)

    def test_head_is_the_newest_cursor(self) -> None:
        async def t(s: Store) -> None:
            assert await s.head(NAMESPACE, "s") is None
            await _append(s, "s", _batch("e", [{"i": 0}, {"i": 1}]))
            last = await _append(s, "s", new_event("e", {"i": 2}))
            await _append(s, "other", new_event("e", {}))
            head = await s.head(NAMESPACE, "s")
            assert head == last.cursor
            page = await _read(s, "s", after=head)
            assert page.events == () and not page.reset
            await s.delete_stream(NAMESPACE, "s")
            assert await s.head(NAMESPACE, "s") is None

        self.run(t)

    def test_pagination_over_ten_thousand_events(self) -> None:
        async def t(s: Store) -> None:
            for start in range(0, 10_000, 1000):
                await _append(s, "big", _batch("e", [{"i": i} for i in range(start, start + 1000)]))
            seen: list[int] = []
            cursor = None
            pages = 0
            while True:
                page = await _read(s, "big", after=cursor, limit=333)
                seen.extend(_payloads(page, "i"))
                cursor = page.cursor
                pages += 1
                if not page.more:
                    break
            assert seen == list(range(10_000))
            assert pages == 31
            whole = await _read(s, "big", limit=MAX_LIMIT)
            assert [e.position for e in whole.events] == list(range(1, 10_001))
            assert not whole.more and whole.cursor == cursor

        self.run(t)

    def test_read_filters_types(self) -> None:
        async def t(s: Store) -> None:
            events = [new_event("a", {"i": 1}), new_event("b", {"i": 2}), new_event("a", {"i": 3})]
            await _append(s, "s", events)
            assert _payloads(await _read(s, "s", types=["a"]), "i") == [1, 3]
            assert _payloads(await _read(s, "s", types=["a", "b"]), "i") == [1, 2, 3]
            assert (await _read(s, "s", types=[])).events == ()

        self.run(t)

    def test_limits_at_their_bounds(self) -> None:
        async def t(s: Store) -> None:
            await _append(s, "s", _batch("e", [{"i": i} for i in range(3)]))
            await _append(s, "t", new_event("e", {}))
            one = await _read(s, "s", limit=1)
            assert [e.position for e in one.events] == [1] and one.more
            assert len((await _read(s, "s", limit=MAX_LIMIT)).events) == 3
            assert len(await s.latest(NAMESPACE, "s", ["e"], limit=MAX_LIMIT)) == 3
            assert [i.stream for i in await s.list_streams(NAMESPACE, limit=1)] == ["s"]
            assert len(await s.list_streams(NAMESPACE, limit=MAX_LIMIT)) == 2

        self.run(t)

    def test_absurd_cursors_are_unknown_cursors(self) -> None:
        async def t(s: Store) -> None:
            await _append(s, "s", _batch("e", [{"i": i} for i in range(3)]))
            for cursor in ABSURD_CURSORS:
                page = await _read(s, "s", after=cursor)
                assert page.reset, cursor
                assert [e.position for e in page.events] == [1, 2, 3], cursor
                assert not await s.contains(NAMESPACE, "s", cursor), cursor
                # No bound that names no event: the newest events, as with no ``before``.
                newest = await s.latest(NAMESPACE, "s", ["e"], before=cursor)
                assert [e.position for e in newest] == [3]
            assert await s.version(NAMESPACE, "s") == 3

        self.run(t)

    # -- idempotency and optimistic concurrency ----------------------------------------------

    def test_idempotent_retry_returns_original_and_writes_nothing(self) -> None:
        async def t(s: Store) -> None:
            await _append(s, "s", new_event("e", {"before": True}))
            batch = _batch("e", [{"i": 1}, {"i": 2}])
            first = await _append(s, "s", batch, idempotency_key="req-1")
            await _append(s, "s", new_event("e", {"between": True}))
            # A retry: the same types and payloads, with new ids and times.
            retry = await _append(
                s, "s", _batch("e", [{"i": 1}, {"i": 2}]), idempotency_key="req-1"
            )
            assert not first.deduplicated and retry.deduplicated
            assert (retry.first_position, retry.last_position) == (
                first.first_position,
                first.last_position,
            )
            assert retry.cursor == first.cursor
            assert await s.version(NAMESPACE, "s") == 4
            try:
                await _append(s, "s", new_event("e", {"i": 999}), idempotency_key="req-1")
            except IdempotencyConflictError as exc:
                assert "req-1" in str(exc) and exc.stream == "s"
            else:
                raise AssertionError("the same key with another payload was accepted")
            assert await s.version(NAMESPACE, "s") == 4
            other = await _append(s, "t", batch, idempotency_key="req-1")
            assert not other.deduplicated  # keys are per stream

        self.run(t)

    def test_wrong_expected_version_writes_nothing(self) -> None:
        async def t(s: Store) -> None:
            r = await _append(s, "s", new_event("e", {}), expected_version=0)
            assert r.version == 1
            for wrong in (0, 2, 7):
                try:
                    await _append(s, "s", new_event("e", {"bad": wrong}), expected_version=wrong)
                except WrongExpectedVersionError as exc:
                    assert (exc.expected, exc.actual, exc.stream) == (wrong, 1, "s")
                else:
                    raise AssertionError(f"expected_version={wrong} was accepted at version 1")
            assert await s.version(NAMESPACE, "s") == 1
            assert (await _append(s, "s", new_event("e", {}), expected_version=1)).version == 2

        self.run(t)

    def test_expected_version_race_has_one_winner(self) -> None:
        async def t(s: Store) -> None:
            await _append(s, "s", new_event("e", {}))
            outcomes = await asyncio.gather(
                *(_append(s, "s", new_event("e", {"w": w}), expected_version=1) for w in range(8)),
                return_exceptions=True,
            )
            wins = [o for o in outcomes if not isinstance(o, BaseException)]
            losses = [o for o in outcomes if isinstance(o, WrongExpectedVersionError)]
            assert len(wins) == 1 and len(losses) == 7
            assert await s.version(NAMESPACE, "s") == 2

        self.run(t)

    # -- namespaces, listing, latest ---------------------------------------------------------

    def test_namespaces_are_isolated(self) -> None:
        async def t(s: Store) -> None:
            a, b = "tenant-a", "tenant-b"
            ra = await _append(s, "s", new_event("e", {"t": "a"}), idempotency_key="k", namespace=a)
            rb = await _append(s, "s", new_event("e", {"t": "b"}), idempotency_key="k", namespace=b)
            assert not rb.deduplicated and rb.first_position == 1
            assert _payloads(await _read(s, "s", namespace=a), "t") == ["a"]
            assert _payloads(await _read(s, "s", namespace=b), "t") == ["b"]
            assert (await _read(s, "s", after=ra.cursor, namespace=b)).reset
            assert not await s.contains(b, "s", ra.cursor)
            assert await s.latest(b, "s", ["e"], before=None) == (
                (await _read(s, "s", namespace=b)).events
            )
            assert await s.delete_stream(a, "s")
            assert await s.version(b, "s") == 1 and await s.version(a, "s") == 0
            assert [i.stream for i in await s.list_streams(b)] == ["s"]
            assert [i.stream for i in await s.list_streams(a)] == []

        self.run(t)

    def test_list_streams(self) -> None:
        async def t(s: Store) -> None:
            for name in ("chat/2", "chat/1", "chat%x", "chat_y", "other"):
                await _append(s, name, new_event("e", {}))
            await _append(s, "chat/1", new_event("e", {}))
            infos = await s.list_streams(NAMESPACE)
            assert [(i.stream, i.version) for i in infos] == [
                ("chat%x", 1),
                ("chat/1", 2),
                ("chat/2", 1),
                ("chat_y", 1),
                ("other", 1),
            ]
            chats = await s.list_streams(NAMESPACE, prefix="chat/")
            assert [i.stream for i in chats] == ["chat/1", "chat/2"]
            assert [i.stream for i in await s.list_streams(NAMESPACE, prefix="chat%")] == ["chat%x"]
            assert len(await s.list_streams(NAMESPACE, limit=2)) == 2

        self.run(t)

    def test_list_streams_pages_after_a_name(self) -> None:
        async def t(s: Store) -> None:
            names = ["a", "a/1", "a/2", "b", "s-🚀", "z", "é", "🚀"]  # code point order
            for name in reversed(names):
                await _append(s, name, new_event("e", {}))
            await _append(s, "c", new_event("e", {}), namespace="contract-other")
            listed: list[str] = []
            after: str | None = None
            while page := await s.list_streams(NAMESPACE, limit=3, after=after):
                listed.extend(info.stream for info in page)
                after = page[-1].stream
                await s.delete_stream(NAMESPACE, after)  # a page's last may go meanwhile
            assert listed == names
            kept = ["a", "a/1", "b", "s-🚀", "é"]
            assert [i.stream for i in await s.list_streams(NAMESPACE, after="a")] == kept[1:]
            # a name that is no stream is a place in the order all the same
            between = await s.list_streams(NAMESPACE, after="a/0")
            assert [i.stream for i in between] == kept[1:]
            chats = await s.list_streams(NAMESPACE, prefix="a", after="a")
            assert [(i.stream, i.version) for i in chats] == [("a/1", 1)]
            assert await s.list_streams(NAMESPACE, after="é") == ()
            assert await s.list_streams(NAMESPACE, prefix="b", after="c") == ()
            others = await s.list_streams("contract-other", after="b")
            assert [i.stream for i in others] == ["c"]

        self.run(t)

    def test_latest_of_types(self) -> None:
        async def t(s: Store) -> None:
            batch = [new_event("cp", {"n": 1}), new_event("e", {}), new_event("cp", {"n": 2})]
            await _append(s, "s", batch)
            await _append(s, "s", new_event("e", {}))
            (newest,) = await s.latest(NAMESPACE, "s", ["cp"])
            assert newest.payload == {"n": 2}
            two = await s.latest(NAMESPACE, "s", ["cp"], limit=5)
            assert [e.payload["n"] for e in two] == [2, 1]
            older = await s.latest(NAMESPACE, "s", ["cp"], before=newest.cursor)
            assert [e.payload["n"] for e in older] == [1]
            assert await s.latest(NAMESPACE, "s", ["nope"]) == ()
            assert await s.latest(NAMESPACE, "missing", ["cp"]) == ()

        self.run(t)
