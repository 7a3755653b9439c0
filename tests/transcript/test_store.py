"""The transcript stores on real SQLite files and a real PostgreSQL server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contextfold.errors import InvalidCursorError, InvalidInputError, StoreUnavailableError
from contextfold.transcript import (
    INTERRUPTED,
    FilePart,
    Message,
    MessageWithParts,
    Part,
    ReasoningPart,
    SQLiteTranscriptStore,
    StepFinishPart,
    TextPart,
    ToolPart,
    TranscriptStore,
    Usage,
    open_transcript_store,
    read_history,
)

S = "session-1"


def message(index: int, session: str = S, **kwargs: Any) -> Message:
    role = "user" if index % 2 == 0 else "assistant"
    return Message(id=f"m{index:04d}", session=session, role=role, created=f"t{index}", **kwargs)


async def test_pagination_reads_the_full_history_once_in_order(store: TranscriptStore) -> None:
    # Ids in descending order: the order is the order of first writes, not of ids.
    messages = [
        Message(id=f"z{999 - i:03d}", session=S, role="user", created="same-time")
        for i in range(250)
    ]
    for start in range(0, 250, 50):
        await store.write(messages=messages[start : start + 50])
    await store.write(messages=[message(0, session="other-session")])

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
    assert [len(seen[i : i + 40]) for i in range(0, 250, 40)] == [40] * 6 + [10]

    # A cursor round trip: resuming from any page's cursor gives exactly the rest.
    resumed = await store.page_messages(S, after=cursors[2], limit=1000)
    assert resumed.messages == tuple(messages[120:]) and not resumed.more
    # At the end, an empty page keeps the cursor, and new messages appear after it.
    end = await store.page_messages(S, after=cursor, limit=40)
    assert end.messages == () and end.cursor == cursor and not end.more
    late = message(9999)
    await store.write_message(late)
    assert (await store.page_messages(S, after=cursor)).messages == (late,)


async def test_an_upsert_overwrites_and_keeps_the_place(store: TranscriptStore) -> None:
    first, second = message(1), message(2)
    await store.write(messages=[first, second])
    finished = first.model_copy(update={"finish": "stop", "completed": "t9"})
    await store.write_message(finished)
    page = await store.page_messages(S)
    assert page.messages == (finished, second)
    part = TextPart(id="p", session=S, message_id=first.id, start="t1")
    await store.write_part(part)
    done = part.model_copy(update={"text": "all", "end": "t2"})
    await store.write_part(done)
    assert await store.parts_of(S, [first.id]) == {first.id: (done,)}
    assert await store.get_part(S, "p") == done
    assert await store.get_message(S, first.id) == finished
    assert await store.get_message(S, "missing") is None and await store.get_part(S, "x") is None


async def test_parts_come_in_creation_order_per_message(store: TranscriptStore) -> None:
    a, b = message(1), message(3)
    await store.write(messages=[a, b])
    kinds: list[Part] = [
        StepFinishPart(
            id="z", session=S, message_id=a.id, time="t", reason="stop", usage=Usage(input=1)
        ),
        TextPart(id="y", session=S, message_id=b.id, text="for b"),
        ReasoningPart(id="x", session=S, message_id=a.id, text="hmm"),
        FilePart(id="w", session=S, message_id=a.id, mime="image/png", url="file:///a.png"),
    ]
    for part in kinds:
        await store.write_part(part)
    found = await store.parts_of(S, [a.id, b.id, "none"])
    assert [p.id for p in found[a.id]] == ["z", "x", "w"]
    assert [p.id for p in found[b.id]] == ["y"]
    assert found["none"] == ()
    assert await store.parts_of(S, []) == {}
    history = await read_history(store, S, page_size=1)
    assert history == (
        MessageWithParts(message=a, parts=found[a.id]),
        MessageWithParts(message=b, parts=found[b.id]),
    )


async def test_namespaces_never_see_each_other(store: TranscriptStore) -> None:
    tenant = store.with_namespace("tenant-b")
    await store.write_message(message(1))
    await tenant.write_message(message(1).model_copy(update={"model": "b"}))
    await tenant.write_part(TextPart(id="p", session=S, message_id="m0001", end="t"))
    assert [m.model for m in (await store.page_messages(S)).messages] == [None]
    assert [m.model for m in (await tenant.page_messages(S)).messages] == ["b"]
    assert await store.parts_of(S, ["m0001"]) == {"m0001": ()}
    assert [s.id for s in await store.sessions()] == [S]


async def test_sessions_are_listed_with_their_times(store: TranscriptStore) -> None:
    await store.write_message(message(1, session="b"))
    await store.write_message(message(2, session="a"))
    await store.write_message(message(1, session="b").model_copy(update={"completed": "t5"}))
    sessions = await store.sessions()
    assert [(s.id, s.created, s.updated) for s in sessions] == [
        ("b", "t1", "t5"),
        ("a", "t2", "t2"),
    ]
    assert len(await store.sessions(limit=1)) == 1


async def test_cleanup_closes_every_unfinished_row(store: TranscriptStore) -> None:
    m = message(1)
    await store.write_message(m)
    await store.write(
        parts=[
            TextPart(id="t1", session=S, message_id=m.id, text="stored", start="t"),
            TextPart(id="t2", session=S, message_id=m.id, start="t"),
            ReasoningPart(id="r", session=S, message_id=m.id, start="t"),
            ToolPart(id="c1", session=S, message_id=m.id, call_id="1", tool="a", state="pending"),
            ToolPart(id="c2", session=S, message_id=m.id, call_id="2", tool="b", state="running"),
            ToolPart(id="c3", session=S, message_id=m.id, call_id="3", tool="c", state="completed"),
            TextPart(id="done", session=S, message_id=m.id, text="ok", end="t"),
        ]
    )
    messages, parts = await store.unfinished(S)
    assert [x.id for x in messages] == [m.id] and [p.id for p in parts] == [
        "t1",
        "t2",
        "r",
        "c1",
        "c2",
    ]

    result = await store.cleanup_unfinished(S, {"t2": "confirmed text \n"}, now="t-clean")
    assert [x.finish for x in result.messages] == [INTERRUPTED]
    closed = {p.id: p for p in result.parts}
    assert closed.keys() == {"t1", "t2", "r", "c1", "c2"}
    assert closed["t1"].text == "stored" and closed["t2"].text == "confirmed text"  # type: ignore[union-attr]
    assert closed["r"].end == "t-clean"  # type: ignore[union-attr]
    assert {closed[c].state for c in ("c1", "c2")} == {"error"}  # type: ignore[union-attr]
    assert await store.unfinished(S) == ((), ())
    stored = await store.get_message(S, m.id)
    assert stored is not None and stored.completed == "t-clean" and not stored.succeeded
    assert (await store.parts_of(S, [m.id]))[m.id][-1].text == "ok"  # type: ignore[union-attr]
    assert not await store.cleanup_unfinished(S)


async def test_bad_arguments_are_refused(store: TranscriptStore) -> None:
    with pytest.raises(InvalidCursorError, match="page_messages"):
        await store.page_messages(S, after="42")
    with pytest.raises(InvalidCursorError):
        await store.page_messages(S, after=7)  # type: ignore[arg-type]
    for limit in (0, -1, 1001, True, 2.5):
        with pytest.raises(InvalidInputError, match="limit"):
            await store.page_messages(S, limit=limit)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="session"):
        await store.page_messages("")
    with pytest.raises(InvalidInputError, match="not a Message"):
        await store.write(messages=[TextPart(id="p", session=S, message_id="m")])  # type: ignore[list-item]
    with pytest.raises(InvalidInputError, match="not a Part"):
        await store.write(parts=[message(1)])  # type: ignore[list-item]
    assert (await store.page_messages(S)).messages == ()


async def test_a_failed_batch_writes_nothing(store: TranscriptStore) -> None:
    good = message(1)
    with pytest.raises(InvalidInputError):
        await store.write(messages=[good, "not a message"])  # type: ignore[list-item]
    assert (await store.page_messages(S)).messages == ()


async def test_unicode_and_nul_round_trip(store: TranscriptStore) -> None:
    m = message(1)
    text = "nul\x00 emoji 🧪 rtl \u202e quotes \" ' \\ newline\n"
    part = TextPart(id="p", session=S, message_id=m.id, text=text, end="t")
    await store.write(messages=[m], parts=[part])
    assert (await store.parts_of(S, [m.id]))[m.id] == (part,)


async def test_closed_store_refuses(tmp_path: Any) -> None:
    store = open_transcript_store(f"sqlite:///{tmp_path / 'x.db'}")
    await store.open()
    await store.close()
    with pytest.raises(StoreUnavailableError):
        await store.page_messages(S)
    with pytest.raises(InvalidInputError, match="unknown transcript URL"):
        open_transcript_store("mysql://x")


json_text = st.text(max_size=40)


@settings(max_examples=60, deadline=None)
@given(
    text=json_text,
    name=json_text,
    args=st.dictionaries(
        st.text(max_size=8), st.one_of(st.integers(-(2**53), 2**53), json_text, st.none())
    ),
    cost=st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False),
    files=st.lists(json_text, max_size=4).map(tuple),
)
def test_rows_round_trip_through_sqlite(
    text: str, name: str, args: dict[str, Any], cost: float, files: tuple[str, ...]
) -> None:
    from contextfold.transcript import PatchPart

    m = Message(id="m", session=S, role="assistant", created=text, model=name or None)
    parts: list[Part] = [
        TextPart(id="a", session=S, message_id="m", text=text),
        ToolPart(
            id="b", session=S, message_id="m", call_id=name, tool=name, input=args, output=text
        ),
        StepFinishPart(id="c", session=S, message_id="m", time=text, reason=name, cost=cost),
        PatchPart(id="d", session=S, message_id="m", hash=name, files=files),
    ]

    async def run() -> None:
        async with SQLiteTranscriptStore(":memory:") as store:
            await store.write(messages=[m], parts=parts)
            assert (await store.page_messages(S)).messages == (m,)
            assert (await store.parts_of(S, ["m"]))["m"] == tuple(parts)

    asyncio.run(run())


async def test_concurrent_first_use_opens_once(unopened_store: TranscriptStore) -> None:
    await asyncio.gather(*(unopened_store.write_message(message(i)) for i in range(10)))
    pages = await asyncio.gather(*(unopened_store.page_messages(S) for _ in range(10)))
    assert all(len(p.messages) == 10 for p in pages)


async def test_a_failed_sqlite_open_is_retried_on_the_next_call(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store's directory should be")
    store = SQLiteTranscriptStore(blocker / "transcript.db")
    try:
        with pytest.raises(StoreUnavailableError, match="cannot open"):
            await store.write_message(message(0))
        blocker.unlink()  # the directory can now be created
        await store.write_message(message(0))
        assert [m.id for m in (await store.page_messages(S)).messages] == ["m0000"]
    finally:
        await store.close()


async def test_postgres_unreachable_is_unavailable_and_hides_the_password() -> None:
    from contextfold.transcript.postgres import PostgresTranscriptStore

    store = PostgresTranscriptStore("postgresql://nobody:secret@127.0.0.1:1/none", timeout=1.0)
    with pytest.raises(StoreUnavailableError, match="opening the transcript store") as info:
        await store.open()
    assert "secret" not in str(info.value)
    await store.close()
    keyword = PostgresTranscriptStore("host=127.0.0.1 port=1 password=secret dbname=none")
    assert "secret" not in keyword.url and "127.0.0.1" in keyword.url


async def test_postgres_refused_statement_is_a_store_error_not_unavailable(pg_dsn: str) -> None:
    """The journal's translation: a statement the server refuses (here a lock timeout, an
    OperationalError) is a StoreError; only an unreachable server is unavailable."""
    import psycopg
    from psycopg import sql

    from contextfold.errors import StoreError
    from contextfold.transcript.postgres import PostgresTranscriptStore

    with psycopg.connect(pg_dsn, autocommit=True) as admin:
        name = admin.execute("SELECT current_database()").fetchone()[0]  # type: ignore[index]
        admin.execute(
            sql.SQL("ALTER DATABASE {} SET lock_timeout = '100ms'").format(sql.Identifier(name))
        )
    holder = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
    store = PostgresTranscriptStore(pg_dsn)
    try:
        await holder.execute(
            "SELECT pg_advisory_lock(hashtextextended(%s, 0))", (f"default\x1f{S}",)
        )
        with pytest.raises(StoreError, match="writing transcript rows") as info:
            await store.write_message(message(0))
        assert not isinstance(info.value, StoreUnavailableError)
    finally:
        await store.close()
        await holder.close()


async def test_postgres_closed_during_its_first_open_leaves_no_pool_open(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() while the first open is still connecting: the pool that open makes is closed
    too, not left running behind a store that says it is closed."""
    from contextfold.transcript.postgres import PostgresTranscriptStore

    store = PostgresTranscriptStore(pg_dsn)
    opening = asyncio.Event()
    pools: list[Any] = []
    open_pool = store._open_pool

    async def slow_open_pool() -> Any:
        opening.set()
        await asyncio.sleep(0.05)  # close() lands here, while the pool is being made
        pool = await open_pool()
        pools.append(pool)
        return pool

    monkeypatch.setattr(store, "_open_pool", slow_open_pool)
    first = asyncio.create_task(store.open())
    await opening.wait()
    await store.close()
    await asyncio.gather(first, return_exceptions=True)
    assert len(pools) == 1 and pools[0].closed, "the first open's pool outlived close()"
    with pytest.raises(StoreUnavailableError, match="closed"):
        await store.open()
