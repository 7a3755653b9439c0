"""What JournalSessionService does to the journal: stream names, stored JSON, incremental
reads, deletion, shared state that survives a failed append, bad input, the import guard."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from google.adk.errors import StaleSessionError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.platform import time as platform_time
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.adk.sessions.session import Session
from google.genai import types
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.errors import (
    InvalidInputError,
    InvalidStreamNameError,
    PayloadError,
    StoreUnavailableError,
)
from contextfold.integrations.adk import (
    ADK_EVENT,
    JournalSessionService,
    app_stream,
    session_stream,
    sessions_prefix,
    user_stream,
)
from contextfold.journal import Journal, open_journal
from contextfold.journal.encode import check_stream
from contextfold.store.memory import MemoryStore
from contextfold.store.urls import open_store
from contextfold.testing import RecordingStore, StoreCall
from tests.integrations.helpers import BACKENDS, backend_url

APP = "app"


@pytest.fixture(params=BACKENDS)
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Journal]:
    async with open_journal(backend_url(request, tmp_path)) as opened:
        yield opened


@pytest.fixture(params=BACKENDS)
async def probe(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[RecordingStore]:
    store = RecordingStore(open_store(backend_url(request, tmp_path)))
    try:
        yield store
    finally:
        await store.close()


def _appends(call: StoreCall) -> bool:
    return call.method == "append"


def said(text: str, **fields: Any) -> Event:
    content = types.Content(role="user", parts=[types.Part(text=text)])
    return Event(invocation_id="inv", author="user", content=content, **fields)


def texts(events: list[Event]) -> list[str]:
    return [part.text or "" for e in events if e.content for part in e.content.parts or ()]


async def types_in(journal: Journal, stream: str) -> list[str]:
    return [event.type async for event in journal.read_all(stream)]


# -- stream names -------------------------------------------------------------------------------

names = st.text(max_size=12)


@given(names, names, names)
def test_stream_names_are_valid_and_name_one_session_each(app: str, user: str, sid: str) -> None:
    stream = session_stream(app, user, sid)
    assert check_stream(stream) == stream
    kind, *parts = stream.removeprefix("adk/").split("/")
    assert kind == "session" and [unquote(part) for part in parts] == [app, user, sid]
    assert stream.startswith(sessions_prefix(app, user)) and stream.startswith(sessions_prefix(app))
    assert app_stream(app) != user_stream(app, user) != stream


@given(names, names, names, names)
def test_a_users_prefix_holds_no_other_users_session(
    app: str, user: str, other: str, sid: str
) -> None:
    stream = session_stream(app, other, sid)
    assert stream.startswith(sessions_prefix(app, user)) == (user == other)


def test_names_too_long_for_a_stream_are_refused_naming_the_fields() -> None:
    with pytest.raises(InvalidStreamNameError, match="app_name, user_id, session_id"):
        session_stream("a" * 200, "u" * 200, "s" * 200)


# -- stored JSON --------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
deltas = st.dictionaries(
    st.sampled_from(["a", "b", "app:a", "user:b", "temp:c"]), json_values, max_size=4
)
events = st.builds(
    lambda text, state, stamp, partial: said(
        text, actions=EventActions(state_delta=state), timestamp=stamp, partial=partial or None
    ),
    st.text(max_size=20),
    deltas,
    st.floats(min_value=0, max_value=4e9, allow_nan=False),
    st.booleans(),
)
configs = st.builds(
    GetSessionConfig,
    num_recent_events=st.none() | st.integers(0, 8),
    after_timestamp=st.none() | st.floats(min_value=0, max_value=4e9, allow_nan=False),
)


def _fields(session: Session | None) -> Any:
    assert session is not None
    return (session.id, session.state, session.events, session.last_update_time)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, max_size=8), st.lists(configs, min_size=1, max_size=3))
def test_sessions_read_back_as_adk_in_memory_service_keeps_them(
    appended: list[Event], reads: list[GetSessionConfig]
) -> None:
    async def run() -> None:
        platform_time.set_time_provider(lambda: 1_700_000_000.5)
        reference = InMemorySessionService()
        async with open_journal("memory://") as journal:
            ours = JournalSessionService(journal)
            theirs_session = await reference.create_session(
                app_name=APP, user_id="u", session_id="s", state={"x": 1, "app:y": 2}
            )
            our_session = await ours.create_session(
                app_name=APP, user_id="u", session_id="s", state={"x": 1, "app:y": 2}
            )
            for event in appended:
                await reference.append_event(theirs_session, event.model_copy(deep=True))
                await ours.append_event(our_session, event.model_copy(deep=True))
            cold = JournalSessionService(Journal(journal.store))  # a new fold cache: a rebuild
            for config in reads:
                expected = await reference.get_session(
                    app_name=APP, user_id="u", session_id="s", config=config
                )
                for service in (ours, cold):
                    got = await service.get_session(
                        app_name=APP, user_id="u", session_id="s", config=config
                    )
                    assert _fields(got) == _fields(expected)

    try:
        asyncio.run(run())
    finally:
        platform_time.reset_time_provider()


@settings(max_examples=25, deadline=None)
@given(st.lists(events, min_size=1, max_size=4))
def test_the_stored_payload_is_adk_json_that_validates_to_the_event(appended: list[Event]) -> None:
    async def run() -> None:
        async with open_journal("memory://") as journal:
            service = JournalSessionService(journal)
            session = await service.create_session(app_name=APP, user_id="u", session_id="s")
            kept = [await service.append_event(session, e) for e in appended if not e.partial]
            stored = [
                event.payload
                async for event in journal.read_all(
                    session_stream(APP, "u", "s"), types=[ADK_EVENT]
                )
            ]
            assert [Event.model_validate(payload) for payload in stored] == kept
            assert stored == [e.model_dump(mode="json", exclude_none=True) for e in kept]

    asyncio.run(run())


# -- incremental reads --------------------------------------------------------------------------


async def test_a_warm_get_session_reads_only_the_events_it_returns() -> None:
    probe = RecordingStore(MemoryStore())
    service = JournalSessionService(Journal(probe))
    session = await service.create_session(app_name=APP, user_id="u", session_id="long")
    stream = session_stream(APP, "u", "long")
    for i in range(2000):
        await service.append_event(session, said(f"turn {i}", timestamp=1000.0 + i))
    ids = [e.id for e in session.events]

    config = GetSessionConfig(num_recent_events=5)
    probe.clear()
    recent = await service.get_session(app_name=APP, user_id="u", session_id="long", config=config)
    assert recent is not None and [e.id for e in recent.events] == ids[-5:]
    # Each append folded its event into the fold's cached state: only the 5 are loaded.
    assert probe.events_read(stream) == 5

    probe.clear()
    again = await service.get_session(app_name=APP, user_id="u", session_id="long", config=config)
    assert again is not None and again.events == recent.events
    assert probe.events_read(stream) == 5
    fold_reads = [r for r in probe.reads if r.stream == stream and r.args["limit"] != 5]
    assert fold_reads == []  # the fold checks the stream's head only

    probe.clear()
    whole = await service.get_session(app_name=APP, user_id="u", session_id="long")
    assert whole is not None and [e.id for e in whole.events] == ids
    assert probe.events_read(stream) == 2000  # what it returns, once

    probe.clear()
    since = await service.get_session(
        app_name=APP, user_id="u", session_id="long", config=GetSessionConfig(after_timestamp=2990)
    )
    assert since is not None and [e.id for e in since.events] == ids[-10:]
    assert probe.events_read(stream) == 10


async def test_a_cold_service_builds_the_fold_once_then_reads_warm() -> None:
    probe = RecordingStore(MemoryStore())
    first = JournalSessionService(Journal(probe))
    session = await first.create_session(app_name=APP, user_id="u", session_id="s")
    for i in range(50):
        await first.append_event(session, said(f"turn {i}"))
    stream = session_stream(APP, "u", "s")
    restarted = JournalSessionService(Journal(probe))  # another process: an empty fold cache
    config = GetSessionConfig(num_recent_events=2)
    probe.clear()
    await restarted.get_session(app_name=APP, user_id="u", session_id="s", config=config)
    assert probe.events_read(stream) == 51 + 2  # the fold's rebuild, then the two events
    probe.clear()
    await restarted.get_session(app_name=APP, user_id="u", session_id="s", config=config)
    assert probe.events_read(stream) == 2


# -- trimmed sessions keep tool calls with their results ---------------------------------------


def call(*ids: str) -> Event:
    parts = [types.Part(function_call=types.FunctionCall(id=i, name="f", args={})) for i in ids]
    return Event(author="model", content=types.Content(role="model", parts=parts))


def answer(*ids: str) -> Event:
    parts = [
        types.Part(function_response=types.FunctionResponse(id=i, name="f", response={"r": i}))
        for i in ids
    ]
    return Event(author="model", content=types.Content(role="user", parts=parts))


def pairs_cut(events: list[Event], start: int) -> bool:
    """Whether ``events[start:]`` holds a result whose call is in ``events[:start]``."""
    made = {c.id for e in events[:start] for c in e.get_function_calls()}
    kept = {c.id for e in events[start:] for c in e.get_function_calls()}
    answered = {r.id for e in events[start:] for r in e.get_function_responses()}
    return bool(answered & (made - kept))


@pytest.mark.parametrize(
    ("recent", "kept"),
    [(8, 8), (6, 5), (5, 5), (3, 3), (2, 1), (1, 1)],
)
async def test_a_trimmed_session_never_starts_with_a_result_cut_from_its_call(
    journal: Journal, recent: int, kept: int
) -> None:
    service = JournalSessionService(journal)
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    script = [said("q1"), call("c1"), answer("c1"), said("a1")]
    script += [said("q2"), call("c2"), answer("c2"), said("a2")]
    for event in script:
        await service.append_event(session, event)
    got = await service.get_session(
        app_name=APP, user_id="u", session_id="s", config=GetSessionConfig(num_recent_events=recent)
    )
    assert got is not None and got.events == session.events[len(script) - kept :]


steps = st.lists(st.sampled_from(["say", "call", "call2", "answer", "answer_old"]), max_size=14)


@settings(max_examples=60, deadline=None)
@given(steps, st.integers(0, 14), st.none() | st.integers(0, 14))
def test_trimming_keeps_adks_newest_events_less_only_results_cut_from_their_calls(
    plan: list[str], recent: int, after: int | None
) -> None:
    async def run() -> None:
        reference = InMemorySessionService()
        async with open_journal("memory://") as journal:
            ours = JournalSessionService(journal)
            theirs_session = await reference.create_session(
                app_name=APP, user_id="u", session_id="s"
            )
            our_session = await ours.create_session(app_name=APP, user_id="u", session_id="s")
            open_ids: list[str] = []
            for n, step in enumerate(plan):
                if step.startswith("call"):
                    ids = [f"c{n}"] if step == "call" else [f"c{n}a", f"c{n}b"]
                    event, open_ids = call(*ids), [*open_ids, *ids]
                elif step.startswith("answer") and open_ids:
                    pick = open_ids[0] if step == "answer_old" else open_ids[-1]
                    event, open_ids = answer(pick), [i for i in open_ids if i != pick]
                else:
                    event = said(f"say {n}")
                event.timestamp = float(n)
                await reference.append_event(theirs_session, event.model_copy(deep=True))
                await ours.append_event(our_session, event.model_copy(deep=True))
            config = GetSessionConfig(
                num_recent_events=recent, after_timestamp=None if after is None else float(after)
            )
            theirs = await reference.get_session(
                app_name=APP, user_id="u", session_id="s", config=config
            )
            got = await ours.get_session(app_name=APP, user_id="u", session_id="s", config=config)
            assert theirs is not None and got is not None
            whole = our_session.events
            start = len(whole) - len(got.events)
            assert (
                whole[start:] == got.events
                and got.events == theirs.events[len(theirs.events) - len(got.events) :]
            )
            # The first start at or after ADK's from which no result is cut from its call.
            first = len(whole) - len(theirs.events)
            assert all(pairs_cut(whole, at) for at in range(first, start))
            assert not pairs_cut(whole, start)

    asyncio.run(run())


# -- deletion -----------------------------------------------------------------------------------


async def test_delete_keeps_the_history_and_a_new_session_starts_afresh(journal: Journal) -> None:
    service = JournalSessionService(journal)
    old = await service.create_session(
        app_name=APP, user_id="u", session_id="s", state={"k": "old", "user:kept": 1}
    )
    await service.append_event(old, said("before"))
    await service.delete_session(app_name=APP, user_id="u", session_id="s")
    stream = session_stream(APP, "u", "s")
    assert await types_in(journal, stream) == [
        "adk/session-created",
        ADK_EVENT,
        "adk/session-deleted",
    ]
    assert (await service.list_sessions(app_name=APP)).sessions == []
    await service.delete_session(app_name=APP, user_id="u", session_id="s")  # nothing to do
    assert len(await types_in(journal, stream)) == 3

    new = await service.create_session(app_name=APP, user_id="u", session_id="s")
    assert new.state == {"user:kept": 1}  # the user's state outlives the session
    await service.append_event(new, said("after"))
    got = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None and texts(got.events) == ["after"]
    with pytest.raises(StaleSessionError, match="modified in storage"):
        await service.append_event(old, said("from the deleted one"))


async def test_hard_delete_removes_the_stream_and_keeps_shared_state(journal: Journal) -> None:
    service = JournalSessionService(journal, hard_delete=True)
    session = await service.create_session(
        app_name=APP, user_id="u", session_id="s", state={"app:a": 1, "user:b": 2}
    )
    await service.append_event(session, said("hi"))
    await service.delete_session(app_name=APP, user_id="u", session_id="s")
    streams = {info.stream for info in await journal.list_streams()}
    assert streams == {app_stream(APP), user_stream(APP, "u")}
    assert await service.get_session(app_name=APP, user_id="u", session_id="s") is None
    again = await service.create_session(app_name=APP, user_id="u", session_id="s")
    assert again.state == {"app:a": 1, "user:b": 2} and again.events == []


# -- shared state across a failed append --------------------------------------------------------


async def test_a_shared_delta_lost_to_a_failed_append_is_applied_by_the_next_append(
    probe: RecordingStore,
) -> None:
    service = JournalSessionService(Journal(probe))
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    users = user_stream(APP, "u")
    probe.fail(lambda call: call.method == "append" and call.stream == users)
    with pytest.raises(StoreUnavailableError):
        await service.append_event(
            session, said("one", actions=EventActions(state_delta={"user:n": 1}))
        )
    probe.fail(None)
    assert texts(session.events) == ["one"]  # committed
    assert await service.get_user_state(app_name=APP, user_id="u") == {}

    restarted = JournalSessionService(Journal(probe))  # it remembers nothing of the failure
    got = await restarted.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None
    await restarted.append_event(got, said("two"))
    await restarted.append_event(got, said("three"))
    assert await restarted.get_user_state(app_name=APP, user_id="u") == {"n": 1}
    journal = Journal(probe)
    assert len(await types_in(journal, users)) == 1  # applied once, never twice


async def test_a_failed_session_append_writes_nothing_and_changes_nothing(
    probe: RecordingStore,
) -> None:
    service = JournalSessionService(Journal(probe))
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    probe.fail(_appends)
    event = said("lost", actions=EventActions(state_delta={"temp:t": 1, "k": 2}))
    with pytest.raises(StoreUnavailableError):
        await service.append_event(session, event)
    with pytest.raises(StoreUnavailableError):
        await service.delete_session(app_name=APP, user_id="u", session_id="s")
    with pytest.raises(StoreUnavailableError):
        await service.create_session(app_name=APP, user_id="u", session_id="s2")
    assert session.events == [] and "k" not in session.state and "temp:t" not in session.state
    assert event.actions.state_delta == {"temp:t": 1, "k": 2}
    probe.fail(None)
    assert await service.get_session(app_name=APP, user_id="u", session_id="s2") is None
    await service.append_event(session, event)  # the service goes on
    got = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None and got.events == [event] and got.state == {"k": 2}


# -- the session streams' other readers and writers ---------------------------------------------


class Note(cf.Event, type="test.adk/note"):
    text: str


async def test_events_of_other_types_on_a_session_stream_do_not_block_appends(
    journal: Journal,
) -> None:
    service = JournalSessionService(journal)
    session = await service.create_session(app_name=APP, user_id="u", session_id="s")
    stale = session.model_copy(deep=True)
    await journal.append(session_stream(APP, "u", "s"), Note(text="an operator's note"))
    await service.append_event(session, said("still fresh"))
    with pytest.raises(StaleSessionError, match="modified in storage"):
        await service.append_event(stale, said("stale"))
    got = await service.get_session(app_name=APP, user_id="u", session_id="s")
    assert got is not None and got.events == session.events


# -- bad input ----------------------------------------------------------------------------------


async def test_names_that_are_not_text_are_refused_naming_the_field(journal: Journal) -> None:
    service = JournalSessionService(journal)
    with pytest.raises(InvalidInputError, match="user_id must be a str"):
        await service.create_session(app_name=APP, user_id=7)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"app_name .* lone surrogate"):
        await service.get_session(app_name="\ud800", user_id="u", session_id="s")
    with pytest.raises(InvalidInputError, match="state must be a dict"):
        await service.create_session(app_name=APP, user_id="u", state=[1])  # type: ignore[arg-type]
    assert await journal.list_streams() == ()


async def test_an_event_that_cannot_be_stored_names_the_session_and_changes_nothing(
    tmp_path: Path,
) -> None:
    async with open_journal("memory://", max_payload_bytes=2000) as journal:
        service = JournalSessionService(journal)
        session = await service.create_session(app_name=APP, user_id="u", session_id="s")
        huge = said("x" * 5000, id="big", actions=EventActions(state_delta={"temp:t": 1}))
        with pytest.raises(PayloadError, match="session 's': event 'big' cannot be stored"):
            await service.append_event(session, huge)
        assert huge.actions.state_delta == {"temp:t": 1}
        assert session.events == [] and "temp:t" not in session.state
        assert await types_in(journal, session_stream(APP, "u", "s")) == ["adk/session-created"]
        with pytest.raises(PayloadError, match="session 't'"):
            await service.create_session(
                app_name=APP, user_id="u", session_id="t", state={"x": math.inf}
            )


# -- the import guard ---------------------------------------------------------------------------

_BLOCKED = """
import sys

class NoAdk:
    def find_spec(self, name, path=None, target=None):
        if name == "google.adk" or name.startswith("google.adk."):
            raise ImportError("blocked: " + name)
        return None

sys.meta_path.insert(0, NoAdk())
import contextfold, contextfold.integrations
try:
    import contextfold.integrations.adk
except ImportError as exc:
    print(exc)
"""


def test_without_adk_the_import_says_what_to_install() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKED], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "contextfold.integrations.adk needs Google ADK: pip install 'contextfold[adk]'"
    ]
