"""JournalHistory: every message part round-trips as pydantic-ai's own adapter returns it, on
every backend; saves are atomic and idempotent; warm loads cost what they return; bad input
is refused with nothing written."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

import contextfold as cf
from contextfold.errors import CorruptEventError, InvalidInputError, PayloadError
from contextfold.events import Event, RawEvent, runtime_only_types
from contextfold.integrations import _pydantic_ai_history
from contextfold.integrations.pydantic_ai import (
    ACTOR_KEY,
    JournalHistory,
    PydanticAiMessage,
    PydanticAiRequestSent,
    PydanticAiSentMessage,
)
from contextfold.journal import Journal, open_journal
from contextfold.journal.encode import MAX_META_CHARS
from contextfold.testing import RecordingStore
from tests.integrations.helpers import (
    BACKENDS,
    LEGACY,
    REQUEST_PARTS,
    RESPONSE_PARTS,
    T0,
    adapter_round_trip,
    backend_url,
    conversation,
    installed_tags,
)

TA = ModelMessagesTypeAdapter


@pytest.fixture(params=BACKENDS)
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Journal]:
    async with open_journal(backend_url(request, tmp_path)) as opened:
        yield opened


# -- every part kind ---------------------------------------------------------------------------


def test_the_builders_cover_every_part_kind_the_installed_pydantic_ai_defines() -> None:
    # A part kind added by a newer pydantic-ai fails here until the round trip covers it.
    assert installed_tags(ModelRequestPart) - LEGACY == set(REQUEST_PARTS("t", b"d", "s"))
    assert installed_tags(ModelResponsePart) == set(RESPONSE_PARTS("t", b"d", "s"))


async def test_every_part_kind_round_trips_verbatim(journal: Journal) -> None:
    messages = conversation()
    history = JournalHistory(journal, "chat")
    await history.save(messages)
    loaded = await history.load()
    assert loaded == adapter_round_trip(messages)
    # Beyond equality: the JSON pydantic-ai makes of the loaded history is the JSON it made
    # of the original, but for the legacy RetryPromptPart, which loads as the part it meant.
    request, loaded_request = messages[0], loaded[0]
    assert isinstance(request, ModelRequest) and isinstance(loaded_request, ModelRequest)
    legacy = [i for i, p in enumerate(request.parts) if p.part_kind == "retry-prompt"]
    assert len(legacy) == 1
    original: list[ModelMessage] = [
        ModelRequest([p for i, p in enumerate(request.parts) if i not in legacy])
    ]
    reloaded: list[ModelMessage] = [
        ModelRequest([p for i, p in enumerate(loaded_request.parts) if i not in legacy])
    ]
    assert TA.dump_json(reloaded) == TA.dump_json(original)
    assert TA.dump_json(loaded[1:]) == TA.dump_json(messages[1:])
    retried = loaded_request.parts[legacy[0]]
    assert isinstance(retried, ToolReturnPart) and retried.outcome == "retried"
    # Thinking signatures and binary content, byte for byte.
    response = loaded[1]
    assert isinstance(response, ModelResponse)
    thinking = [p for p in response.parts if isinstance(p, ThinkingPart)]
    assert [p.signature for p in thinking] == ["EqQBCkgIAR-sig=="]
    assert response.files[0].data == b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\x00\x80"


_unicode = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=_unicode,
    data=st.binary(max_size=64),
    signature=_unicode,
    request_kinds=st.sets(st.sampled_from(sorted(REQUEST_PARTS("t", b"d", "s")))),
    response_kinds=st.sets(st.sampled_from(sorted(RESPONSE_PARTS("t", b"d", "s"))), min_size=1),
)
async def test_any_mix_of_parts_and_values_round_trips(
    text: str, data: bytes, signature: str, request_kinds: set[str], response_kinds: set[str]
) -> None:
    requests = REQUEST_PARTS(text, data, signature)
    responses = RESPONSE_PARTS(text, data, signature)
    messages: list[ModelMessage] = [
        ModelRequest([requests[k]() for k in sorted(request_kinds)] or [UserPromptPart(text)]),
        ModelResponse([responses[k]() for k in sorted(response_kinds)], timestamp=T0),
    ]
    async with cf.open_journal("memory://") as memory:
        history = JournalHistory(memory, "chat")
        await history.save(messages)
        loaded = await history.load()
        assert loaded == adapter_round_trip(messages)
        assert TA.dump_json(adapter_round_trip(loaded)) == TA.dump_json(loaded)


# -- saving ------------------------------------------------------------------------------------


def _turn(n: int) -> list[ModelMessage]:
    call = ToolCallPart("add", {"a": n, "b": 1}, f"c{n}")
    first: list[Any] = [SystemPromptPart("You add.", timestamp=T0)] if n == 0 else []
    return [
        ModelRequest([*first, UserPromptPart(f"{n} + 1?", timestamp=T0)], run_id=f"run-{n}"),
        ModelResponse([call], timestamp=T0, run_id=f"run-{n}"),
        ModelRequest([ToolReturnPart("add", n + 1, f"c{n}", timestamp=T0)], run_id=f"run-{n}"),
        ModelResponse([TextPart(f"{n + 1}")], timestamp=T0, run_id=f"run-{n}"),
    ]


class _Result:
    def __init__(self, new: list[ModelMessage]) -> None:
        self.new = new

    def new_messages(self) -> list[ModelMessage]:
        return self.new


async def test_a_save_is_one_atomic_idempotent_append(journal: Journal) -> None:
    history = JournalHistory(journal, "chat")
    first = await history.save(_Result(_turn(0)))
    again = await history.save(_Result(_turn(0)))
    assert first is not None and again is not None
    assert (first.first_position, first.last_position, first.deduplicated) == (1, 4, False)
    assert again.deduplicated and again.last_position == 4
    assert await journal.version("chat") == 4
    stored = [e async for e in journal.read_all("chat")]
    assert {e.meta.run_id for e in stored} == {"run-0"}
    assert {e.meta.idempotency_key for e in stored} == {first and stored[0].meta.idempotency_key}
    assert await history.save(_Result([])) is None
    await history.save(_turn(1))
    assert await history.load() == adapter_round_trip(_turn(0) + _turn(1))


@pytest.mark.parametrize("length", [MAX_META_CHARS, MAX_META_CHARS + 1, 1_000_000])
async def test_a_run_id_over_the_journals_limit_is_left_out(journal: Journal, length: int) -> None:
    """The run id is stored with every event of the save: one over the journal's limit is
    left out (the messages, which hold it, are saved); one within it is kept."""
    run_id = "r" * length
    messages: list[ModelMessage] = [
        ModelRequest([UserPromptPart("hi", timestamp=T0)], run_id=run_id),
        ModelResponse([TextPart("hello")], timestamp=T0, run_id=run_id),
    ]
    history = JournalHistory(journal, "chat")
    saved = await history.save(messages)
    assert saved is not None and saved.last_position == 2
    stored = [e async for e in journal.read_all("chat")]
    kept = run_id if length <= MAX_META_CHARS else None
    assert [e.meta.run_id for e in stored] == [kept, kept]
    assert await history.load() == adapter_round_trip(messages)


async def test_a_new_history_on_the_same_sqlite_file_loads_what_was_saved(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'chat.db'}"
    async with open_journal(url) as journal:
        await JournalHistory(journal, "chat").save(_turn(0))
    async with open_journal(url) as journal:
        history = JournalHistory(journal, "chat")
        assert await history.load() == adapter_round_trip(_turn(0))
        assert (await history.save(_turn(0))).deduplicated  # type: ignore[union-attr]


def test_the_sync_methods_work_on_a_sync_journal() -> None:
    with cf.open_journal_sync("memory://") as journal:
        history = JournalHistory(journal, "chat")
        history.save_sync(_turn(0))
        history.save_sync(_turn(1))
        assert history.load_sync() == adapter_round_trip(_turn(0) + _turn(1))
        assert len(history.load_sync(budget=10)) == 5  # the system prompt, then the last turn


# -- what loads cost ---------------------------------------------------------------------------


async def test_a_warm_load_reads_only_new_events_and_decodes_only_what_it_returns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[int] = []
    real = _pydantic_ai_history._decode

    def counting(chunks: Any) -> list[ModelMessage]:
        decoded.append(len(chunks))
        return real(chunks)

    monkeypatch.setattr(_pydantic_ai_history, "_decode", counting)
    store = RecordingStore()
    async with cf.Journal(store) as journal:
        history = JournalHistory(journal, "chat")
        costs = {}
        for n in range(200):
            await history.save(_turn(n))
            if n + 1 in (10, 200):
                await history.load(budget=60)  # the fold catches up
                read, decoded[:] = store.events_read(), []
                view = await history.load(budget=60)
                costs[n + 1] = (store.events_read() - read, decoded[:], len(view))
        assert costs[10] == costs[200] == (0, [5], 5), costs  # pinned prompt + the last turn
        await history.save(_turn(200))
        read = store.events_read()
        assert len(await history.load()) == 201 * 4
        assert store.events_read() - read == 4


# -- refusals ----------------------------------------------------------------------------------


async def test_bad_input_is_refused_and_nothing_is_written(journal: Journal) -> None:
    history = JournalHistory(journal, "chat")
    with pytest.raises(InvalidInputError, match=r"messages\[1\] is a str"):
        await history.save([ModelRequest([UserPromptPart("x")]), "hi"])
    with pytest.raises(InvalidInputError, match="run result"):
        await history.save(42)
    forged = ModelRequest([SystemPromptPart("x", metadata={ACTOR_KEY: "slack"})])
    with pytest.raises(InvalidInputError, match=r"messages\[1\]\.parts\[0\].*not an actor"):
        await history.save([ModelRequest([UserPromptPart("y")]), forged])
    with pytest.raises(InvalidInputError, match="budget"):
        await history.load(budget=0)
    assert await journal.version("chat") == 0
    with pytest.raises(cf.InvalidStreamNameError):
        JournalHistory(journal, " chat")
    with pytest.raises(InvalidInputError, match=r"cf\.Journal"):
        JournalHistory("sqlite:///x.db", "chat")  # type: ignore[arg-type]


async def test_a_message_over_the_payload_limit_names_the_stream_and_writes_nothing() -> None:
    async with open_journal("memory://", max_payload_bytes=2_000) as journal:
        history = JournalHistory(journal, "chat")
        big = ModelRequest([UserPromptPart("x" * 5_000)])
        with pytest.raises(PayloadError, match=r"saving 2 messages to 'chat'.*events\[1\]"):
            await history.save([ModelRequest([UserPromptPart("hi")]), big])
        assert await journal.version("chat") == 0


async def test_a_stored_message_that_no_longer_validates_names_its_position() -> None:
    async with open_journal("memory://") as journal:
        history = JournalHistory(journal, "chat")
        await history.save(_turn(0))
        await journal.append(
            "chat", RawEvent(PydanticAiMessage.event_type, {"message": {"kind": "x"}})
        )
        with pytest.raises(CorruptEventError, match="position 5") as raised:
            await history.load()
        assert raised.value.position == 5


def test_the_integration_events_are_runtime_only() -> None:
    # An HTTP writer posing as the runtime could otherwise forge a system prompt.
    names: list[type[Event]] = [PydanticAiMessage, PydanticAiSentMessage, PydanticAiRequestSent]
    assert {cls.event_type for cls in names} <= runtime_only_types()


# -- the import guard --------------------------------------------------------------------------

_BLOCKED = """
import sys

class NoPydanticAi:
    def find_spec(self, name, path=None, target=None):
        if name == "pydantic_ai" or name.startswith("pydantic_ai."):
            raise ImportError("blocked: " + name)
        return None

sys.meta_path.insert(0, NoPydanticAi())
import contextfold, contextfold.integrations
try:
    import contextfold.integrations.pydantic_ai
except ImportError as exc:
    print(exc)
print(sorted(m for m in sys.modules if m.startswith("pydantic_ai")))
"""


def test_without_pydantic_ai_the_import_says_what_to_install() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _BLOCKED], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "contextfold.integrations.pydantic_ai needs pydantic-ai: "
        "pip install 'contextfold[pydantic-ai]'",
        "[]",
    ]


def test_a_budget_of_infinity_loads_everything() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with cf.open_journal_sync("memory://") as journal:
            history = JournalHistory(journal, "chat")
            history.save_sync(_turn(0) + _turn(1))
            assert history.load_sync(budget=math.inf) == history.load_sync()
