"""The one store URL parser the journal and the transcript store share."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.errors import InvalidInputError
from contextfold.store._postgres_pool import DEFAULT_POOL_TIMEOUT
from contextfold.store.postgres import PostgresStore
from contextfold.store.urls import StoreURL, open_store, parse_store_url, sqlite_path_hint
from contextfold.transcript.store.factory import open_transcript_store
from contextfold.transcript.store.postgres import PostgresTranscriptStore


def test_each_scheme_and_its_target() -> None:
    assert parse_store_url("memory://") == StoreURL("memory", "")
    assert parse_store_url("memory:") == StoreURL("memory", "")
    assert parse_store_url("sqlite:///rel/j.db") == StoreURL("sqlite", "rel/j.db")
    assert parse_store_url("sqlite:////abs/j.db") == StoreURL("sqlite", "/abs/j.db")
    assert parse_store_url("sqlite:///:memory:") == StoreURL("sqlite", ":memory:")
    for prefix in ("postgresql", "postgres", "postgresql+psycopg"):
        parsed = parse_store_url(f"{prefix}://u:p@h:5432/db?sslmode=disable")
        assert parsed == StoreURL("postgresql", "postgresql://u:p@h:5432/db?sslmode=disable")


@pytest.mark.parametrize(
    ("url", "words"),
    [
        (None, "transcript URL must be a str, got NoneType"),
        ("sqlite:///", "names no file: use sqlite:///path/to/transcript.db"),
        ("sqlite://x.db", "unknown transcript URL 'sqlite://x.db'"),
        ("memory://x", "unknown transcript URL"),
        ("", "unknown transcript URL ''"),
    ],
)
def test_refusals_name_the_store_and_the_fix(url: object, words: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        parse_store_url(url, what="transcript")
    assert words in str(info.value)


@given(
    scheme=st.sampled_from(["mysql", "redis", "http", "sqlite", "postgresq"]),
    user=st.text("abcdef", min_size=1, max_size=6),
    password=st.text("XYZ123!", min_size=4, max_size=12),
)
def test_an_unknown_url_is_refused_without_its_password(
    scheme: str, user: str, password: str
) -> None:
    url = f"{scheme}://{user}:{password}@db.example:1/x"
    with pytest.raises(InvalidInputError, match="unknown journal URL") as info:
        parse_store_url(url)
    assert password not in str(info.value)
    assert "db.example" in str(info.value)


@given(st.text(max_size=30))
def test_any_string_parses_to_its_scheme_or_is_refused(url: str) -> None:
    try:
        parsed = parse_store_url(url)
    except InvalidInputError:
        return
    if parsed.scheme == "memory":
        assert url in ("memory://", "memory:")
    elif parsed.scheme == "sqlite":
        assert url == "sqlite:///" + parsed.target and parsed.target
    else:
        assert parsed.target.startswith("postgresql://")
        if parsed.pool_timeout is None:
            assert url.split("://", 1)[1] == parsed.target.split("://", 1)[1]


def test_a_postgresql_pool_timeout_is_taken_out_of_the_url_for_the_store() -> None:
    parsed = parse_store_url("postgresql://u:p@h/db?sslmode=disable&pool_timeout=2.5&x=a%20b")
    assert parsed == StoreURL("postgresql", "postgresql://u:p@h/db?sslmode=disable&x=a%20b", 2.5)
    alone = parse_store_url("postgres://h/db?pool_timeout=1")
    assert alone == StoreURL("postgresql", "postgresql://h/db", 1.0)
    assert parse_store_url("postgresql://h/db").pool_timeout is None
    store = open_store("postgresql://u:secret@h/db?pool_timeout=2.5", max_size=3)
    assert isinstance(store, PostgresStore)
    assert store.url == "postgresql://u:secret@h/db" and store._timeout == 2.5
    same = open_store("postgresql://h/db?pool_timeout=2.5", timeout=2.5)
    assert isinstance(same, PostgresStore) and same._timeout == 2.5
    default = open_store("postgresql://h/db")
    assert isinstance(default, PostgresStore) and default._timeout == DEFAULT_POOL_TIMEOUT == 5.0
    transcript = open_transcript_store("postgresql://h/db?pool_timeout=2.5")
    assert isinstance(transcript, PostgresTranscriptStore)
    assert transcript.dsn == "postgresql://h/db" and transcript._timeout == 2.5
    plain = open_transcript_store("postgresql://h/db")
    assert isinstance(plain, PostgresTranscriptStore) and plain._timeout == DEFAULT_POOL_TIMEOUT


@pytest.mark.parametrize(
    ("url", "options", "words"),
    [
        ("postgresql://h/db?pool_timeout=0", {}, "pool_timeout='0' in the journal URL must be"),
        ("postgresql://h/db?pool_timeout=-1", {}, "must be a positive number of seconds"),
        ("postgresql://h/db?pool_timeout=inf", {}, "pool_timeout='inf'"),
        ("postgresql://h/db?pool_timeout=soon", {}, "pool_timeout='soon'"),
        ("postgresql://h/db?pool_timeout=", {}, "pool_timeout=''"),
        ("postgresql://h/db?pool_timeout=1&pool_timeout=2", {}, "gives pool_timeout 2 times"),
        ("postgresql://h/db?pool_timeout=1", {"timeout": 2.0}, "give the pool timeout once"),
    ],
)
def test_a_bad_pool_timeout_is_refused_naming_it(
    url: str, options: dict[str, float], words: str
) -> None:
    with pytest.raises(InvalidInputError) as info:
        open_store(url, **options)
    assert words in str(info.value)


def test_an_sqlite_path_hint_gives_the_absolute_url_a_relative_one_may_have_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    relative = str(tmp_path / "data" / "x.db").lstrip("/")  # what sqlite:///tmp/…/x.db names
    hint = sqlite_path_hint(relative)
    assert f"relative to the working directory: {tmp_path / 'work' / relative}" in hint
    assert f"write sqlite:////{relative}" in hint
    assert "write" not in sqlite_path_hint("no-such-folder/x.db")  # no folder to point at
    assert sqlite_path_hint(str(tmp_path / "x.db")) == sqlite_path_hint(":memory:") == ""
