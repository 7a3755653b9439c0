"""contextfold.testing: the provider guard and its pytest plugin, the recording store (a
complete store: it passes the store contract), the fixed clock and counted ids, envelopes."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold import testing
from contextfold.testing.guard import PROVIDER_ENVIRONMENT, is_loopback

# -- the provider guard ------------------------------------------------------------------------


class _Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def local_port() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _causes(exc: BaseException | None) -> Iterator[BaseException]:
    while exc is not None:
        yield exc
        exc = exc.__cause__ or exc.__context__


async def test_the_sdks_cannot_reach_their_providers() -> None:
    # The refusal names the URL and what to use instead; the SDKs pass it on.
    # openai before 3.63 wraps it in its APIConnectionError, as anthropic does.
    sdk_errors = (testing.ProviderBlockedError, openai.APIConnectionError)
    with testing.ProviderGuard() as guard:
        with pytest.raises(sdk_errors) as first:
            await openai.AsyncOpenAI(api_key="k", max_retries=0).models.list()
        with pytest.raises(anthropic.APIConnectionError) as second:
            await anthropic.AsyncAnthropic(api_key="k", max_retries=0).models.list()
        with pytest.raises(sdk_errors) as third:
            openai.OpenAI(api_key="k", max_retries=0).models.list()
    assert guard.refused == [
        "https://api.openai.com/v1/models",
        "https://api.anthropic.com/v1/models",
        "https://api.openai.com/v1/models",
    ]
    for raised in (first, second, third):
        assert any(isinstance(e, testing.ProviderBlockedError) for e in _causes(raised.value))


async def test_an_agent_on_a_provider_client_fails_with_the_refusal() -> None:
    async with testing.memory_journal() as journal:
        await journal.append("chat", cf.system_prompt("Be brief."))
        await journal.append("chat", cf.ContextAdded(role="user", content="hi"))
        model = cf.OpenAIChatModel("gpt-4.1", client=openai.AsyncOpenAI(api_key="k"))
        with testing.ProviderGuard() as guard, pytest.raises(cf.ModelError) as failed:
            await cf.Agent(journal, "chat", model).run_until_idle()
    assert any(isinstance(e, testing.ProviderBlockedError) for e in _causes(failed.value))
    # Each attempt is refused (openai before 3.63 retries a connection error; later ones do not).
    assert guard.refused and set(guard.refused) == {"https://api.openai.com/v1/chat/completions"}


async def test_a_refusal_names_the_url_and_says_what_to_use() -> None:
    with testing.ProviderGuard(), pytest.raises(testing.ProviderBlockedError) as refused:
        async with httpx.AsyncClient() as client:
            await client.get("https://example.com/v1/chat?key=secret")
    assert refused.value.url == "https://example.com/v1/chat"  # the query is left out
    assert "FunctionModel" in str(refused.value) and isinstance(refused.value, RuntimeError)


def test_loopback_goes_through(local_port: int) -> None:
    with testing.ProviderGuard() as guard:
        for host in ("127.0.0.1", "localhost"):
            assert httpx.get(f"http://{host}:{local_port}/").text == "ok"
    assert guard.refused == []


def test_a_swallowed_refusal_still_fails_the_check() -> None:
    refused = pytest.raises(testing.ProviderBlockedError, match=r"api\.openai\.com")
    hidden = contextlib.suppress(testing.ProviderBlockedError)  # the code under test hides it
    with refused, testing.no_real_providers(), hidden:
        httpx.get("https://api.openai.com/v1/models")


def test_the_provider_environment_is_out_while_the_guard_is_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-real")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://proxy.example")
    with testing.ProviderGuard():
        assert not set(PROVIDER_ENVIRONMENT) & set(os.environ)
    assert os.environ["OPENAI_API_KEY"] == "sk-real"
    assert os.environ["ANTHROPIC_BASE_URL"] == "https://proxy.example"


_NESTED = """
import importlib
from contextfold.testing import ProviderGuard, guard

def transports():
    return [getattr(c, m) for c, m in guard.transports()]

before = transports()
with ProviderGuard():
    patched = transports()
    with ProviderGuard():
        assert transports() == patched  # patched once, not wrapped again
    assert transports() == patched  # the inner guard left them on
assert all(p is not b for p, b in zip(patched, before))
assert transports() == before  # the last guard restored them
print(sorted({c.__module__.split(".")[0] for c, _ in guard.transports()}))
"""


def test_nested_guards_patch_once_and_the_last_restores() -> None:
    # A fresh process: this suite's own guard is on in this one.
    done = subprocess.run(
        [sys.executable, "-c", _NESTED], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "'httpx'" in done.stdout and "'httpx2'" in done.stdout  # the SDKs' fork too


@given(st.ip_addresses())
def test_loopback_means_the_loopback_addresses(address: ipaddress.IPv4Address) -> None:
    assert is_loopback(str(address)) == address.is_loopback
    assert is_loopback(f"[{address}]") == address.is_loopback


@pytest.mark.parametrize(
    ("host", "local"),
    [("localhost", True), ("api.localhost", True), ("api.openai.com", False), ("", False)],
)
def test_loopback_names(host: str, local: bool) -> None:
    assert is_loopback(host) is local


_USERS_TEST = """
import httpx

