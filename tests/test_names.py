"""Stream, namespace and session names refuse characters that hide or reorder text (control,
bidi and zero-width characters, line separators, the byte order mark) with one check, in the
library as over HTTP; ``contextfold streams`` prints a name stored before that escaped."""

from __future__ import annotations

import ast
import asyncio
import json
import re
import sqlite3
from pathlib import Path
from urllib.parse import quote

import pytest
from typer.testing import CliRunner

import contextfold as cf
from contextfold.cli import app
from contextfold.inspection import verify_stream
from contextfold.journal.encode import (
    MAX_NAME_LENGTH,
    check_name_characters,
    escape_hidden,
    shown_name,
)
from contextfold.server import create_app
from contextfold.server.openapi import openapi_schema
from contextfold.transcript.store.base import check_session
from tests.server.helpers import running

HIDDEN = {
    "\x07": "a control character",
    "\x7f": "a control character",
    "\x85": "a control character",  # C1: NEXT LINE
    "\u202e": "a bidi control",  # RIGHT-TO-LEFT OVERRIDE
    "\u2067": "a bidi control",  # RIGHT-TO-LEFT ISOLATE
    "\u200f": "a bidi control",  # RIGHT-TO-LEFT MARK
    "\u061c": "a bidi control",  # ARABIC LETTER MARK
    "\u200b": "a zero-width character",
    "\u200d": "a zero-width character",
    "\u2060": "a zero-width character",
    "\ufeff": "a byte order mark",
    "\u2028": "a line separator",
    "\ud800": "a lone surrogate",
    "\u00ad": "a soft hyphen",
    "\u2065": "an invisible character",  # unassigned, default-ignorable
    "\u206a": "a format character",  # INHIBIT SYMMETRIC SWAPPING
    "\u206f": "a format character",  # NOMINAL DIGIT SHAPES
    "\U000e0001": "a tag character",  # LANGUAGE TAG
    "\U000e0041": "a tag character",  # TAG LATIN CAPITAL LETTER A
    "\U000e007f": "a tag character",  # CANCEL TAG
    "\ufe00": "a variation selector",
    "\ufe0f": "a variation selector",
    "\U000e0100": "a variation selector",
    "\U000e01ef": "a variation selector",
    "\u115f": "a Hangul filler",
    "\u1160": "a Hangul filler",
    "\u3164": "a Hangul filler",
    "\uffa0": "a Hangul filler",
    "\u034f": "an invisible character",  # COMBINING GRAPHEME JOINER
}


@pytest.mark.parametrize("char", sorted(HIDDEN))
async def test_the_library_refuses_hidden_characters_in_names(char: str) -> None:
    name = f"invoice{char}fdp.exe"
    where = re.escape(f"{HIDDEN[char]}, U+{ord(char):04X}")
    async with cf.open_journal("memory://") as journal:
        with pytest.raises(cf.InvalidStreamNameError, match=where) as refused:
            await journal.append(name, cf.RawEvent("note", {}))
        assert "index 7" in str(refused.value) and char not in str(refused.value)
        with pytest.raises(cf.InvalidInputError, match=where):
            journal.with_namespace(f"tenant{char}")
        assert await journal.list_streams() == ()
    with pytest.raises(cf.InvalidInputError, match=where):
        check_session(name)
    for fine in ("é/ü", "日本語", "a b", "emoji-🙂", "한국어", "a\u00a0b"):
        assert check_name_characters("stream name", fine) == fine


def _journal_with_a_name_stored_before_the_check(path: Path, name: str) -> None:
    """A journal holding a stream whose name today's check refuses (renamed in SQL)."""

    async def write() -> None:
        async with cf.open_journal(f"sqlite:///{path}") as journal:
            await journal.append("placeholder", cf.RawEvent("note", {}))
            await journal.append("plain", cf.RawEvent("note", {}))

    asyncio.run(write())
    with sqlite3.connect(path) as conn:
        for table in ("cf_events", "cf_streams"):
            conn.execute(f"UPDATE {table} SET stream = ? WHERE stream = 'placeholder'", (name,))


