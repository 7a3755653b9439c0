"""The transcript stores beyond their contract: the URL factory, the package's import
graph, memory against SQLite, and what only one backend can show (a failed SQLite open, an
unreachable or refusing PostgreSQL server)."""

from __future__ import annotations

import ast
import asyncio
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold.transcript
from contextfold.errors import InvalidInputError, StoreError, StoreUnavailableError
from contextfold.transcript import (
    MemoryTranscriptStore,
    Message,
    Part,
    PatchPart,
    ReasoningPart,
    SQLiteTranscriptStore,
    StepFinishPart,
    TextPart,
    ToolPart,
    TranscriptStore,
    open_transcript_store,
)

S = "session-1"


def message(index: int, session: str = S, **kwargs: Any) -> Message:
    role = "user" if index % 2 == 0 else "assistant"
    return Message(id=f"m{index:04d}", session=session, role=role, created=f"t{index}", **kwargs)


# -- the factory ------------------------------------------------------------------------------


async def test_open_transcript_store_picks_the_backend_by_scheme(tmp_path: Path) -> None:
    memory = open_transcript_store("memory://", namespace="tenant")
    assert isinstance(memory, MemoryTranscriptStore) and memory.namespace == "tenant"
    await memory.write_message(message(1))
    assert [m.id for m in (await memory.page_messages(S)).messages] == ["m0001"]
    assert (await open_transcript_store("memory:").page_messages(S)).messages == ()  # its own

    path = tmp_path / "t.db"
    on_disk = open_transcript_store(f"sqlite:///{path}", synchronous="FULL")
    assert isinstance(on_disk, SQLiteTranscriptStore) and on_disk.path == str(path)
    async with on_disk:
        await on_disk.write_message(message(1))
    assert path.exists()
    private = open_transcript_store("sqlite:///:memory:")
    assert isinstance(private, SQLiteTranscriptStore) and private.path == ":memory:"

    from contextfold.transcript.store.postgres import PostgresTranscriptStore

    for url in ("postgresql://u@h/db", "postgres://u@h/db", "postgresql+psycopg://u@h/db"):
        pg = open_transcript_store(url, namespace="n")
        assert isinstance(pg, PostgresTranscriptStore)
        assert (pg.dsn, pg.namespace) == ("postgresql://u@h/db", "n")


def test_open_transcript_store_refuses_other_urls_as_the_journal_does() -> None:
    import contextfold as cf

    cases = [
        ("mysql://root:hunter2@db/x", "unknown transcript URL"),
        ("sqlite:///", "names no file"),
        ("sqlite://relative.db", "unknown transcript URL"),
        (42, "must be a str"),
    ]
    for url, words in cases:
        with pytest.raises(InvalidInputError, match=words) as info:
            open_transcript_store(url)  # type: ignore[arg-type]
        assert "hunter2" not in str(info.value)
        # The journal reads URLs with the same parser: same refusal, its own noun.
        journal_words = words.replace("transcript", "journal")
        with pytest.raises(InvalidInputError, match=journal_words):
            cf.open_journal(url)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="namespace"):
        open_transcript_store("memory://", namespace="")


