"""ADK's session-service contract, case by case, held by JournalSessionService on every backend.

The cases are those ADK's own suite holds its services to (the in-memory, database and SQLite
ones); each test names the behaviour it pins.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.session import Session
from google.adk.tools.tool_confirmation import ToolConfirmation
from google.genai import types

from contextfold.integrations.adk import JournalSessionService, session_stream
from contextfold.journal import Journal, open_journal
from tests.integrations.helpers import BACKENDS, backend_url

APP = "my_app"


@pytest.fixture(params=BACKENDS)
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Journal]:
    async with open_journal(backend_url(request, tmp_path)) as opened:
        yield opened


@pytest.fixture
def service(journal: Journal) -> JournalSessionService:
    return JournalSessionService(journal)


def delta(values: dict[str, Any], **fields: Any) -> Event:
    """A user event writing ``values`` (invocation ``inv`` unless given)."""
    fields.setdefault("invocation_id", "inv")
    return Event(author="user", actions=EventActions(state_delta=values), **fields)


async def reload(service: JournalSessionService, session: Session) -> Session:
    got = await service.get_session(
        app_name=session.app_name, user_id=session.user_id, session_id=session.id
    )
    assert got is not None
    return got


# -- create, get, list, delete ------------------------------------------------------------------


async def test_a_session_never_created_is_none(service: JournalSessionService) -> None:
    assert await service.get_session(app_name=APP, user_id="u", session_id="123") is None


async def test_create_then_get_returns_the_same_session_and_delete_removes_it(
    service: JournalSessionService,
) -> None:
    created = await service.create_session(app_name=APP, user_id="u", state={"key": "value"})
    assert (created.app_name, created.user_id, created.state) == (APP, "u", {"key": "value"})
    assert created.id and created.last_update_time <= time.time()
    assert await reload(service, created) == created
    await service.delete_session(app_name=APP, user_id="u", session_id=created.id)
    assert await service.get_session(app_name=APP, user_id="u", session_id=created.id) is None


async def test_list_sessions_returns_every_session_of_the_user_with_its_state(
    service: JournalSessionService,
) -> None:
    ids = [f"session{i}" for i in range(5)]
    for sid in ids:
        await service.create_session(
            app_name=APP, user_id="u", session_id=sid, state={"key": f"value{sid}"}
        )
    listed = (await service.list_sessions(app_name=APP, user_id="u")).sessions
    assert sorted(s.id for s in listed) == ids
    assert all(s.state == {"key": f"value{s.id}"} for s in listed)


async def test_list_sessions_orders_least_recently_updated_first(
    service: JournalSessionService,
) -> None:
    created = [
        await service.create_session(app_name=APP, user_id="u", session_id=sid)
        for sid in ("a", "b", "c")
    ]
    later = max(s.last_update_time for s in created) + 10
    await service.append_event(created[0], Event(invocation_id="i", author="user", timestamp=later))
    listed = (await service.list_sessions(app_name=APP, user_id="u")).sessions
    assert [s.id for s in listed] == ["b", "c", "a"]


async def test_list_sessions_without_a_user_lists_every_user(
    service: JournalSessionService,
) -> None:
    for user, sid in (("user1", "session1a"), ("user1", "session1b"), ("user2", "session2a")):
        await service.create_session(app_name=APP, user_id=user, session_id=sid, state={"key": sid})
    one = (await service.list_sessions(app_name=APP, user_id="user1")).sessions
    two = (await service.list_sessions(app_name=APP, user_id="user2")).sessions
    every = (await service.list_sessions(app_name=APP, user_id=None)).sessions
    assert {s.id: s.state for s in one} == {
        "session1a": {"key": "session1a"},
        "session1b": {"key": "session1b"},
    }
    assert [(s.id, s.user_id) for s in two] == [("session2a", "user2")]
    assert {s.id: s.state["key"] for s in every} == {
        "session1a": "session1a",
        "session1b": "session1b",
        "session2a": "session2a",
    }


async def test_listed_sessions_have_merged_state_and_no_events(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(
        app_name=APP,
        user_id="u1",
        session_id="s1",
        state={"app:a": "av", "user:u": "uv", "sk": "sv", "temp:t": "tv"},
    )
    await service.append_event(session, delta({"sk2": "sv2"}))
    (listed,) = (await service.list_sessions(app_name=APP, user_id="u1")).sessions
    assert listed.id == "s1" and listed.events == []
    assert listed.state == {"app:a": "av", "user:u": "uv", "sk": "sv", "sk2": "sv2"}


async def test_listing_an_unknown_app_or_user_is_empty(service: JournalSessionService) -> None:
    await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    assert (await service.list_sessions(app_name="unknown_app")).sessions == []
    assert (await service.list_sessions(app_name=APP, user_id="unknown")).sessions == []
    assert [s.id for s in (await service.list_sessions(app_name=APP)).sessions] == ["s1"]


async def test_creating_an_existing_id_raises_already_exists(
    service: JournalSessionService,
) -> None:
    await service.create_session(app_name=APP, user_id="u", session_id="existing")
    with pytest.raises(AlreadyExistsError):
        await service.create_session(app_name=APP, user_id="u", session_id="existing")


async def test_a_padded_duplicate_id_is_the_same_session(service: JournalSessionService) -> None:
    await service.create_session(
        app_name=APP, user_id="u", session_id="existing", state={"keep": "original"}
    )
    with pytest.raises(AlreadyExistsError):
        await service.create_session(
            app_name=APP, user_id="u", session_id="  existing  ", state={"keep": "clobbered"}
        )
    got = await service.get_session(app_name=APP, user_id="u", session_id="existing")
    assert got is not None and got.state["keep"] == "original"


async def test_a_padded_id_reads_and_deletes_the_stripped_session(
    service: JournalSessionService,
) -> None:
    padded = "order-42\n"
    created = await service.create_session(
        app_name=APP, user_id="u", session_id=padded, state={"cart": "book"}
    )
    assert created.id == "order-42"
    got = await service.get_session(app_name=APP, user_id="u", session_id=padded)
    assert got is not None and got.id == "order-42" and got.state["cart"] == "book"
    await service.delete_session(app_name=APP, user_id="u", session_id=padded)
    assert await service.get_session(app_name=APP, user_id="u", session_id="order-42") is None


async def test_a_blank_id_gets_a_generated_one(service: JournalSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="   ")
    assert session.id.strip() == session.id and session.id


async def test_get_session_is_scoped_to_the_user(service: JournalSessionService) -> None:
    first = await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    await service.append_event(first, Event(invocation_id="inv1", author="user"))
    await service.create_session(app_name=APP, user_id="u2", session_id="s1")
    got = await service.get_session(app_name=APP, user_id="u2", session_id="s1")
    assert got is not None and got.user_id == "u2" and got.events == []


async def test_delete_removes_only_that_users_session(service: JournalSessionService) -> None:
    await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    await service.create_session(app_name=APP, user_id="u2", session_id="s1")
    await service.delete_session(app_name=APP, user_id="u1", session_id="s1")
    assert await service.get_session(app_name=APP, user_id="u1", session_id="s1") is None
    other = await service.get_session(app_name=APP, user_id="u2", session_id="s1")
    assert other is not None and other.id == "s1"


async def test_deleting_an_unknown_session_is_a_noop(service: JournalSessionService) -> None:
    await service.create_session(app_name=APP, user_id="u1", session_id="s1")
    for app, user, sid in ((APP, "u1", "unknown"), (APP, "unknown", "s1"), ("unknown", "u1", "s1")):
        await service.delete_session(app_name=app, user_id=user, session_id=sid)
    assert await service.get_session(app_name=APP, user_id="u1", session_id="s1") is not None


async def test_concurrent_creations_all_succeed(service: JournalSessionService) -> None:
    made = await asyncio.gather(
        *(
            service.create_session(app_name=f"app_{i}", user_id="u", session_id=f"s_{i}")
            for i in range(5)
        )
    )
    assert [s.id for s in made] == [f"s_{i}" for i in range(5)]
    for i in range(5):
        assert await service.get_session(app_name=f"app_{i}", user_id="u", session_id=f"s_{i}")


# -- state scopes -------------------------------------------------------------------------------


async def test_app_state_is_shared_by_every_user_of_the_app(
    service: JournalSessionService,
) -> None:
    first = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"app:k1": "v1"}
    )
    await service.append_event(first, delta({"app:k2": "v2"}))
    second = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
    assert second.state == {"app:k1": "v1", "app:k2": "v2"}
    again = await reload(service, first)
    assert (again.state["app:k1"], again.state["app:k2"]) == ("v1", "v2")


async def test_user_state_is_shared_only_by_the_users_sessions(
    service: JournalSessionService,
) -> None:
    first = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"user:k1": "v1"}
    )
    await service.append_event(first, delta({"user:k2": "v2"}))
    mine = await service.create_session(app_name=APP, user_id="u1", session_id="s1b")
    theirs = await service.create_session(app_name=APP, user_id="u2", session_id="s2")
    assert mine.state == {"user:k1": "v1", "user:k2": "v2"}
    assert theirs.state == {}


async def test_shared_state_of_long_names_is_stored_once(service: JournalSessionService) -> None:
    """The key of a shared-state change names the session and its record, longer than an
    idempotency key may be for long names: it is stored by digest, still once."""
    user, session_id = "u" * 150, "s" * 150
    first = await service.create_session(
        app_name=APP, user_id=user, session_id=session_id, state={"user:k1": "v1"}
    )
    await service.append_event(first, delta({"user:k2": "v2", "app:a": 1}))
    fresh = JournalSessionService(service.journal)  # applies the shared changes again
    again = await reload(fresh, first)
    assert (again.state["user:k1"], again.state["user:k2"], again.state["app:a"]) == ("v1", "v2", 1)
    mine = await service.create_session(app_name=APP, user_id=user, session_id="other")
    assert mine.state == {"user:k1": "v1", "user:k2": "v2", "app:a": 1}


async def test_session_state_is_not_shared(service: JournalSessionService) -> None:
    first = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"sk1": "v1"}
    )
    await service.append_event(first, delta({"sk2": "v2"}))
    again = await reload(service, first)
    assert (again.state["sk1"], again.state["sk2"]) == ("v1", "v2")
    other = await service.create_session(app_name=APP, user_id="u1", session_id="s1b")
    assert other.state == {}


@pytest.mark.parametrize("prefix", ["", "app:", "user:"])
async def test_a_dict_delta_replaces_the_stored_value(
    service: JournalSessionService, prefix: str
) -> None:
    key = f"{prefix}profile"
    session = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={key: {"name": "ada", "role": "admin"}}
    )
    await service.append_event(session, delta({key: {"name": "bob"}}))
    assert (await reload(service, session)).state[key] == {"name": "bob"}
    assert session.state[key] == {"name": "bob"}


@pytest.mark.parametrize("prefix", ["", "app:", "user:"])
async def test_a_none_delta_is_stored_not_dropped(
    service: JournalSessionService, prefix: str
) -> None:
    key = f"{prefix}flag"
    session = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={key: True}
    )
    await service.append_event(session, delta({key: None}))
    again = await reload(service, session)
    assert key in again.state and again.state[key] is None
    assert key in session.state and session.state[key] is None


async def test_a_boolean_survives_an_unrelated_delta(service: JournalSessionService) -> None:
    session = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"flag": False}
    )
    await service.append_event(session, delta({"new_flag": True}))
    again = await reload(service, session)
    assert again.state["new_flag"] is True and again.state["flag"] is False
    assert session.state["new_flag"] is True and session.state["flag"] is False


async def test_temp_state_lives_in_the_session_object_only(
    service: JournalSessionService, journal: Journal
) -> None:
    session = await service.create_session(
        app_name=APP, user_id="u1", session_id="s1", state={"temp:init": 1}
    )
    event = delta({"temp:k1": "v1", "sk": "v2"})
    await service.append_event(session, event)
    assert session.state["temp:k1"] == "v1" and session.state["sk"] == "v2"
    assert "temp:k1" not in event.actions.state_delta and event.actions.state_delta["sk"] == "v2"
    again = await reload(service, session)
    assert not any(key.startswith("temp:") for key in again.state)
    assert "temp:k1" not in again.events[0].actions.state_delta
    stored = (await journal.read(session_stream(APP, "u1", "s1"))).events
    assert all(b"temp:" not in event.data for event in stored)


async def test_temp_state_is_readable_by_the_next_event_of_the_invocation(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u1", session_id="s_seq")
    first = Event(
        invocation_id="inv1",
        author="agent1",
        actions=EventActions(state_delta={"temp:output": "result_from_a1"}),
    )
    await service.append_event(session, first)
    assert session.state["temp:output"] == "result_from_a1"
    assert "temp:output" not in first.actions.state_delta


async def test_a_state_value_that_is_not_json_is_stored_as_text(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(session, delta({"callback": lambda: 1, "ok": 2}))
    again = await reload(service, session)
    assert len(again.events) == 1
    assert again.state["ok"] == 2 and isinstance(again.state["callback"], str)


# -- get_user_state -----------------------------------------------------------------------------


async def test_user_state_of_a_user_without_any_is_empty(service: JournalSessionService) -> None:
    assert await service.get_user_state(app_name=APP, user_id="u1") == {}


async def test_user_state_holds_what_events_wrote_without_its_prefix(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u1")
    await service.append_event(
        session, delta({"user:profile": {"name": "Alice"}, "session_key": 1})
    )
    assert await service.get_user_state(app_name=APP, user_id="u1") == {
        "profile": {"name": "Alice"}
    }


async def test_user_state_is_not_visible_to_other_users_or_apps(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u1")
    await service.append_event(session, delta({"user:secret": "only-for-u1"}))
    assert await service.get_user_state(app_name=APP, user_id="u2") == {}
    assert await service.get_user_state(app_name="other_app", user_id="u1") == {}


async def test_user_state_is_readable_before_a_new_session_is_created(
    service: JournalSessionService,
) -> None:
    first = await service.create_session(app_name=APP, user_id="u1")
    await service.append_event(first, delta({"user:ctx": {"v": 1}}))
    assert await service.get_user_state(app_name=APP, user_id="u1") == {"ctx": {"v": 1}}


async def test_user_state_reflects_the_latest_write(service: JournalSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u1")
    await service.append_event(session, delta({"user:counter": 1}))
    await service.append_event(session, delta({"user:counter": 2}))
    assert (await service.get_user_state(app_name=APP, user_id="u1"))["counter"] == 2


# -- events -------------------------------------------------------------------------------------


async def test_bytes_in_content_and_metadata_round_trip(service: JournalSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    content = types.Content(
        role="user", parts=[types.Part.from_bytes(data=b"test_image_data", mime_type="image/png")]
    )
    grounding = types.GroundingMetadata(
        search_entry_point=types.SearchEntryPoint(sdk_blob=b"test_sdk_blob")
    )
    await service.append_event(
        session,
        Event(invocation_id="i", author="user", content=content, grounding_metadata=grounding),
    )
    assert session.events[0].content == content
    (event,) = (await reload(service, session)).events
    assert event.content == content and event.grounding_metadata == grounding


async def test_an_event_with_every_field_round_trips(service: JournalSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    event = Event(
        invocation_id="invocation",
        author="user",
        content=types.Content(role="user", parts=[types.Part(text="test_text")]),
        turn_complete=True,
        partial=False,
        actions=EventActions(artifact_delta={"file": 0}, transfer_to_agent="agent", escalate=True),
        long_running_tool_ids={"tool1"},
        error_code="error_code",
        error_message="error_message",
        interrupted=True,
        grounding_metadata=types.GroundingMetadata(web_search_queries=["query1"]),
        usage_metadata=types.GenerateContentResponseUsageMetadata(
            prompt_token_count=1, candidates_token_count=1, total_token_count=2
        ),
        citation_metadata=types.CitationMetadata(),
        custom_metadata={"custom_key": "custom_value"},
        timestamp=1700000000.123,
        input_transcription=types.Transcription(text="input transcription", finished=True),
        output_transcription=types.Transcription(text="output transcription", finished=True),
    )
    await service.append_event(session, event)
    assert await reload(service, session) == session


async def test_requested_tool_confirmations_round_trip(service: JournalSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    confirmation = ToolConfirmation(
        hint="dynamic hint",
        confirmed=False,
        payload={"collection_name": "photos", "resource_id": "album_1"},
    )
    actions = EventActions(requested_tool_confirmations={"tool_call_1": confirmation})
    await service.append_event(session, Event(invocation_id="i", author="user", actions=actions))
    (event,) = (await reload(service, session)).events
    got = event.actions.requested_tool_confirmations["tool_call_1"]
    assert (got.hint, got.payload, got.confirmed) == (
        "dynamic hint",
        {"collection_name": "photos", "resource_id": "album_1"},
        False,
    )


async def test_last_update_time_follows_the_event_timestamp(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    created_at = session.last_update_time
    stamp = created_at + 10
    await service.append_event(session, Event(invocation_id="i", author="user", timestamp=stamp))
    assert session.last_update_time == stamp
    again = await reload(service, session)
    assert again.last_update_time == stamp > created_at


async def test_timestamps_round_trip_exactly(service: JournalSessionService) -> None:
    # Two instants of the hour US Eastern repeats in autumn: no local-time conversion on the way.
    epochs = [1730613600.0, 1730615400.0, 1730615400.123456789]
    session = await service.create_session(app_name=APP, user_id="u")
    for epoch in epochs:
        await service.append_event(session, Event(author="user", timestamp=epoch))
    assert [e.timestamp for e in (await reload(service, session)).events] == epochs


async def test_events_with_tied_timestamps_come_back_in_append_order(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    for event_id in ("event_z", "event_a", "event_m"):
        await service.append_event(session, Event(author="user", id=event_id, timestamp=100.0))
    got = await reload(service, session)
    assert [e.id for e in got.events] == ["event_z", "event_a", "event_m"]


async def test_partial_events_are_not_stored(service: JournalSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(session, Event(author="user", partial=True))
    assert session.events == []
    assert (await reload(service, session)).events == []


async def test_an_equal_redelivery_is_stored_once(service: JournalSessionService) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="dup")
    event = delta({"session:counter": 1})
    await service.append_event(session, event)
    await service.append_event(session, event)
    await service.append_event(session, event.model_copy(deep=True))
    again = await reload(service, session)
    assert [e.id for e in again.events] == [event.id]
    assert again.state["session:counter"] == 1 and len(session.events) == 1


async def test_distinct_events_sharing_an_id_are_both_stored(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="multi")
    await service.append_event(session, Event(id="shared", invocation_id="a", author="user"))
    await service.append_event(session, Event(id="shared", invocation_id="b", author="agent"))
    assert [e.author for e in (await reload(service, session)).events] == ["user", "agent"]


async def test_get_session_config_selects_events(service: JournalSessionService) -> None:
    base = int(time.time())
    session = await service.create_session(app_name=APP, user_id="u")
    for i in range(1, 6):
        await service.append_event(session, Event(author="user", timestamp=base + i))

    async def stamps(**config: Any) -> list[float]:
        got = await service.get_session(
            app_name=APP, user_id="u", session_id=session.id, config=GetSessionConfig(**config)
        )
        assert got is not None
        return [e.timestamp - base for e in got.events]

    assert await stamps() == [1, 2, 3, 4, 5]
    assert await stamps(num_recent_events=0) == []
    assert await stamps(num_recent_events=3) == [3, 4, 5]
    assert await stamps(num_recent_events=9) == [1, 2, 3, 4, 5]
    assert await stamps(after_timestamp=base + 4) == [4, 5]
    assert await stamps(after_timestamp=base + 50) == []
    assert await stamps(after_timestamp=base + 4, num_recent_events=3) == [4, 5]


# -- writers that lost a race ---------------------------------------------------------------------


async def test_appending_to_a_deleted_session_raises_not_found(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    await service.delete_session(app_name=APP, user_id="u", session_id=session.id)
    with pytest.raises(SessionNotFoundError):
        await service.append_event(session, Event(invocation_id="inv1", author="user"))


async def test_appending_from_a_stale_session_raises_and_writes_nothing(
    service: JournalSessionService,
) -> None:
    now = time.time()
    original = await service.create_session(app_name=APP, user_id="u")
    await service.append_event(
        original, delta({"sk1": "v1"}, invocation_id="inv1", timestamp=now + 1)
    )
    updated = await reload(service, original)
    await service.append_event(
        updated, delta({"sk2": "v2"}, invocation_id="inv2", timestamp=now + 2)
    )
    assert original.last_update_time < updated.last_update_time
    with pytest.raises(StaleSessionError, match="modified in storage"):
        await service.append_event(
            original, delta({"sk3": "v3"}, invocation_id="inv3", timestamp=now + 3)
        )
    final = await reload(service, original)
    assert [e.invocation_id for e in final.events] == ["inv1", "inv2"]
    assert (final.state["sk1"], final.state["sk2"], final.state.get("sk3")) == ("v1", "v2", None)


async def test_a_stale_copy_raises_a_stale_session_error_that_is_a_value_error(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    stale = session.model_copy(deep=True)
    stamp = session.last_update_time + 1
    await service.append_event(
        session, Event(invocation_id="winner", author="user", timestamp=stamp)
    )
    with pytest.raises(StaleSessionError) as raised:
        await service.append_event(
            stale, Event(invocation_id="stale", author="user", timestamp=stamp)
        )
    assert isinstance(raised.value, ValueError)


async def test_concurrent_appends_from_copies_let_exactly_one_win(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u")
    rounds = 8
    for i in range(rounds):
        latest = await reload(service, session)
        copies = (latest.model_copy(deep=True), latest.model_copy(deep=True))
        stamp = latest.last_update_time + 10
        results = await asyncio.gather(
            *(
                service.append_event(
                    copy,
                    delta(
                        {f"sk{i}-{n}": f"v{i}-{n}"},
                        invocation_id=f"inv{i}-{n}",
                        timestamp=stamp + n,
                    ),
                )
                for n, copy in enumerate(copies)
            ),
            return_exceptions=True,
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        assert len(errors) == 1 and isinstance(errors[0], StaleSessionError)
        assert "modified in storage" in str(errors[0])
    final = await reload(service, session)
    assert len(final.events) == rounds
    for i in range(rounds):
        values = {final.state.get(f"sk{i}-0"), final.state.get(f"sk{i}-1")}
        assert None in values and values - {None}


async def test_a_drifted_last_update_time_is_not_stale_with_the_marker(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="s1")
    first = Event(invocation_id="inv1", author="user", timestamp=session.last_update_time + 10)
    await service.append_event(session, first)
    session.last_update_time -= 0.0001  # a float round trip elsewhere, the stored head unchanged
    await service.append_event(
        session, Event(invocation_id="inv2", author="user", timestamp=first.timestamp + 10)
    )
    assert [e.invocation_id for e in (await reload(service, session)).events] == ["inv1", "inv2"]


async def test_a_session_without_marker_is_checked_by_its_last_event(
    service: JournalSessionService,
) -> None:
    session = await service.create_session(app_name=APP, user_id="u", session_id="s1")
    first = Event(invocation_id="inv1", author="user", timestamp=session.last_update_time + 10)
    await service.append_event(session, first)
    stale = session.model_copy(deep=True)
    stale.events = []  # it never saw inv1
    for held in (session, stale):
        held._storage_update_marker = None
        held.last_update_time -= 0.0001
    await service.append_event(
        session, Event(invocation_id="inv2", author="user", timestamp=first.timestamp + 10)
    )
    with pytest.raises(StaleSessionError):
        await service.append_event(stale, Event(invocation_id="inv3", author="user"))
    assert [e.invocation_id for e in (await reload(service, session)).events] == ["inv1", "inv2"]
