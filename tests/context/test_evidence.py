"""Execution evidence by reference: long texts reach the model cut, around a marker naming
where the whole is, and the whole stays in the journal, read back through its ref byte for
byte: a tool output in its result or in chunks before it, a context item in its own event."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.context import (
    ContextAdded,
    RequestHeader,
    ToolCallResult,
    build_request,
    tool_result_item,
)
from contextfold.context.evidence import (
    MIN_CONTENT_LIMIT,
    OutputChunk,
    check_content_limit,
    cut_text,
    parse_ref,
    read_ref,
    tool_result_events,
)
from contextfold.errors import InvalidInputError, PayloadError, RefError
from tests.context.helpers import HEADER, Log

STREAM = "agents/evidence"
WHERE = f"{STREAM}@7"


def _result(content: str, *, is_error: bool = False) -> ToolCallResult:
    return ToolCallResult(tool_call_id="call_1", name="dump", content=content, is_error=is_error)


@pytest.fixture(params=["memory", "sqlite"])
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[cf.Journal]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 'j.db'}"
    async with cf.open_journal(url, max_payload_bytes=4096) as opened:
        yield opened


# -- cutting ----------------------------------------------------------------------------------


def test_a_text_within_the_limit_is_left_as_it_is() -> None:
    text = "x" * MIN_CONTENT_LIMIT
    assert cut_text(text, MIN_CONTENT_LIMIT, what="output", where=WHERE) is text


def test_a_longer_text_keeps_its_head_and_tail_around_a_marker_naming_the_whole() -> None:
    text = "".join(f"line {i}\n" for i in range(10_000))
    cut = cut_text(text, 2_000, what="output", where=WHERE)
    assert len(cut) <= 2_000
    head, rest = cut.split("\n[… ", 1)
    marker, tail = rest.split(" …]\n", 1)
    assert text.startswith(head) and text.endswith(tail) and head and tail
    assert f"({len(text)} characters) is {WHERE} in the journal" in marker
    assert marker.startswith(f"{len(text) - len(head) - len(tail)} characters cut here")


@settings(max_examples=200)
@given(st.text(max_size=3_000), st.integers(MIN_CONTENT_LIMIT, 2_500))
def test_a_cut_never_exceeds_its_limit_and_keeps_both_ends(text: str, limit: int) -> None:
    cut = cut_text(text, limit, what="content", where="@12")
    assert len(cut) <= limit
    if len(text) <= limit:
        assert cut == text
    else:
        assert "is @12 in the journal" in cut
        head = cut.split("\n[… ", 1)[0]
        tail = cut.rsplit(" …]\n", 1)[1]
        assert text.startswith(head) and text.endswith(tail)
        assert len(head) + len(tail) >= limit - 200  # the marker takes little room


def test_a_content_limit_below_the_minimum_is_refused() -> None:
    for bad in (10, MIN_CONTENT_LIMIT - 1, True, 1.5e4, "30000"):
        with pytest.raises(InvalidInputError, match="content_limit"):
            check_content_limit(bad)
    assert check_content_limit(MIN_CONTENT_LIMIT) == MIN_CONTENT_LIMIT


# -- tool results as events -------------------------------------------------------------------


def test_an_output_within_the_limit_is_appended_as_always() -> None:
    result = _result("small")
    stored = tool_result_events(
        result, stream=STREAM, position=None, limit=30_000, max_payload_bytes=4 << 20
    )
    assert stored.events == (result, tool_result_item(result))
    assert (stored.visible, stored.ref) == ("small", None)


def test_a_long_output_is_kept_whole_in_its_result_and_cut_in_its_item() -> None:
    output = "ab" * 40_000
    stored = tool_result_events(
        _result(output), stream=STREAM, position=5, limit=30_000, max_payload_bytes=4 << 20
    )
    result, item = stored.events
    assert isinstance(result, ToolCallResult) and result.content == output
    assert isinstance(item, ContextAdded) and item.tool_call_id == "call_1"
    assert item.refs == (cf.Ref(path=STREAM, offset=5, event_type=ToolCallResult.event_type),)
    assert item.content == stored.visible and len(item.content) <= 30_000
    assert f"is {STREAM}@5 in the journal" in item.content


def test_an_error_output_is_cut_with_its_prefix_within_the_limit() -> None:
    stored = tool_result_events(
        _result("E" * 50_000, is_error=True),
        stream=STREAM,
        position=3,
        limit=MIN_CONTENT_LIMIT,
        max_payload_bytes=4 << 20,
    )
    item = stored.events[-1]
    assert isinstance(item, ContextAdded)
    assert item.content.startswith("error: E") and len(item.content) <= MIN_CONTENT_LIMIT
    assert stored.is_error


def test_an_output_over_the_payload_limit_is_stored_in_chunks_before_its_result() -> None:
    output = 'é\x01"\\ unicode ✓ 𝄞 ' * 2_000  # escapes and multibyte characters
    stored = tool_result_events(
        _result(output), stream=STREAM, position=10, limit=MIN_CONTENT_LIMIT, max_payload_bytes=4096
    )
    *chunks, result, item = stored.events
    assert len(chunks) > 2 and all(isinstance(c, OutputChunk) for c in chunks)
    assert [c.index for c in chunks if isinstance(c, OutputChunk)] == list(range(len(chunks)))
    assert "".join(c.text for c in chunks if isinstance(c, OutputChunk)) == output
    for event in stored.events:
        assert len(orjson.dumps(event.model_dump(mode="json"))) <= 4096
    assert isinstance(result, ToolCallResult) and result.content == ""
    assert isinstance(item, ContextAdded)
    assert item.refs[0].offset == 10 + len(chunks)  # the result, after the chunks


def test_an_output_over_the_storable_size_is_refused_as_an_error_the_model_reads() -> None:
    stored = tool_result_events(
        _result("z" * 100_000),
        stream=STREAM,
        position=1,
        limit=MIN_CONTENT_LIMIT,
        max_payload_bytes=4096,
        max_output_bytes=50_000,
    )
    result, item = stored.events
    assert isinstance(result, ToolCallResult) and result.is_error
    assert "over the 50000 bytes one tool output may store" in result.content
    assert isinstance(item, ContextAdded) and item.content == f"error: {result.content}"
    assert item.refs == () and stored.ref is None


def test_a_lone_surrogate_which_no_journal_stores_becomes_a_replacement_character() -> None:
    stored = tool_result_events(
        _result("a\ud800b"), stream=STREAM, position=None, limit=30_000, max_payload_bytes=4096
    )
    result = stored.events[0]
    assert isinstance(result, ToolCallResult) and result.content == "a\ufffdb"


def test_a_cut_output_without_its_position_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="position"):
        tool_result_events(
            _result("q" * 5_000),
            stream=STREAM,
            position=None,
            limit=MIN_CONTENT_LIMIT,
            max_payload_bytes=4 << 20,
        )


# -- reading refs back --------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(st.text(min_size=1, max_size=12_000))
async def test_any_output_reads_back_exactly_through_its_ref(output: str) -> None:
    async with cf.open_journal("memory://", max_payload_bytes=2048) as journal:
        await journal.append(STREAM, ContextAdded(role="user", content="go"))
        version = await journal.version(STREAM)
        stored = tool_result_events(
            _result(output),
            stream=STREAM,
            position=version + 1,
            limit=MIN_CONTENT_LIMIT,
            max_payload_bytes=2048,
        )
        await journal.append(STREAM, stored.events, expected_version=version, actor="tool")
        expected = "".join("\ufffd" if "\ud800" <= c <= "\udfff" else c for c in output)
        if stored.ref is None:
            assert stored.visible == expected
        else:
            assert stored.ref.offset is not None
            assert await read_ref(journal, STREAM, stored.ref.offset) == expected


async def test_a_chunked_output_reads_back_from_a_real_journal(journal: cf.Journal) -> None:
    output = "".join(f"{i:05d} ✓\n" for i in range(3_000))
    with pytest.raises(PayloadError):  # as one event, the journal refuses it
        await journal.append(STREAM, _result(output))
    await journal.append(STREAM, ContextAdded(role="user", content="before"))
    stored = tool_result_events(
        _result(output), stream=STREAM, position=2, limit=MIN_CONTENT_LIMIT, max_payload_bytes=4096
    )
    await journal.append(STREAM, stored.events, expected_version=1, actor="tool")
    assert stored.ref is not None and stored.ref.offset is not None
    assert await read_ref(journal, STREAM, stored.ref.offset) == output
    item_offset = stored.ref.offset + 1
    assert await read_ref(journal, STREAM, item_offset) == stored.visible
    assert await read_ref(journal, STREAM, 1) == "before"


async def test_a_ref_to_nothing_readable_is_a_clear_error(journal: cf.Journal) -> None:
    await journal.append(STREAM, [ContextAdded(role="user", content="hi")])
    await journal.append(STREAM, cf.LlmRequestRequested(header=HEADER))
    with pytest.raises(RefError, match=r"agents/evidence@3: stream 'agents/evidence' has "):
        await read_ref(journal, STREAM, 3)
    with pytest.raises(RefError, match=r"names a contextfold\.agent/llm-request-requested event"):
        await read_ref(journal, STREAM, 2)
    with pytest.raises(RefError, match="has no events"):
        await read_ref(journal, "agents/none", 1)


def test_refs_parse_as_item_headers_write_them() -> None:
    assert parse_ref("agents/a@b@12") == ("agents/a@b", 12)
    assert parse_ref(cf.Ref(path="s", offset=3).render()) == ("s", 3)
    for bad in ("s", "s@", "@3", "s@x", "s@0", "s@-1", "s@١"):
        with pytest.raises(RefError, match="ref"):
            parse_ref(bad)


# -- long context items, cut when rendered ----------------------------------------------------


def test_an_item_over_the_headers_content_limit_is_cut_around_its_own_offset() -> None:
    log = Log()
    body = "webhook " * 10_000
    offset = log.add("user", body, actor=cf.Actor(type="github"))
    log.request(HEADER.model_copy(update={"content_limit": 5_000}))
    [message] = build_request(log.state()).messages[:1]
    header, content = message.content.split("\n", 1)
    assert header == f"@{offset} actor=github"
    assert len(content) <= 5_000
    assert f"({len(body)} characters) is @{offset} in the journal" in content
    assert body.startswith(content.split("\n[… ", 1)[0])


def test_without_a_content_limit_an_item_renders_whole_as_before() -> None:
    log = Log()
    body = "webhook " * 10_000
    log.add("user", body)
    log.request()
    assert build_request(log.state()).messages[0].content == f"@1\n{body}"


def test_a_header_without_a_content_limit_is_stored_as_before() -> None:
    assert "content_limit" not in HEADER.model_dump(mode="json")
    limited = HEADER.model_copy(update={"content_limit": 30_000})
    assert limited.model_dump(mode="json")["content_limit"] == 30_000
    assert RequestHeader.model_validate(limited.model_dump(mode="json")) == limited