def _imports(path: Path, package: str) -> set[str]:
    """Modules of ``package``'s tree imported anywhere in the file, but for type checking."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        base = package.split(".")
        base = base[: len(base) - node.level + 1]
        target = ".".join([*base, *(node.module.split(".") if node.module else [])])
        names = [f"{target}.{a.name}" for a in node.names] if node.module is None else [target]
        found.update(names)
    return found


def test_no_transcript_module_imports_its_own_importer() -> None:
    """The factory reaches backends lazily; no import chain in the transcript package
    (function-level imports included) comes back to where it started."""
    root = Path(contextfold.transcript.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        parts = ["contextfold", "transcript", *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        package = name if is_package else name.rsplit(".", 1)[0]
        graph[name] = _imports(path, package)
    assert "contextfold.transcript.store.factory" in graph

    def cycle_from(start: str) -> list[str] | None:
        stack: list[tuple[str, list[str]]] = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return [*trail, nxt]
                if nxt not in seen and nxt in graph:
                    seen.add(nxt)
                    stack.append((nxt, [*trail, nxt]))
        return None

    cycles = [c for c in map(cycle_from, sorted(graph)) if c is not None]
    assert cycles == []


# -- memory and SQLite agree -------------------------------------------------------------------

_ids = st.sampled_from(["a", "b", "c", "d"])
_sessions = st.sampled_from([S, "other"])
_times = st.sampled_from(["t1", "t2", "t3", "T", ""])


@st.composite
def _messages(draw: st.DrawFn) -> Message:
    return Message(
        id=draw(_ids),
        session=draw(_sessions),
        role=draw(st.sampled_from(["user", "assistant"])),
        created=draw(_times),
        completed=draw(st.none() | _times),
    )


@st.composite
def _parts(draw: st.DrawFn) -> Part:
    common = {"id": draw(_ids), "session": draw(_sessions), "message_id": draw(_ids)}
    if draw(st.booleans()):
        return TextPart(
            **common, text=draw(st.text(max_size=5)), start=draw(st.none() | _times), end=None
        )
    return ToolPart(
        **common,
        call_id="c",
        tool="t",
        state=draw(st.sampled_from(["pending", "running", "completed", "error"])),
    )


_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("write"), st.lists(_messages(), max_size=3), st.lists(_parts(), max_size=3)
        ),
        st.tuples(st.just("cleanup"), _sessions, st.dictionaries(_ids, st.text(max_size=3))),
    ),
    max_size=12,
)


async def _observe(store: TranscriptStore, ops: Sequence[Any], page: int) -> list[Any]:
    seen: list[Any] = []
    tenant = store.with_namespace("tenant")
    for kind, *args in ops:
        if kind == "write":
            await store.write(messages=args[0], parts=args[1])
            await tenant.write(messages=args[0][:1])
        else:
            closed = await store.cleanup_unfinished(args[0], args[1], now="t-now")
            seen.append(("closed", closed))
    for session in (S, "other"):
        cursor: str | None = None
        while True:  # paging strips the cursors: only their effect must agree
            got = await store.page_messages(session, after=cursor, limit=page)
            ids = [m.id for m in got.messages]
            seen.append((session, got.messages, got.more, await store.parts_of(session, ids)))
            cursor = got.cursor
            if not got.more:
                break
        seen.append(await store.unfinished(session))
    seen.append(await store.sessions())
    seen.append(await tenant.sessions())
    return seen


@settings(max_examples=150, deadline=None)
@given(ops=_ops, page=st.integers(1, 4))
def test_memory_and_sqlite_agree_on_any_history(ops: list[Any], page: int) -> None:
    async def run() -> None:
        async with SQLiteTranscriptStore(":memory:") as sqlite_store:
            expected = await _observe(sqlite_store, ops, page)
        actual = await _observe(MemoryTranscriptStore(), ops, page)
        assert actual == expected

    asyncio.run(run())


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
    backend=st.sampled_from([MemoryTranscriptStore, lambda: SQLiteTranscriptStore(":memory:")]),
)
def test_rows_round_trip(
    text: str,
    name: str,
    args: dict[str, Any],
    cost: float,
    files: tuple[str, ...],
    backend: Any,
) -> None:
    m = Message(id="m", session=S, role="assistant", created=text, model=name or None)
    parts: list[Part] = [
        TextPart(id="a", session=S, message_id="m", text=text),
        ReasoningPart(id="r", session=S, message_id="m", text=name, start=text),
        ToolPart(
            id="b", session=S, message_id="m", call_id=name, tool=name, input=args, output=text
        ),
        StepFinishPart(id="c", session=S, message_id="m", time=text, reason=name, cost=cost),
        PatchPart(id="d", session=S, message_id="m", hash=name, files=files),
    ]

    async def run() -> None:
        async with backend() as store:
            await store.write(messages=[m], parts=parts)
            assert (await store.page_messages(S)).messages == (m,)
            assert (await store.parts_of(S, ["m"]))["m"] == tuple(parts)

    asyncio.run(run())


async def test_memory_rows_do_not_change_with_the_callers_objects() -> None:
    """As in SQLite, a row is stored as its JSON: mutating what was written changes nothing."""
    store = MemoryTranscriptStore()
    tool_input: dict[str, Any] = {"cmd": "ls"}
    part = ToolPart(
        id="c",
        session=S,
        message_id="m",
        call_id="1",
        tool="sh",
        state="completed",
        input=tool_input,
    )
    await store.write_part(part)
    tool_input["cmd"] = "rm -rf /"
    stored = await store.get_part(S, "c")
    assert isinstance(stored, ToolPart) and stored.input == {"cmd": "ls"}


# -- one backend only ---------------------------------------------------------------------------


async def test_a_stored_row_that_no_longer_decodes_names_its_session(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    async with SQLiteTranscriptStore(path) as store:
        await store.write_message(message(1))
    with sqlite3.connect(path) as raw:
        raw.execute('UPDATE cf_transcript_messages SET data = \'{"id": "m0001"}\'')
    raw.close()
    async with SQLiteTranscriptStore(path) as store:
        with pytest.raises(StoreError, match=f"message row of session '{S}' no longer decodes"):
            await store.page_messages(S)


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
    from contextfold.transcript.store.postgres import PostgresTranscriptStore

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
    from contextfold.transcript.store.postgres import PostgresTranscriptStore

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
    from contextfold.transcript.store.postgres import PostgresTranscriptStore

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
