"""Heads, latest results and reads after the head, answered without a query while no other
connection committed; whatever another connection or process commits is always seen."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.errors import StoreFileMovedError, WrongExpectedVersionError
from contextfold.journal import Journal
from contextfold.store.sqlite import SQLiteStore
from tests.store.helpers import blocked, until


def raw(i: int, type: str = "note") -> cf.RawEvent:
    return cf.RawEvent(type, {"i": i})


async def test_what_this_connection_wrote_or_read_is_answered_without_a_query(
    tmp_path: Path,
) -> None:
    store = SQLiteStore(tmp_path / "journal.db")
    async with Journal(store) as journal:
        await journal.append("s", raw(0))
        assert await journal.latest("s", ["note"])  # read once: known from now on
        conn = store._db.connection
        assert conn is not None
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        done = await journal.append("s", raw(1, "other"))
        del statements[:]
        assert await journal.head("s") == done.cursor
        assert await journal.head("s") == done.cursor
        assert (await journal.read("s", after=done.cursor)).events == ()
        assert [e.payload for e in await journal.latest("s", ["note"])] == [{"i": 0}]
        assert await journal.head("empty") is None  # one lookup, then known
        assert await journal.head("empty") is None
        conn.set_trace_callback(None)
        lookups = [s for s in statements if s != "PRAGMA data_version"]
        assert len(lookups) == 1 and lookups[0].startswith("SELECT global_position")
        assert len(statements) == 7


async def test_an_append_of_a_type_makes_its_latest_read_again(tmp_path: Path) -> None:
    async with cf.open_journal(f"sqlite:///{tmp_path / 'journal.db'}") as journal:
        await journal.append("s", raw(0))
        assert [e.payload for e in await journal.latest("s", ["note"])] == [{"i": 0}]
        await journal.append("s", raw(1))
        assert [e.payload for e in await journal.latest("s", ["note"])] == [{"i": 1}]
        await journal.delete_stream("s")
        assert await journal.latest("s", ["note"]) == ()
        assert await journal.head("s") is None


_CHILD = """
import os, signal, sys
import contextfold as cf

url, action = sys.argv[1:3]
journal = cf.open_journal_sync(url)
if action == "append":
    journal.append("s", cf.RawEvent("note", {"i": 99}))
else:
    journal.delete_stream("s")
os.kill(os.getpid(), signal.SIGKILL)  # a writer killed right after its commit
"""


def _in_another_process(url: str, action: str) -> None:
    child = subprocess.run([sys.executable, "-c", _CHILD, url, action], capture_output=True)
    assert child.returncode == -9, child.stderr.decode()


async def test_another_process_that_committed_and_was_killed_is_seen(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    async with cf.open_journal(url) as journal:
        before = await journal.append("s", raw(0))
        assert await journal.head("s") == before.cursor
        assert await journal.latest("s", ["note"])
        assert (await journal.read("s", after=before.cursor)).events == ()

        await asyncio.to_thread(_in_another_process, url, "append")
        head = await journal.head("s")
        assert head is not None and head != before.cursor
        (newest,) = await journal.latest("s", ["note"])
        assert newest.payload == {"i": 99} and newest.cursor == head
        page = await journal.read("s", after=before.cursor)
        assert [e.payload for e in page.events] == [{"i": 99}] and page.cursor == head

        await asyncio.to_thread(_in_another_process, url, "delete")
        assert await journal.head("s") is None
        assert await journal.latest("s", ["note"]) == ()
        assert (await journal.read("s", after=head)).reset


async def test_appends_whose_commit_failed_leave_the_heads_as_they_were(tmp_path: Path) -> None:
    """Appends that share one commit on the worker are noted only once it succeeded: here
    the moved-file check refuses it, and the heads stay those of the file's content."""
    path = tmp_path / "journal.db"
    store = SQLiteStore(path)
    journal = Journal(store)
    try:
        first = await journal.append("s", raw(0))
        assert await journal.head("s") == first.cursor
        blocker, release = await blocked(store._db)  # the thread is busy: appends queue
        appends = [asyncio.ensure_future(journal.append("s", raw(i))) for i in (1, 2)]
        await until(lambda: len(store._db._pending) == len(appends))
        path.unlink()
        release.set()
        await blocker
        for outcome in await asyncio.gather(*appends, return_exceptions=True):
            assert isinstance(outcome, StoreFileMovedError)
        assert await journal.head("s") == first.cursor
        assert (await journal.read("s", after=first.cursor)).events == ()
    finally:
        await journal.close()


