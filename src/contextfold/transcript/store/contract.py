"""The transcript store contract: one test suite every backend passes, shipped for users' own.

Subclass :class:`TranscriptStoreContract` in a pytest module and implement
:meth:`~TranscriptStoreContract.make_store` (a new, unopened store on an empty database)::

    class TestMyTranscriptStore(TranscriptStoreContract):
        def make_store(self) -> TranscriptStore:
            return MyTranscriptStore(...)

Each test makes a fresh store, runs against it, and closes it. Tests are plain synchronous
methods (each runs its own event loop), so the suite needs pytest and nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from ...errors import InvalidCursorError, InvalidInputError, StoreUnavailableError
from ...journal.encode import check_stream
from ...wire import Usage
from ..history import read_history
from ..parts import (
    INTERRUPTED,
    FilePart,
    Message,
    MessageWithParts,
    Part,
    ReasoningPart,
    StepFinishPart,
    TextPart,
    ToolPart,
)
from .base import MessagePage, TranscriptStore

__all__ = ["SESSION_NAMES", "TranscriptStoreContract"]

S = "session-1"

SESSION_NAMES: tuple[str, ...] = (
    "plain",
    "tenant/agent:42",
    "日本語 🧪",
    "x" * 512,
    "x" * 513,
    " leading",
    "trailing ",
    "tab\there",
    "line\nbreak",
    "nul\x00",
    "del\x7f",
    "\u2028",
)
"""Session names the contract tries: the store must accept exactly those the journal
accepts as stream names."""


def _message(index: int, session: str = S, created: str | None = None, **fields: Any) -> Message:
    role = "user" if index % 2 == 0 else "assistant"
    when = created if created is not None else f"t{index}"
    return Message(id=f"m{index:04d}", session=session, role=role, created=when, **fields)


def _text(part: Part) -> str:
    assert isinstance(part, (TextPart, ReasoningPart)), part
    return part.text


class TranscriptStoreContract:
    """What every transcript store must do. Implement ``make_store``; override ``run``
    if the store needs more than a close at the end."""

    def make_store(self) -> TranscriptStore:
        raise NotImplementedError("TranscriptStoreContract subclasses implement make_store()")

    def run(self, test: Callable[[TranscriptStore], Awaitable[None]]) -> None:
        async def main() -> None:
            store = self.make_store()
            try:
                await test(store)
            finally:
                await store.close()

        asyncio.run(main())

    # -- order and pages -------------------------------------------------------------------

    def test_pagination_reads_the_full_history_once_in_order(self) -> None:
        async def t(store: TranscriptStore) -> None:
            # Ids in descending order: the order is the order of first writes, not of ids.
            messages = [
                Message(id=f"z{999 - i:03d}", session=S, role="user", created="same-time")
                for i in range(250)
            ]
            for start in range(0, 250, 50):
                await store.write(messages=messages[start : start + 50])
            await store.write(messages=[_message(0, session="other-session")])
            seen: list[Message] = []
            cursors: list[str | None] = []
            cursor: str | None = None
            while True:
                page = await store.page_messages(S, after=cursor, limit=40)
                assert len(page.messages) <= 40
                seen.extend(page.messages)
                cursors.append(page.cursor)
                cursor = page.cursor
                if not page.more:
                    break
            assert seen == messages  # every message once, in order, none of another session
            assert len(cursors) == 7  # 6 full pages and one of 10
            resumed = await store.page_messages(S, after=cursors[2], limit=1000)
            assert resumed.messages == tuple(messages[120:]) and not resumed.more
            end = await store.page_messages(S, after=cursor, limit=40)
            assert end.messages == () and end.cursor == cursor and not end.more
            late = _message(9999)
            await store.write_message(late)
            assert (await store.page_messages(S, after=cursor)).messages == (late,)
            empty = await store.page_messages("no-such-session")
            assert empty == MessagePage((), None, False)

        self.run(t)

    def test_an_upsert_overwrites_and_keeps_the_place(self) -> None:
        async def t(store: TranscriptStore) -> None:
            first, second = _message(1), _message(2)
            await store.write(messages=[first, second])
            finished = first.model_copy(update={"finish": "stop", "completed": "t9"})
            await store.write_message(finished)
            assert (await store.page_messages(S)).messages == (finished, second)
            part = TextPart(id="p", session=S, message_id=first.id, start="t1")
            await store.write_part(part)
            done = part.model_copy(update={"text": "all", "end": "t2"})
            await store.write_part(done)
            assert await store.parts_of(S, [first.id]) == {first.id: (done,)}
            assert await store.get_part(S, "p") == done
            assert await store.get_message(S, first.id) == finished
            assert await store.get_message(S, "missing") is None
            assert await store.get_part(S, "missing") is None
            assert await store.get_message("other", first.id) is None

        self.run(t)

    def test_a_part_moved_to_another_message_keeps_its_place(self) -> None:
        async def t(store: TranscriptStore) -> None:
            a, b = _message(1), _message(3)
            await store.write(messages=[a, b])
            await store.write(
                parts=[
                    TextPart(id="p1", session=S, message_id=a.id, text="one"),
                    TextPart(id="p2", session=S, message_id=b.id, text="two"),
                    TextPart(id="p3", session=S, message_id=b.id, text="three"),
                ]
            )
            await store.write_part(TextPart(id="p1", session=S, message_id=b.id, text="moved"))
            found = await store.parts_of(S, [a.id, b.id])
            assert found[a.id] == ()
            assert [(p.id, _text(p)) for p in found[b.id]] == [
                ("p1", "moved"),
                ("p2", "two"),
                ("p3", "three"),
            ]

        self.run(t)

    def test_parts_come_in_creation_order_per_message(self) -> None:
        async def t(store: TranscriptStore) -> None:
            a, b = _message(1), _message(3)
            await store.write(messages=[a, b])
            kinds: list[Part] = [
                StepFinishPart(
                    id="z",
                    session=S,
                    message_id=a.id,
                    time="t",
                    reason="stop",
                    usage=Usage(input_tokens=1),
                ),
                TextPart(id="y", session=S, message_id=b.id, text="for b"),
                ReasoningPart(id="x", session=S, message_id=a.id, text="hmm"),
                FilePart(id="w", session=S, message_id=a.id, mime="image/png", url="file:///a.png"),
            ]
            for part in kinds:
                await store.write_part(part)
            found = await store.parts_of(S, [a.id, b.id, "none", a.id])
            assert list(found) == [a.id, b.id, "none"]
            assert [p.id for p in found[a.id]] == ["z", "x", "w"]
            assert [p.id for p in found[b.id]] == ["y"]
            assert found["none"] == ()
            assert await store.parts_of(S, []) == {}
            assert await store.parts_of("other", [a.id]) == {a.id: ()}
            assert await read_history(store, S, page_size=1) == (
                MessageWithParts(message=a, parts=found[a.id]),
                MessageWithParts(message=b, parts=found[b.id]),
            )

        self.run(t)

    def test_many_message_ids_in_one_call(self) -> None:
        async def t(store: TranscriptStore) -> None:
            messages = [_message(i) for i in range(1200)]
            await store.write(
                messages=messages,
                parts=[
                    TextPart(id=f"p{i}", session=S, message_id=m.id, text=str(i))
                    for i, m in enumerate(messages)
                ],
            )
            found = await store.parts_of(S, [m.id for m in messages])
            assert [_text(found[m.id][0]) for m in messages] == [str(i) for i in range(1200)]

        self.run(t)

    # -- namespaces and sessions -------------------------------------------------------------

    def test_namespaces_never_see_each_other(self) -> None:
        async def t(store: TranscriptStore) -> None:
            tenant = store.with_namespace("tenant-b")
            assert tenant.namespace == "tenant-b" and store.namespace != "tenant-b"
            await store.write_message(_message(1))
            await tenant.write_message(_message(1).model_copy(update={"model": "b"}))
            await tenant.write_part(TextPart(id="p", session=S, message_id="m0001", start="t"))
            assert [m.model for m in (await store.page_messages(S)).messages] == [None]
            assert [m.model for m in (await tenant.page_messages(S)).messages] == ["b"]
            assert await store.parts_of(S, ["m0001"]) == {"m0001": ()}
            assert await store.get_part(S, "p") is None
            assert [s.id for s in await store.sessions()] == [S]
            closed = await store.cleanup_unfinished(S, now="t-clean")
            assert closed.messages and not closed.parts  # only this namespace's rows
            messages, parts = await tenant.unfinished(S)
            assert [m.id for m in messages] == ["m0001"] and [p.id for p in parts] == ["p"]

        self.run(t)

    def test_sessions_are_listed_with_their_times(self) -> None:
        async def t(store: TranscriptStore) -> None:
            await store.write_message(_message(1, session="b"))
            await store.write_message(_message(2, session="a"))
            await store.write_message(
                _message(1, session="b").model_copy(update={"completed": "t5"})
            )
            await store.write_message(_message(0, session="b", created="t0"))
            # Same creation time: by name, in code point order ("B" before "a").
            await store.write_message(_message(7, session="a2", created="t7"))
            await store.write_message(_message(8, session="B2", created="t7"))
            # The latest time is the greatest in code point order too ("b" after "C").
            await store.write_message(_message(9, session="c", created="C"))
            await store.write_message(_message(9, session="c", created="C", completed="b"))
            # Parts alone make no session.
            await store.write_part(TextPart(id="p", session="parts-only", message_id="m"))
            sessions = await store.sessions()
            assert [(s.id, s.created, s.updated) for s in sessions] == [
                ("c", "C", "b"),  # "C" sorts before "t"
                ("b", "t1", "t5"),  # created by its first write, updated to the latest time
                ("a", "t2", "t2"),
                ("B2", "t7", "t7"),
                ("a2", "t7", "t7"),
            ]
            assert await store.sessions(limit=2) == sessions[:2]

        self.run(t)

    def test_session_names_follow_the_journal_rules(self) -> None:
        async def t(store: TranscriptStore) -> None:
            accepted: list[str] = []
            for name in SESSION_NAMES:
                try:
                    check_stream(name)
                except InvalidInputError:
                    for call in (
                        store.write_message(_message(1, session=name)),
                        store.page_messages(name),
                        store.cleanup_unfinished(name, now="t"),
                    ):
                        try:
                            await call
                        except InvalidInputError as exc:
                            assert "session" in str(exc), exc
                        else:
                            raise AssertionError(f"session {name!r} was accepted")
                else:
                    await store.write_message(_message(1, session=name))
                    assert [m.session for m in (await store.page_messages(name)).messages] == [name]
                    accepted.append(name)
            assert sorted(s.id for s in await store.sessions()) == sorted(accepted)
            assert accepted and len(accepted) < len(SESSION_NAMES)

        self.run(t)

    # -- crash cleanup ------------------------------------------------------------------------

    def test_cleanup_closes_every_unfinished_row(self) -> None:
        async def t(store: TranscriptStore) -> None:
            m = _message(1)
            await store.write_message(m)
            await store.write_message(_message(2, completed="t2"))
            await store.write(
                parts=[
                    TextPart(id="t1", session=S, message_id=m.id, text="stored", start="t"),
                    TextPart(id="t2", session=S, message_id=m.id, start="t"),
                    ReasoningPart(id="r", session=S, message_id=m.id, start="t"),
                    ToolPart(
                        id="c1", session=S, message_id=m.id, call_id="1", tool="a", state="pending"
                    ),
                    ToolPart(
                        id="c2", session=S, message_id=m.id, call_id="2", tool="b", state="running"
                    ),
                    ToolPart(
                        id="c3",
                        session=S,
                        message_id=m.id,
                        call_id="3",
                        tool="c",
                        state="completed",
                    ),
                    TextPart(id="done", session=S, message_id=m.id, text="ok", end="t"),
                ]
            )
            messages, parts = await store.unfinished(S)
            assert [x.id for x in messages] == [m.id]
            assert [p.id for p in parts] == ["t1", "t2", "r", "c1", "c2"]
            listed = (await store.parts_of(S, [m.id]))[m.id]  # open parts are rows like any
            assert [p.id for p in listed] == ["t1", "t2", "r", "c1", "c2", "c3", "done"]

            result = await store.cleanup_unfinished(S, {"t2": "confirmed text \n"}, now="t-clean")
            assert [x.finish for x in result.messages] == [INTERRUPTED]
            closed = {p.id: p for p in result.parts}
            assert list(closed) == ["t1", "t2", "r", "c1", "c2"]
            assert _text(closed["t1"]) == "stored" and _text(closed["t2"]) == "confirmed text"
            for tool in ("c1", "c2"):
                part = closed[tool]
                assert isinstance(part, ToolPart)
                assert (part.state, part.error, part.end) == ("error", INTERRUPTED, "t-clean")
            assert await store.unfinished(S) == ((), ())
            stored = await store.get_message(S, m.id)
            assert stored is not None and stored.completed == "t-clean" and not stored.succeeded
            assert await store.get_part(S, "r") == closed["r"]
            assert await store.get_part(S, "done") == TextPart(
                id="done", session=S, message_id=m.id, text="ok", end="t"
            )
            assert not await store.cleanup_unfinished(S, now="t-later")
            assert (await store.page_messages(S)).messages[0] == stored  # kept its place

        self.run(t)

    def test_cleanup_takes_its_time_from_the_caller(self) -> None:
        async def t(store: TranscriptStore) -> None:
            m = _message(1)
            await store.write(
                messages=[m], parts=[TextPart(id="p", session=S, message_id=m.id, start="t")]
            )
            bad: list[dict[str, Any]] = [
                {"now": None},
                {"now": ""},
                {"now": 1700000000},
                {"now": "t", "confirmed": ["p"]},
                {"now": "t", "confirmed": {"p": 3}},
            ]
            for kwargs in bad:
                try:
                    await store.cleanup_unfinished(S, **kwargs)
                except InvalidInputError as exc:
                    assert "now" in str(exc) or "confirmed" in str(exc), exc
                else:
                    raise AssertionError(f"cleanup_unfinished accepted {kwargs!r}")
            assert await store.unfinished(S) == (
                (m,),
                (TextPart(id="p", session=S, message_id=m.id, start="t"),),
            )  # nothing was closed
            for now in ("2030-01-01T00:00:00+00:00", "1999-12-31T23:59:59Z"):
                await store.write_message(m)
                result = await store.cleanup_unfinished(S, now=now)
                assert [x.completed for x in result.messages] == [now]

        self.run(t)

    # -- refusals and atomicity ----------------------------------------------------------------

    def test_bad_arguments_are_refused(self) -> None:
        async def t(store: TranscriptStore) -> None:
            checks: list[tuple[type[Exception], str, Callable[[], Awaitable[object]]]] = [
                (InvalidCursorError, "page_messages", lambda: store.page_messages(S, after="42")),
                (InvalidCursorError, "cursor", lambda: store.page_messages(S, after=7)),  # type: ignore[arg-type]
                (InvalidInputError, "session", lambda: store.page_messages("")),
                (InvalidInputError, "session", lambda: store.get_message(None, "m")),  # type: ignore[arg-type]
                (InvalidInputError, "message_id", lambda: store.get_message(S, 1)),  # type: ignore[arg-type]
                (InvalidInputError, "part_id", lambda: store.get_part(S, None)),  # type: ignore[arg-type]
                (InvalidInputError, "message_ids", lambda: store.parts_of(S, "m0001")),
                (InvalidInputError, "message_ids[1]", lambda: store.parts_of(S, ["m", 2])),  # type: ignore[list-item]
                (InvalidInputError, "limit", lambda: store.sessions(limit=0)),
                (
                    InvalidInputError,
                    "not a Message",
                    lambda: store.write(messages=[TextPart(id="p", session=S, message_id="m")]),  # type: ignore[list-item]
                ),
                (
                    InvalidInputError,
                    "not a Part",
                    lambda: store.write(parts=[_message(1)]),  # type: ignore[list-item]
                ),
            ]
            for limit in (0, -1, 1001, True, 2.5, "10"):
                checks.append(
                    (InvalidInputError, "limit", lambda n=limit: store.page_messages(S, limit=n))  # type: ignore[misc]
                )
            for error, words, call in checks:
                try:
                    await call()
                except error as exc:
                    assert words in str(exc), (words, exc)
                else:
                    raise AssertionError(f"no {error.__name__} about {words!r}")
            assert (await store.page_messages(S)).messages == () and await store.sessions() == ()

        self.run(t)

    def test_a_failed_batch_writes_nothing(self) -> None:
        async def t(store: TranscriptStore) -> None:
            good = _message(1)
            part = TextPart(id="p", session=S, message_id=good.id)
            bad_session = TextPart(id="q", session="bad\x00", message_id=good.id)
            for messages, parts in (
                ([good, "not a message"], []),
                ([good], [part, bad_session]),
            ):
                try:
                    await store.write(messages=messages, parts=parts)  # type: ignore[arg-type]
                except InvalidInputError as exc:
                    assert "nothing was written" in str(exc) or "not a Message" in str(exc)
                else:
                    raise AssertionError("a batch with a bad row was written")
            assert (await store.page_messages(S)).messages == ()
            assert await store.get_part(S, "p") is None and await store.sessions() == ()

        self.run(t)

    def test_unicode_and_nul_round_trip(self) -> None:
        async def t(store: TranscriptStore) -> None:
            text = "nul\x00 emoji 🧪 rtl \u202e quotes \" ' \\ newline\n \u2028"
            m = _message(1, model=text)
            part = TextPart(id="p\u00e9", session=S, message_id=m.id, text=text, end="t")
            tool = ToolPart(
                id="c",
                session=S,
                message_id=m.id,
                call_id="1",
                tool="sh",
                state="completed",
                input={"nested": [1, 2.5, None, {"k": text}], "big": 2**53 + 1},
                output=text,
            )
            await store.write(messages=[m], parts=[part, tool])
            assert (await store.parts_of(S, [m.id]))[m.id] == (part, tool)
            assert await store.get_message(S, m.id) == m

        self.run(t)

    # -- lifecycle and concurrency ---------------------------------------------------------------

    def test_a_closed_store_refuses(self) -> None:
        async def t(store: TranscriptStore) -> None:
            async with store as opened:
                assert opened is store
                await store.write_message(_message(1))
            view = store.with_namespace("other")
            for call in (
                lambda: store.page_messages(S),
                lambda: store.write_message(_message(2)),
                lambda: store.cleanup_unfinished(S, now="t"),
                lambda: store.sessions(),
                lambda: view.page_messages(S),
                lambda: store.open(),
            ):
                try:
                    await call()
                except StoreUnavailableError:
                    pass
                else:
                    raise AssertionError("a closed store answered")
            await store.close()  # closing twice is harmless

        self.run(t)

    def test_concurrent_first_use_opens_once(self) -> None:
        async def t(store: TranscriptStore) -> None:
            await asyncio.gather(*(store.write_message(_message(i)) for i in range(10)))
            pages = await asyncio.gather(*(store.page_messages(S) for _ in range(10)))
            assert all(len(p.messages) == 10 for p in pages)

        self.run(t)

    def test_concurrent_writers_keep_every_row_once(self) -> None:
        async def t(store: TranscriptStore) -> None:
            async def writer(w: int) -> None:
                for k in range(5):
                    m = Message(id=f"w{w}-{k}", session=S, role="user", created=f"t{w}")
                    await store.write(
                        messages=[m],
                        parts=[TextPart(id=f"w{w}-{k}-p", session=S, message_id=m.id)],
                    )

            await asyncio.gather(*(writer(w) for w in range(8)))
            ids = [m.id for m in (await store.page_messages(S, limit=1000)).messages]
            assert sorted(ids) == sorted(f"w{w}-{k}" for w in range(8) for k in range(5))
            for w in range(8):  # each writer's messages in the order it wrote them
                assert [i for i in ids if i.startswith(f"w{w}-")] == [f"w{w}-{k}" for k in range(5)]
            found = await store.parts_of(S, ids)
            assert all([p.id for p in found[i]] == [f"{i}-p"] for i in ids)

        self.run(t)
