"""Compaction by cutoff: thresholds, the summarizer request and the reducer."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from contextfold.context import (
    COMPACTION_INSTRUCTION,
    CONTEXT_WINDOWS,
    DEFAULT_CONTEXT_WINDOW,
    Actor,
    CompactionMeta,
    LlmResponse,
    RequestHeader,
    build_request,
    build_summary_request,
    context_window,
    needs_compaction,
    pick_compaction,
    summary_item,
)
from contextfold.context.compaction import (
    MAX_COMPACTION_ATTEMPTS,
    MODEL_WINDOWS,
    check_context_window,
    compaction_attempt,
    latest_summary,
    threshold_tokens,
)
from contextfold.errors import InvalidInputError
from contextfold.wire import TRANSPORTS, Usage, render_body
from tests.context.helpers import HEADER, Log


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o", 128_000),
        ("gpt-4o-mini-2024-07-18", 128_000),
        ("gpt-4", 8_192),
        ("gpt-4-turbo", 128_000),
        ("gpt-4.1-mini", 1_047_576),
        ("o1-mini", 128_000),
        ("o1", 200_000),
        ("claude-sonnet-4-20250514", 200_000),
        ("anthropic/claude-3-5-haiku", 200_000),
        ("GPT-4O", 128_000),
        ("my-local-model", DEFAULT_CONTEXT_WINDOW),
    ],
)
def test_context_window_longest_prefix(model: str, window: int) -> None:
    assert context_window(model) == window


def test_context_window_custom_table() -> None:
    assert context_window("acme-xl-2", {"acme-": 1000, "acme-xl": 5000}) == 5000


def test_needs_compaction_at_the_threshold() -> None:
    assert not needs_compaction(63_999, "gpt-4o")
    assert needs_compaction(64_000, "gpt-4o")
    assert needs_compaction(100_000, "gpt-4o", threshold=0.75)
    assert not needs_compaction(95_999, "gpt-4o", threshold=0.75)
    with pytest.raises(InvalidInputError):
        needs_compaction(1, "gpt-4o", threshold=0)
    with pytest.raises(InvalidInputError):
        needs_compaction(1, "gpt-4o", threshold=1.5)
    with pytest.raises(InvalidInputError):
        needs_compaction(-1, "gpt-4o")


def _response(request_offset: int, tokens: int | None, model: str = "gpt-4o") -> LlmResponse:
    usage = Usage(input_tokens=tokens) if tokens is not None else None
    return LlmResponse(request_offset=request_offset, model=model, usage=usage)


def test_pick_compaction_takes_only_the_newest_over_threshold() -> None:
    batch = [_response(5, 70_000), _response(9, 90_000), _response(12, 1_000), _response(7, None)]
    chosen = pick_compaction(batch)
    assert chosen is not None and chosen.request_offset == 9
    assert pick_compaction(batch, compacted_through=9) is None
    assert pick_compaction([_response(3, 10)]) is None
    assert pick_compaction([]) is None


def _compactable() -> tuple[Log, int]:
    log = Log()
    log.add("system", "prompt v1", key="agent/system-prompt")  # 1
    log.add("system", "always be kind")  # 2
    log.add("user", "first question", actor=Actor(type="user"))  # 3
    log.request()  # 4
    log.add("assistant", "first answer", actor=Actor(type="agent"), llm_request_offset=4)  # 5
    log.add("system", "prompt v2", key="agent/system-prompt")  # 6
    log.add("system", "always be brief")  # 7
    log.add("developer", "task v1", key="task")  # 8
    log.add("user", "second question", actor=Actor(type="user"))  # 9
    r = log.request()  # 10: its usage crossed the threshold
    log.add("assistant", "second answer", actor=Actor(type="agent"), llm_request_offset=r)  # 11
    log.add("user", "wait, also this", actor=Actor(type="slack"))  # 12: arrived mid-request
    log.add("developer", "task v2", key="task")  # 13: updates the published @8
    return log, r


def test_summary_request_is_the_crossing_request_plus_one_instruction() -> None:
    log, r = _compactable()
    measured = build_request(log.state(through=r))
    summarizer = build_summary_request(log.state(through=r))
    assert summarizer.messages[:-1] == measured.messages
    assert replace(summarizer, messages=measured.messages) == measured  # same model, tools
    last = summarizer.messages[-1]
    assert (last.role, last.content) == ("developer", COMPACTION_INSTRUCTION)
    # Byte for byte on the OpenAI wire: the measured body's messages are a prefix.
    body = json.loads(render_body(measured, "openai-chat"))
    summary_body = json.loads(render_body(summarizer, "openai-chat"))
    assert summary_body["messages"][:-1] == body["messages"]


def test_summary_instruction_is_user_without_a_native_developer_role() -> None:
    log = Log()
    log.add("user", "hi")
    log.request(RequestHeader(transport="anthropic", model="claude-sonnet-4", max_tokens=100))
    request = build_summary_request(log.state(), instruction="sum up")
    assert (request.messages[-1].role, request.messages[-1].content) == ("user", "sum up")
    assert render_body(request, "anthropic")


def test_compaction_prepends_the_summary_and_keeps_what_came_after_the_cutoff() -> None:
    log, r = _compactable()
    usage = Usage(input_tokens=900, output_tokens=80)
    summary_at = log.append(summary_item("Summary of @3..@10.", cutoff=r, usage=usage))  # 14
    state = log.state()
    assert state.compacted_through == r
    assert [(i.offset, i.content) for i in state.history] == [
        (summary_at, "Summary of @3..@10."),
        (11, "second answer"),
        (12, "wait, also this"),  # the unanswered mid-request message survives verbatim
        (13, "task v2"),
    ]
    assert state.history[0].compaction == CompactionMeta(replaces_history_through=r, usage=usage)
    # updates still points at the published @8, now gone: a valid journal coordinate.
    assert state.history[3].updates == 8
    # System lane kept; the keyed system item collapsed to its latest value.
    assert [(i.offset, i.content) for i in state.system] == [
        (2, "always be kind"),
        (6, "prompt v2"),
        (7, "always be brief"),
    ]
    log.request()
    request = build_request(log.state())
    assert request.messages[len(state.system)].content == f"@{summary_at}\nSummary of @3..@10."
    assert request.messages[len(state.system)].role == "user"
    for transport in TRANSPORTS:
        header = RequestHeader(transport=transport, model="m", max_tokens=10)
        assert render_body(build_request(log.state(), header), transport)


def test_summary_is_user_on_every_transport_and_metadata_stays_hidden() -> None:
    log, r = _compactable()
    log.append(summary_item("gist", cutoff=r, usage=Usage(input_tokens=5)))
    for native in (True, False):
        log.request(RequestHeader(transport="openai-chat", model="m", developer_role=native))
        messages = build_request(log.state()).messages
        summary = next(m for m in messages if m.content.endswith("\ngist"))
        assert summary.role == "user"
        assert "replaces" not in summary.content and "compaction" not in summary.content


@pytest.mark.parametrize(
    "cutoff",
    [
        pytest.param(14, id="cutoff-equals-own-offset"),
        pytest.param(99, id="cutoff-above-own-offset"),
        pytest.param(9, id="cutoff-not-a-request"),
    ],
)
def test_a_malformed_compaction_is_ignored(cutoff: int) -> None:
    log, _ = _compactable()
    before = log.state()
    log.append(summary_item("evil", cutoff=cutoff))  # offset 14
    assert log.state() == before


def test_an_older_or_repeated_cutoff_is_ignored() -> None:
    log, r = _compactable()
    log.append(summary_item("newer", cutoff=r))
    state = log.state()
    log.append(summary_item("older", cutoff=4))
    log.append(summary_item("same again", cutoff=r))
    assert log.state() == state


def test_a_second_compaction_replaces_the_first_summary() -> None:
    log, r = _compactable()
    log.append(summary_item("one", cutoff=r))  # 14
    log.add("user", "q3")  # 15
    r2 = log.request()  # 16
    log.add("user", "q4")  # 17
    log.append(summary_item("two", cutoff=r2))  # 18
    state = log.state()
    assert [i.content for i in state.history] == ["two", "q4"]
    assert state.compacted_through == r2


def test_compaction_boundary_both_sides() -> None:
    # An item at the cutoff is replaced; one right after it is kept.
    log = Log()
    log.add("user", "before")  # 1
    r = log.request()  # 2
    log.add("user", "after")  # 3
    log.append(summary_item("s", cutoff=r))  # 4
    assert [i.offset for i in log.state().history] == [4, 3]


def test_keyed_history_slot_after_its_key_was_compacted_starts_afresh() -> None:
    log = Log()
    log.add("developer", "v1", key="k")  # 1
    r = log.request()  # 2
    log.append(summary_item("s", cutoff=r))  # 3
    log.add("developer", "v2", key="k")  # 4
    log.add("developer", "v3", key="k")  # 5: unpublished slot, replaced in place
    assert [(i.offset, i.content, i.updates) for i in log.state().history] == [
        (3, "s", None),
        (5, "v3", None),
    ]


def test_header_snapshot_is_kept_through_compaction() -> None:
    log, r = _compactable()
    log.append(summary_item("s", cutoff=r))
    assert log.state().header == HEADER


# -- context windows: the input limit, where each number comes from --------------------------


@pytest.mark.parametrize("model", ["gpt-5", "gpt-5-mini", "gpt-5-nano", "gpt-5.1", "openai/gpt-5"])
def test_the_gpt_5_family_window_is_its_input_limit(model: str) -> None:
    assert context_window(model) == 272_000
    assert needs_compaction(136_000, model) and not needs_compaction(135_999, model)


def test_every_window_says_where_it_comes_from() -> None:
    prefixes = [row.prefix for row in MODEL_WINDOWS]
    assert len(set(prefixes)) == len(prefixes)
    for row in MODEL_WINDOWS:
        assert row.input_tokens > 0 and row.source.strip(), row
        assert CONTEXT_WINDOWS[row.prefix] == row.input_tokens
    assert set(CONTEXT_WINDOWS) == set(prefixes)


def test_the_window_table_is_read_only_and_each_look_up_matches_it() -> None:
    with pytest.raises(TypeError):
        CONTEXT_WINDOWS["gpt-4o"] = 1  # type: ignore[index]
    table = dict(CONTEXT_WINDOWS)  # the same rows, not the table itself: not remembered
    for model in ("gpt-4o", "GPT-4O-mini", "openai/gpt-4-32k", " claude-sonnet-4 ", "mystery"):
        for _ in range(2):
            assert context_window(model) == context_window(model, table)
    assert context_window("mystery") == DEFAULT_CONTEXT_WINDOW


def test_a_given_window_overrides_the_table() -> None:
    assert needs_compaction(500, "gpt-4o", window=1000)
    assert not needs_compaction(499, "gpt-4o", window=1000)
    assert threshold_tokens("gpt-4o", threshold=0.25, window=1000) == 250
    assert threshold_tokens("gpt-5") == 136_000
    over = [_response(5, 600)]
    assert pick_compaction(over) is None
    picked = pick_compaction(over, window=1000)
    assert picked is not None and picked.request_offset == 5


@pytest.mark.parametrize("window", [0, -1, 1.5, True, "128000"])
def test_a_window_that_is_no_positive_int_is_refused(window: object) -> None:
    with pytest.raises(InvalidInputError, match="context_window"):
        check_context_window(window)
    with pytest.raises(InvalidInputError, match="context_window"):
        needs_compaction(1, "gpt-4o", window=window)  # type: ignore[arg-type]


# -- compaction attempts in a row --------------------------------------------------------------


def _compacted(attempt: int = 1) -> tuple[Log, int, int]:
    """A context compacted through its first request: (log, cutoff, summary offset)."""
    log = Log()
    log.add("system", "a big system lane", key="agent/system-prompt")  # 1
    log.add("user", "q1", actor=Actor(type="user"))  # 2
    cutoff = log.request()  # 3
    log.add("assistant", "a1", actor=Actor(type="agent"), llm_request_offset=cutoff)  # 4
    summary_at = log.append(summary_item("gist", cutoff=cutoff, attempt=attempt))  # 5
    return log, cutoff, summary_at


def test_a_first_compaction_is_attempt_one() -> None:
    log = Log()
    log.add("user", "q1")
    r = log.request()
    assert compaction_attempt(log.state(), r, over=True) == 1
    assert latest_summary(log.state()) is None


def test_a_compaction_the_next_request_still_overflows_counts_on() -> None:
    log, _, summary_at = _compacted(attempt=1)
    log.add("user", "q2", actor=Actor(type="user"))
    first = log.request()  # the first request after the cutoff
    state = log.state()
    assert latest_summary(state) is not None and latest_summary(state).offset == summary_at  # type: ignore[union-attr]
    assert compaction_attempt(state, first, over=True) == 2
    assert compaction_attempt(state, first, over=False) == 1  # it fitted: the summary helped
    # Counting goes on from the summary's own attempt.
    log2, _, _ = _compacted(attempt=2)
    log2.add("user", "q2")
    first2 = log2.request()
    assert compaction_attempt(log2.state(), first2, over=True) == MAX_COMPACTION_ATTEMPTS + 1


def test_a_later_request_over_the_threshold_starts_counting_afresh() -> None:
    log, _, _ = _compacted(attempt=2)
    log.add("user", "q2")
    log.request()  # the first request after the cutoff: it fitted (never compacted)
    log.add("user", "q3")
    later = log.request()
    assert compaction_attempt(log.state(), later, over=True) == 1


def test_the_summary_records_its_attempt() -> None:
    log, cutoff, _ = _compacted(attempt=2)
    meta = log.state().history[0].compaction
    assert meta == CompactionMeta(replaces_history_through=cutoff, attempt=2)
    assert CompactionMeta(replaces_history_through=1).attempt == 1
    with pytest.raises(ValueError):
        CompactionMeta(replaces_history_through=1, attempt=0)