def test_streams_prints_hidden_characters_escaped(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    name = "invoice\u202efdp.exe\x85\u200b"
    _journal_with_a_name_stored_before_the_check(path, name)
    url = f"sqlite:///{path}"
    runner = CliRunner()
    listed = runner.invoke(app, ["streams", "--url", url])
    assert listed.exit_code == 0, listed.output
    assert listed.stdout.splitlines() == [f"{name!r}\t1", "plain\t1"]
    as_json = runner.invoke(app, ["streams", "--url", url, "--json"])
    assert as_json.exit_code == 0, as_json.output
    for char in "\u202e\x85\u200b":
        assert char not in listed.stdout and char not in as_json.stdout
    assert json.loads(as_json.stdout)["streams"][0] == {"stream": name, "version": 1}


def test_names_the_check_takes_are_shown_as_they_are() -> None:
    for name in ("a/b", "é", "a b"):
        assert shown_name(name) == name
    assert shown_name("a\u202eb") == "'a\\u202eb'"
    text = json.dumps({"stream": "a\u2066b\x9b"}, ensure_ascii=False)
    assert escape_hidden(text) == '{"stream": "a\\u2066b\\u009b"}'
    assert json.loads(escape_hidden(text)) == json.loads(text)
    for char in HIDDEN:
        if char != "\ud800":  # not in JSON text orjson writes
            text = json.dumps({"stream": f"a{char}b"}, ensure_ascii=False)
            assert char not in escape_hidden(text) and escape_hidden(text).isascii()
            assert json.loads(escape_hidden(text)) == json.loads(text)
            shown = shown_name(f"a{char}b")
            assert char not in shown and ast.literal_eval(shown) == f"a{char}b"


@pytest.mark.parametrize("page_size", [1, 2])
def test_a_listing_pages_past_a_name_stored_before_the_check(
    tmp_path: Path, page_size: int
) -> None:
    # Such a name ends a page and is the next page's cursor: it is a cursor, not a new name.
    path = tmp_path / "journal.db"
    name = "invoice\u202efdp.exe"
    _journal_with_a_name_stored_before_the_check(path, name)

    async def listed() -> list[str]:
        async with cf.open_journal(f"sqlite:///{path}") as journal:
            return [info.stream async for info in journal.all_streams(page_size=page_size)]

    assert asyncio.run(listed()) == [name, "plain"]


def test_a_stream_named_before_the_check_can_be_read_and_deleted(tmp_path: Path) -> None:
    # Only a write checks the name as a new one: old data stays readable and removable.
    path = tmp_path / "journal.db"
    name = "invoice\u202efdp.exe"
    _journal_with_a_name_stored_before_the_check(path, name)

    async def run() -> None:
        async with cf.open_journal(f"sqlite:///{path}") as journal:
            assert [e.type for e in (await journal.read(name)).events] == ["note"]
            assert await journal.version(name) == 1
            assert await journal.head(name) is not None
            assert (await journal.fold(cf.AgentContext, name)) is not None
            assert (await verify_stream(journal, name)).drift_count == 0
            with pytest.raises(cf.InvalidStreamNameError):
                await journal.append(name, cf.RawEvent("note", {}))
            assert await journal.delete_stream(name)
            assert await journal.version(name) == 0

    asyncio.run(run())


def test_http_pages_past_and_reads_a_name_stored_before_the_check(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    name = "invoice\u202efdp.exe"
    _journal_with_a_name_stored_before_the_check(path, name)

    async def run() -> None:
        async with (
            cf.open_journal(f"sqlite:///{path}") as journal,
            running(create_app(journal)) as served,
        ):
            first = await served.client.get("/v1/streams", params={"limit": 1})
            assert first.status_code == 200, first.text
            assert [s["stream"] for s in first.json()["streams"]] == [name]
            after = first.json()["next"]
            assert after == name
            second = await served.client.get("/v1/streams", params={"limit": 1, "after": after})
            assert second.status_code == 200, second.text
            assert [s["stream"] for s in second.json()["streams"]] == ["plain"]
            read = await served.client.get(f"/v1/streams/{quote(name)}/events")
            assert read.status_code == 200, read.text
            too_long = "x" * (MAX_NAME_LENGTH + 1)
            wrong = await served.client.get("/v1/streams", params={"after": too_long})
            assert wrong.status_code == 400, wrong.text

    asyncio.run(run())


def test_the_documented_name_pattern_refuses_what_the_check_refuses() -> None:
    # The OpenAPI document's stream-name pattern and the server's one check agree on every
    # character of the Basic Multilingual Plane (a pattern without the u flag ends there).
    document = openapi_schema(max_body_bytes=1, authenticated=False, namespaced=False)
    params = document["paths"]["/v1/streams/{stream}/events"]["get"]["parameters"]
    stream = next(p for p in params if p["name"] == "stream")
    # The document's \\uXXXX escapes, read as Python's regex reads them.
    pattern = re.compile(stream["schema"]["pattern"])
    for code in range(0x10000):
        char = chr(code)
        try:
            check_name_characters("stream name", f"a{char}b")
        except cf.InvalidInputError:
            refused = True
        else:
            refused = False
        assert (pattern.match(f"a{char}b") is None) == refused, f"U+{code:04X}"
