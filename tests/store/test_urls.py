"""The one store URL parser the journal and the transcript store share."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.errors import InvalidInputError
from contextfold.store.urls import StoreURL, parse_store_url


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
        assert url.split("://", 1)[1] == parsed.target.split("://", 1)[1]
