"""JournalSession: the behaviour cases of the OpenAI Agents SDK's own session tests (SQLite,
SQLAlchemy and async SQLite sessions), ported, on memory, SQLite and PostgreSQL journals."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from agents.items import TResponseInputItem
from agents.memory import Session, SessionSettings

import contextfold as cf
from contextfold.errors import InvalidInputError, PayloadError
from contextfold.events import RawEvent
from contextfold.integrations.openai_agents import ItemAdded, JournalSession, session_stream
from tests.integrations.helpers import BACKENDS, backend_url


@pytest.fixture(params=BACKENDS)
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[cf.Journal]:
    async with cf.open_journal(backend_url(request, tmp_path)) as opened:
        yield opened


def messages(*texts: str, role: str = "user") -> list[TResponseInputItem]:
    return [cast(TResponseInputItem, {"role": role, "content": text}) for text in texts]


def contents(items: list[TResponseInputItem]) -> list[Any]:
    return [item.get("content") for item in items]


async def corrupt(journal: cf.Journal, session: JournalSession) -> None:
    """A stored session item that no longer decodes (a payload missing its item)."""
    await journal.append(session.stream, RawEvent(ItemAdded.event_type, {"broken": True}))


# -- direct operations ------------------------------------------------------------------------


async def test_is_an_sdk_session(journal: cf.Journal) -> None:
    assert isinstance(JournalSession(journal, "s"), Session)


async def test_direct_add_get_and_clear(journal: cf.Journal) -> None:
    session = JournalSession(journal, "direct_test")
    items = [
        cast(TResponseInputItem, {"role": "user", "content": "Hello"}),
        cast(TResponseInputItem, {"role": "assistant", "content": "Hi there!"}),
    ]
    await session.add_items(items)
    assert await session.get_items() == items
    await session.clear_session()
    assert await session.get_items() == []


async def test_pop_item_returns_the_newest_until_empty(journal: cf.Journal) -> None:
    session = JournalSession(journal, "pop_test")
    assert await session.pop_item() is None
    await session.add_items(messages("Hello", "Hi there!", "How are you?"))
    assert len(await session.get_items()) == 3
    assert await session.pop_item() == {"role": "user", "content": "How are you?"}
    assert contents(await session.get_items()) == ["Hello", "Hi there!"]
    assert await session.pop_item() == {"role": "user", "content": "Hi there!"}
    assert await session.pop_item() == {"role": "user", "content": "Hello"}
    assert await session.pop_item() is None
    assert await session.get_items() == []


async def test_pop_affects_only_its_session(journal: cf.Journal) -> None:
    one, two = JournalSession(journal, "session_1"), JournalSession(journal, "session_2")
    await one.add_items(messages("Session 1 message"))
    await two.add_items(messages("Session 2 message 1", "Session 2 message 2"))
    assert await two.pop_item() == {"role": "user", "content": "Session 2 message 2"}
    assert contents(await one.get_items()) == ["Session 1 message"]
    assert contents(await two.get_items()) == ["Session 2 message 1"]


async def test_get_items_with_limit(journal: cf.Journal) -> None:
    session = JournalSession(journal, "count_test")
    texts = ["Message 1", "Response 1", "Message 2", "Response 2", "Message 3", "Response 3"]
    await session.add_items(messages(*texts))
    assert contents(await session.get_items()) == texts
    assert contents(await session.get_items(limit=2)) == texts[-2:]
    assert contents(await session.get_items(limit=4)) == texts[-4:]
    assert contents(await session.get_items(limit=10)) == texts
    assert await session.get_items(limit=0) == []


async def test_limit_counts_items_that_decode(journal: cf.Journal) -> None:
    session = JournalSession(journal, "limit_corrupt")
    await session.add_items(messages("valid 0", "valid 1", "valid 2"))
    await corrupt(journal, session)
    assert contents(await session.get_items(limit=2)) == ["valid 1", "valid 2"]


async def test_settings_limit_counts_items_that_decode(journal: cf.Journal) -> None:
    settings = SessionSettings(limit=2)
    session = JournalSession(journal, "settings_corrupt", session_settings=settings)
    await session.add_items(messages("valid 0", "valid 1", "valid 2"))
    await corrupt(journal, session)
    assert contents(await session.get_items()) == ["valid 1", "valid 2"]


async def test_pop_skips_a_corrupt_newest_item(journal: cf.Journal) -> None:
    session = JournalSession(journal, "pop_corrupt")
    await session.add_items(messages("valid"))
    await corrupt(journal, session)
    assert await session.pop_item() == {"role": "user", "content": "valid"}
    assert await session.get_items() == []


async def test_pop_with_only_corrupt_items_returns_none(journal: cf.Journal) -> None:
    session = JournalSession(journal, "pop_only_corrupt")
    await corrupt(journal, session)
    assert await session.pop_item() is None
    assert await session.get_items() == []


async def test_unicode_content(journal: cf.Journal) -> None:
    session = JournalSession(journal, "unicode_test")
    await session.add_items(messages("こんにちは", "😊👍", "Привет"))
    assert contents(await session.get_items()) == ["こんにちは", "😊👍", "Привет"]


async def test_special_characters_and_sql_keywords(journal: cf.Journal) -> None:
    session = JournalSession(journal, "special_chars'; DROP TABLE events;--")
    texts = [
        "O'Reilly",
        "DROP TABLE sessions;",
        '"SELECT * FROM users WHERE name = "admin";"',
        "Robert'); DROP TABLE students;--",
        "Normal message",
    ]
    await session.add_items(messages(*texts))
    assert contents(await session.get_items()) == texts


async def test_concurrent_adds_keep_every_item(journal: cf.Journal) -> None:
    session = JournalSession(journal, "concurrent_test")
    other = JournalSession(journal, "concurrent_test")  # a second instance, same session
    await asyncio.gather(
        *((session if i % 2 else other).add_items(messages(f"Message {i}")) for i in range(10))
    )
    assert sorted(contents(await session.get_items())) == sorted(f"Message {i}" for i in range(10))


async def test_add_empty_list_stores_nothing(journal: cf.Journal) -> None:
    session = JournalSession(journal, "empty_add")
    await session.add_items([])
    assert await session.get_items() == []
    assert await journal.version(session.stream) == 0


async def test_sessions_are_isolated(journal: cf.Journal) -> None:
    one, two = JournalSession(journal, "session_1"), JournalSession(journal, "session_2")
    await one.add_items(messages("I like cats"))
    await two.add_items(messages("I like dogs"))
    assert contents(await one.get_items()) == ["I like cats"]
    assert contents(await two.get_items()) == ["I like dogs"]


async def test_limit_larger_than_history_returns_it_all(journal: cf.Journal) -> None:
    session = JournalSession(journal, "more_than_available")
    await session.add_items(messages("a", "b"))
    assert contents(await session.get_items(limit=10)) == ["a", "b"]


async def test_a_failed_add_stores_nothing_and_the_session_stays_usable(
    journal: cf.Journal,
) -> None:
    session = JournalSession(journal, "rollback_test")
    bad = cast(TResponseInputItem, {"role": "user", "content": object()})
    good = messages("first")[0]
    with pytest.raises(PayloadError, match=r"items\[1\]\.content"):
        await session.add_items([good, bad])
    assert await journal.version(session.stream) == 0
    await session.add_items(messages("after failure"))
    assert contents(await session.get_items()) == ["after failure"]


# -- session settings -------------------------------------------------------------------------


async def test_session_settings_default_to_no_limit(journal: cf.Journal) -> None:
    session = JournalSession(journal, "default_settings")
    assert isinstance(session.session_settings, SessionSettings)
    assert session.session_settings.limit is None


async def test_session_settings_from_the_constructor(journal: cf.Journal) -> None:
    given = JournalSession(journal, "given", session_settings=SessionSettings(limit=5))
    assert given.session_settings is not None and given.session_settings.limit == 5
    from_dict = JournalSession(journal, "dict", session_settings={"limit": 0})
    assert isinstance(from_dict.session_settings, SessionSettings)
    assert from_dict.session_settings.limit == 0
    assert from_dict.session_settings.resolve({"limit": 4}).limit == 4


async def test_session_settings_refuse_unknown_fields(journal: cf.Journal) -> None:
    with pytest.raises(TypeError, match="limitt"):
        JournalSession(journal, "invalid", session_settings={"limitt": 1})


async def test_get_items_uses_the_settings_limit(journal: cf.Journal) -> None:
    session = JournalSession(journal, "uses_limit", session_settings=SessionSettings(limit=3))
    await session.add_items(messages(*(f"Message {i}" for i in range(5))))
    assert contents(await session.get_items()) == ["Message 2", "Message 3", "Message 4"]


async def test_an_explicit_limit_overrides_the_settings(journal: cf.Journal) -> None:
    session = JournalSession(journal, "override", session_settings=SessionSettings(limit=5))
    await session.add_items(messages(*(f"Message {i}" for i in range(10))))
    assert contents(await session.get_items(limit=2)) == ["Message 8", "Message 9"]


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1.5, True, "2"])
async def test_a_bad_limit_is_refused(journal: cf.Journal, limit: Any) -> None:
    session = JournalSession(journal, "bad_limit")
    with pytest.raises(InvalidInputError, match="limit must be an int or None"):
        await session.get_items(limit=limit)


async def test_a_negative_limit_reads_every_item_as_sqlite_session_does(
    journal: cf.Journal,
) -> None:
    session = JournalSession(journal, "negative", session_settings=SessionSettings(limit=-1))
    items = messages("a", "b", "c")
    await session.add_items(items)
    assert await session.get_items() == items
    assert await session.get_items(limit=-1) == items
    assert await session.get_items(limit=0) == []


@pytest.mark.parametrize("budget", [0, -5, float("nan"), "10"])
async def test_a_bad_budget_is_refused(journal: cf.Journal, budget: Any) -> None:
    with pytest.raises(InvalidInputError, match="budget"):
        JournalSession(journal, "bad_budget", budget=budget)
    session = JournalSession(journal, "bad_budget")
    with pytest.raises(InvalidInputError, match="budget"):
        await session.get_items(budget=budget)


async def test_items_must_be_a_list_of_dicts(journal: cf.Journal) -> None:
    session = JournalSession(journal, "bad_items")
    with pytest.raises(InvalidInputError, match="list of items"):
        await session.add_items("hello")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"items\[0\] is a str"):
        await session.add_items(["hello"])  # type: ignore[list-item]
    assert await journal.version(session.stream) == 0


async def test_bad_session_ids_and_journals_are_refused(journal: cf.Journal) -> None:
    with pytest.raises(InvalidInputError, match="session_id"):
        JournalSession(journal, 42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="session_id"):
        JournalSession(journal, "bad\ud800")
    with pytest.raises(InvalidInputError, match="session_id"):
        JournalSession(journal, "", stream="chosen")
    assert JournalSession(journal, "s", stream="chosen").stream == "chosen"
    with pytest.raises(InvalidInputError, match=r"cf\.Journal"):
        JournalSession("sqlite:///x.db", "s")  # type: ignore[arg-type]


def test_session_ids_are_escaped_one_to_one() -> None:
    assert session_stream("a/b c%") == "openai-agents/session/a%2Fb%20c%25"
    assert session_stream("a/b") != session_stream("a%2Fb")