def test_reaches_a_provider_and_hides_it():
    try:
        httpx.get("https://api.openai.com/v1/models")
    except Exception:
        pass

def test_stays_local():
    assert True
"""


def test_the_plugin_fails_a_test_that_tried_to_reach_a_provider(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    (tmp_path / "conftest.py").write_text(
        'pytest_plugins = ["contextfold.testing.plugin"]\n', encoding="utf-8"
    )
    (tmp_path / "test_users.py").write_text(_USERS_TEST, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed, 1 error" in done.stdout, done.stdout  # failed in its teardown
    assert "tried to reach a real model provider: https://api.openai.com/v1/models" in done.stdout


def test_this_suite_runs_under_the_guard(provider_guard: testing.ProviderGuard) -> None:
    with pytest.raises(testing.ProviderBlockedError):
        httpx.get("https://api.anthropic.com/v1/messages")
    assert provider_guard.refused == ["https://api.anthropic.com/v1/messages"]
    provider_guard.refused.clear()  # this test's refusal was the point


# -- the recording store -----------------------------------------------------------------------


class TestRecordingStoreContract(testing.StoreContract):
    """The recording store is a complete store: the contract passes through it."""

    def make_store(self) -> cf.Store:
        return testing.RecordingStore()


class Said(cf.Event, type="testing/said"):
    text: str


async def test_every_call_is_recorded_with_its_arguments_and_result() -> None:
    store = testing.RecordingStore()
    journal = cf.Journal(store)
    done = await journal.append("s", [Said(text="a"), Said(text="b")], idempotency_key="k")
    page = await journal.read("s", limit=1)
    assert store.methods == ("open", "append", "read")
    _, append, read = store.calls
    assert append.stream == "s" and append.result == done
    assert [e.type for e in append.args["events"]] == ["testing/said"] * 2
    assert append.args["idempotency_key"] == "k"
    assert (read.after, read.types, read.returned, read.reset) == (None, None, 1, False)
    assert read.result == page and store.reads == (read,)
    store.clear()
    assert store.calls == []


async def test_a_refused_call_is_recorded_with_its_error() -> None:
    store = testing.RecordingStore()
    journal = cf.Journal(store)
    with pytest.raises(cf.WrongExpectedVersionError):
        await journal.append("s", Said(text="a"), expected_version=3)
    (call,) = store.of("append")
    assert isinstance(call.error, cf.WrongExpectedVersionError) and call.result is None


async def test_a_paused_read_holds_until_resumed() -> None:
    store = testing.RecordingStore()
    journal = cf.Journal(store)
    await journal.append("s", Said(text="a"))
    store.pause("read")
    reading = asyncio.ensure_future(journal.read("s"))
    await store.paused.wait()
    assert not reading.done() and store.reads[-1].returned == 1  # answered, then held
    store.resume()
    assert len((await reading).events) == 1
    await journal.read("s")  # no longer held
    assert len(store.reads) == 2


async def test_events_read_counts_what_the_reads_returned_per_stream() -> None:
    store = testing.RecordingStore()
    journal = cf.Journal(store)
    await journal.append("a", [Said(text="1"), Said(text="2"), Said(text="3")])
    await journal.append("b", Said(text="x"))
    await journal.read("a", limit=2)
    await journal.read("a")
    await journal.read("b")
    assert (store.events_read("a"), store.events_read("b"), store.events_read()) == (5, 1, 6)
    await journal.latest("a", [Said])  # not a read
    assert store.events_read() == 6
    store.clear()
    assert store.events_read() == 0


async def _texts(journal: cf.Journal, stream: str) -> list[str]:
    decoded = [event.decode() for event in (await journal.read(stream)).events]
    return [event.text for event in decoded if isinstance(event, Said)]


def _appends_to(stream: str) -> Callable[[testing.StoreCall], bool]:
    return lambda call: call.method == "append" and call.stream == stream


async def test_an_injected_failure_reaches_nothing_and_names_the_call() -> None:
    store = testing.RecordingStore()
    journal = cf.Journal(store)
    store.fail(_appends_to("a"))
    with pytest.raises(cf.StoreUnavailableError, match="call to append of stream 'a'"):
        await journal.append("a", Said(text="lost"))
    await journal.append("b", Said(text="kept"))  # other calls pass
    assert await store.inner.version("default", "a") == 0
    (failed, passed) = store.of("append")
    assert isinstance(failed.error, cf.StoreUnavailableError) and failed.result is None
    assert passed.error is None
    with pytest.raises(cf.StoreUnavailableError):
        await journal.append("a", Said(text="lost again"))  # until told otherwise
    store.fail(None)
    await journal.append("a", Said(text="stored"))
    assert await _texts(journal, "a") == ["stored"]


async def test_an_answered_failure_happens_once_and_the_caller_never_hears() -> None:
    store = testing.RecordingStore()
    journal = cf.Journal(store)
    store.fail(_appends_to("a"), answered=True, once=True)
    with pytest.raises(cf.StoreUnavailableError, match="answer to append of stream 'a'"):
        await journal.append("a", Said(text="stored"))
    await journal.append("a", Said(text="next"))
    assert await _texts(journal, "a") == ["stored", "next"]
    lost = store.of("append")[0]
    assert lost.result is not None and isinstance(lost.error, cf.StoreUnavailableError)


async def test_a_hook_runs_once_just_before_the_next_call_and_may_use_the_store() -> None:
    store = testing.RecordingStore()
    journal = cf.Journal(store)
    seen: list[str | None] = []

    async def other_writer(call: testing.StoreCall) -> None:
        seen.append(call.stream)
        await journal.append("a", Said(text="meanwhile"))  # runs the hook no more

    store.before_next("append", other_writer)
    await journal.read("a")  # not an append: the hook waits
    await journal.append("a", Said(text="mine"))
    await journal.append("a", Said(text="later"))
    assert seen == ["a"]
    texts = await _texts(journal, "a")
    assert texts == ["meanwhile", "mine", "later"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from(["ok", "before", "answered"]))))
async def test_only_appends_failed_before_the_store_are_missing(
    plan: list[tuple[str, str]],
) -> None:
    store = testing.RecordingStore()
    journal = cf.Journal(store)
    for i, (stream, mode) in enumerate(plan):
        store.fail(None if mode == "ok" else _appends_to(stream), answered=mode == "answered")
        with contextlib.suppress(cf.StoreUnavailableError):
            await journal.append(stream, Said(text=str(i)))
    for stream in "ab":
        expected = [str(i) for i, (s, mode) in enumerate(plan) if s == stream and mode != "before"]
        got = await _texts(journal, stream)
        assert got == expected
    failed = [call for call in store.of("append") if call.error is not None]
    assert len(failed) == sum(mode != "ok" for _, mode in plan)


# -- clock, ids, journals, envelopes ----------------------------------------------------------


async def _session() -> tuple[cf.StoredEvent, ...]:
    async with testing.memory_journal() as journal:
        await journal.append("s", [Said(text="a"), Said(text="b")])
        return (await journal.read("s")).events


async def test_a_memory_journal_writes_the_same_events_every_run() -> None:
    first, second = await _session(), await _session()
    assert first == second
    assert [e.meta.event_id for e in first] == ["ev-1", "ev-2"]
    assert {e.meta.time for e in first} == {testing.EPOCH.isoformat()}


def test_the_fixed_clock_moves_only_when_told() -> None:
    clock = testing.FixedClock()
    assert clock() == clock() == testing.EPOCH
    assert clock.advance(90) == testing.EPOCH + timedelta(seconds=90)
    assert clock.advance(minutes=1) == clock() == testing.EPOCH + timedelta(seconds=150)
    with pytest.raises(cf.InvalidInputError, match="aware datetime"):
        testing.FixedClock(datetime(2026, 1, 1))
    assert testing.FixedClock(datetime(2030, 5, 1, tzinfo=UTC))().year == 2030


def test_counter_ids_count_per_factory() -> None:
    ids, other = testing.counter_ids(), testing.counter_ids("run-", start=7)
    assert [ids(), ids(), other(), ids()] == ["ev-1", "ev-2", "run-7", "ev-3"]


@given(st.lists(st.text(max_size=8), max_size=8))
def test_envelopes_fold_as_the_journal_folds(texts: list[str]) -> None:
    fold: cf.Fold[tuple[str, ...]] = cf.Fold("testing_said", initial=tuple)

    @fold.on(Said)
    def _(state: tuple[str, ...], ev: cf.Envelope[Said]) -> tuple[str, ...]:
        return (*state, f"{ev.position}:{ev.payload.text}")

    async def through_a_journal() -> tuple[str, ...]:
        async with testing.memory_journal() as journal:
            if texts:
                await journal.append("s", [Said(text=t) for t in texts])
            return await journal.fold(fold, "s")

    pure = fold.apply_all(fold.initial_state(), testing.envelopes(Said(text=t) for t in texts))
    assert pure == asyncio.run(through_a_journal())


def test_an_envelope_carries_the_coordinates_a_journal_gives() -> None:
    built = testing.envelope(Said(text="x"), 4, stream="chat")
    assert (built.stream, built.position, built.global_position, built.cursor) == (
        "chat",
        4,
        4,
        "4",
    )
    assert built.type == "testing/said" and built.meta.event_id == "ev-4"
    meta = cf.EventMeta("mine", "2026-02-02T00:00:00+00:00", actor="user")
    assert testing.envelope(Said(text="x"), meta=meta, global_position=9).meta is meta