async def test_a_refused_append_leaves_the_heads_as_they_were(tmp_path: Path) -> None:
    async with cf.open_journal(f"sqlite:///{tmp_path / 'journal.db'}") as journal:
        first = await journal.append("s", raw(0))
        with pytest.raises(WrongExpectedVersionError):
            await journal.append("s", raw(1), expected_version=5)
        assert await journal.head("s") == first.cursor
        retry = await journal.append("s", raw(1), idempotency_key="k")
        assert (await journal.append("s", raw(1), idempotency_key="k")).deduplicated
        assert await journal.head("s") == retry.cursor


async def test_a_cursor_no_store_hands_out_still_reads_from_the_start(tmp_path: Path) -> None:
    async with cf.open_journal(f"sqlite:///{tmp_path / 'journal.db'}") as journal:
        await journal.append("s", [raw(0), raw(1)])
        for after in ("?", "", "x"):  # whatever a store answers for a head it does not know
            page = await journal.read("s", after=after)
            assert page.reset and [e.payload["i"] for e in page.events] == [0, 1]
        assert (await journal.read("empty", after="?")).reset


# -- two connections on one file, against what the file holds -----------------------------

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "append-other", "stale-append", "delete", "head", "latest"]),
        st.integers(0, 1),  # which of the two stores
        st.sampled_from(["a", "b"]),  # which stream
    ),
    max_size=25,
)


def _held(db: sqlite3.Connection, stream: str) -> tuple[str | None, str | None]:
    """The stream's head and newest "note" cursor, as the file holds them now."""
    found = [
        db.execute(
            "SELECT global_position FROM cf_events WHERE namespace = 'default' AND stream = ?"
            + where
            + " ORDER BY position DESC LIMIT 1",
            (stream,),
        ).fetchone()
        for where in ("", " AND type = 'note'")
    ]
    return tuple(str(row[0]) if row else None for row in found)  # type: ignore[return-value]


@settings(max_examples=40, deadline=None)
@given(_OPS)
def test_two_stores_on_one_file_answer_what_the_file_holds(
    ops: list[tuple[str, int, str]],
) -> None:
    async def run(path: Path) -> None:
        journals = [Journal(SQLiteStore(path)), Journal(SQLiteStore(path))]
        for journal in journals:
            await journal.store.open()
        db = sqlite3.connect(path, isolation_level=None)
        try:
            seen: dict[tuple[int, str], str | None] = {}
            for i, (op, who, stream) in enumerate(ops):
                journal = journals[who]
                if op == "append":
                    await journal.append(stream, raw(i))
                elif op == "append-other":
                    await journal.append(stream, raw(i, "other"))
                elif op == "stale-append":
                    with pytest.raises(WrongExpectedVersionError):
                        await journal.append(stream, raw(i), expected_version=1000)
                elif op == "delete":
                    await journal.delete_stream(stream)
                head, note = _held(db, stream)
                if op == "head":
                    assert await journal.head(stream) == head
                    # A read after the head this store saw before finds what came since.
                    after = seen.get((who, stream))
                    page = await journal.read(stream, after=after)
                    assert page.cursor == head
                    seen[(who, stream)] = head
                elif op == "latest":
                    newest = await journal.latest(stream, ["note"])
                    assert (newest[0].cursor if newest else None) == note
        finally:
            db.close()
            for journal in journals:
                await journal.close()

    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(run(Path(tmp) / "journal.db"))
