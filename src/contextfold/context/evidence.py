"""Execution evidence by reference: long texts enter the model's context cut, and the whole
stays in the journal, read back through a ref (``stream@offset``).

- :func:`cut_text` keeps the head and tail of a text over a character limit, with a marker
  line between them saying how much was cut and where the whole text is.
- A tool output over the agent's limit (:func:`tool_result_events`) is recorded whole in
  its ``ToolCallResult`` and reaches the model cut, in an item whose ``refs`` name that
  result. An output over the journal's payload limit is stored in :class:`OutputChunk`
  events right before its result (whose content is then empty), all in the one append;
  one over :data:`MAX_OUTPUT_BYTES` is refused: the model reads an error result saying so.
- A context item over a request header's ``content_limit`` is cut when rendered (see
  ``request``): its own event is the whole record, ``@offset`` in its stream.
- :func:`read_ref` returns the whole text a ref names, byte for byte.

All but :func:`read_ref` are pure.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import orjson
from pydantic import Field

from ..errors import ConfigurationError, InvalidInputError, RefError
from ..events import Event, StoredEvent
from .events import ContextAdded, Ref, ToolCallResult, tool_result_item

__all__ = [
    "DEFAULT_CONTENT_LIMIT",
    "MAX_OUTPUT_BYTES",
    "MIN_CONTENT_LIMIT",
    "OutputChunk",
    "StoredOutput",
    "check_content_limit",
    "cut_text",
    "output_limit",
    "parse_ref",
    "read_ref",
    "tool_result_events",
]

DEFAULT_CONTENT_LIMIT = 30_000
"""The characters of one tool output or item the model sees by default (iterate's limit)."""
MIN_CONTENT_LIMIT = 1_000
"""The smallest content limit: room for a marker naming any stream, and some text."""
MAX_OUTPUT_BYTES = 64 * 1024 * 1024
"""The most one tool output may store in the journal (as JSON text); a larger one is refused."""

_ERROR_PREFIX = "error: "  # what tool_result_item puts before an error's text
_CHUNK_SLACK = 64  # bytes kept free in each chunk's payload beyond its measured overhead
_SURROGATE = re.compile("[\ud800-\udfff]")


class OutputChunk(Event, type="contextfold.agent/output-chunk", runtime_only=True):
    """One piece of a tool output too large for one event. The ``count`` pieces of an output
    are appended in order right before its ``ToolCallResult``, in the same append."""

    tool_call_id: str = Field(min_length=1)
    index: int = Field(ge=0)
    count: int = Field(ge=1)
    text: str


@dataclass(frozen=True, slots=True)
class StoredOutput:
    """The events one tool result is appended as, and the output text the model reads."""

    events: tuple[Event, ...]
    visible: str
    """The output as the model reads it (cut, or the refusal), without the error prefix."""
    is_error: bool
    ref: Ref | None = None
    """Where the whole output is, when the model reads it cut."""


def check_content_limit(limit: object) -> int:
    """Return ``limit`` or raise InvalidInputError: an int of at least
    :data:`MIN_CONTENT_LIMIT`."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < MIN_CONTENT_LIMIT:
        raise InvalidInputError(
            f"content_limit must be an int of at least {MIN_CONTENT_LIMIT} characters, "
            f"got {limit!r}"
        )
    return limit


def _marker(cut: int, total: int, what: str, where: str) -> str:
    return (
        f"\n[… {cut} characters cut here: the whole {what} ({total} characters) is "
        f"{where} in the journal …]\n"
    )


def cut_text(text: str, limit: int, *, what: str, where: str) -> str:
    """``text`` when it has at most ``limit`` characters, else its head and tail around a
    marker line naming the whole ``what`` and ``where`` it is. The result has at most
    ``limit`` characters (only the marker when the marker alone is longer)."""
    total = len(text)
    if total <= limit:
        return text
    # The marker's length with the largest cut it can state bounds its real length.
    budget = max(limit - len(_marker(total, total, what, where)), 0)
    head, tail = budget - budget // 2, budget // 2
    marker = _marker(total - budget, total, what, where)
    if budget == 0:
        return marker.strip("\n")
    return f"{text[:head]}{marker}{text[total - tail :] if tail else ''}"


def output_limit(limit: int, max_payload_bytes: int) -> int:
    """The characters of a tool output the model reads: ``limit``, lower when the journal's
    payload limit could not hold that many in one item (6 bytes a character at most)."""
    return max(min(limit, (max_payload_bytes - 4096) // 6), MIN_CONTENT_LIMIT)


def _json_size(value: object) -> int:
    return len(orjson.dumps(value))


def _pieces(text: str, budget: int) -> list[str] | None:
    """``text`` split in order into pieces of at most ``budget`` bytes as JSON string
    content; None when ``budget`` cannot hold one character."""
    if budget < 6:  # the longest JSON escape of one character (\\u001f)
        return None
    pieces: list[str] = []
    start = 0
    while start < len(text):
        size = min(len(text) - start, budget)  # one byte a character, the best case
        while True:
            piece = text[start : start + size]
            encoded = _json_size(piece) - 2
            if encoded <= budget:
                break
            size = max(min(size * budget // encoded, size - 1), 1)
        pieces.append(piece)
        start += size
    return pieces


def tool_result_events(
    result: ToolCallResult,
    *,
    stream: str,
    position: int | None,
    limit: int,
    max_payload_bytes: int,
    max_output_bytes: int = MAX_OUTPUT_BYTES,
) -> StoredOutput:
    """The events ``result`` is appended as, in one append whose first event lands at
    ``position`` (only needed when the output is cut: ``position`` None then raises
    ValueError). Lone surrogates, which no journal stores, become U+FFFD first.

    An output within ``limit`` characters (:func:`output_limit`) is ``[result, item]`` as
    always. A longer one is ``[result, item]`` with the item's content cut and a ref to the
    result, or, over the payload limit, ``[chunks…, result without content, item]``, or,
    over ``max_output_bytes``, an error result alone (nothing of the output is stored).
    """
    content = _SURROGATE.sub("\ufffd", result.content)
    if content != result.content:
        result = result.model_copy(update={"content": content})
    prefix = len(_ERROR_PREFIX) if result.is_error else 0
    keep = output_limit(limit, max_payload_bytes) - prefix
    if len(content) <= keep:
        return StoredOutput((result, tool_result_item(result)), content, result.is_error)
    if position is None:
        raise InvalidInputError("a cut tool output needs the position its append starts at")
    size = _json_size(content)
    if size > max_output_bytes:
        refusal = (
            f"the output of {result.name} was refused: {len(content)} characters ({size} "
            f"bytes as JSON) is over the {max_output_bytes} bytes one tool output may store "
            "in the journal; nothing of it was kept. Ask for less output (filter, page or "
            "summarize it)."
        )
        refused = result.model_copy(update={"content": refusal, "is_error": True})
        return StoredOutput((refused, tool_result_item(refused)), refusal, True)
    chunks: list[Event] = []
    if _json_size(result.model_dump(mode="json")) > max_payload_bytes:
        empty = OutputChunk(tool_call_id=result.tool_call_id, index=0, count=1, text="")
        budget = max_payload_bytes - _json_size(empty.model_dump(mode="json")) - _CHUNK_SLACK
        pieces = _pieces(content, budget)
        if pieces is None:
            raise ConfigurationError(
                f"max_payload_bytes {max_payload_bytes} cannot hold an output chunk of "
                f"tool call {result.tool_call_id!r}"
            )
        chunks = [
            OutputChunk(tool_call_id=result.tool_call_id, index=i, count=len(pieces), text=p)
            for i, p in enumerate(pieces)
        ]
    ref = Ref(path=stream, offset=position + len(chunks), event_type=ToolCallResult.event_type)
    visible = cut_text(content, keep, what="output", where=ref.render())
    recorded = result.model_copy(update={"content": ""}) if chunks else result
    shown = tool_result_item(result.model_copy(update={"content": visible}))
    item = shown.model_copy(update={"refs": (ref,)})
    return StoredOutput((*chunks, recorded, item), visible, result.is_error, ref)


def parse_ref(text: str) -> tuple[str, int]:
    """``stream@offset`` (as item headers render refs) as its stream and offset. The last
    ``@`` splits: stream names may hold ``@``. Raises RefError for anything else."""
    stream, at, offset = text.rpartition("@")
    if not at or not stream or not offset.isascii() or not offset.isdigit():
        raise RefError(
            f"ref {text[:120]!r} is not stream@offset (a stream name, '@' and a position, "
            "as item headers write refs)"
        )
    number = int(offset)
    if number < 1:
        raise RefError(f"ref {text[:120]!r}: positions start at 1")
    return stream, number


class _Reader(Protocol):
    """What :func:`read_ref` needs of a journal."""

    async def version(self, stream: str) -> int: ...

    def read_all(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[StoredEvent]: ...


def _joined(chunks: list[StoredEvent], result: ToolCallResult, offset: int) -> str | None:
    """The output stored in ``chunks`` (the chunk events right before the result at
    ``offset``), or None when they are no complete run of its pieces."""
    if not chunks or chunks[-1].position != offset - 1:
        return None
    last = chunks[-1].decode(OutputChunk)
    assert isinstance(last, OutputChunk)
    count = last.count
    run = chunks[-count:]
    if len(run) != count or run[0].position != offset - count:
        return None
    texts: list[str] = []
    for index, stored in enumerate(run):
        chunk = stored.decode(OutputChunk)
        assert isinstance(chunk, OutputChunk)
        if (chunk.tool_call_id, chunk.index, chunk.count) != (result.tool_call_id, index, count):
            return None
        texts.append(chunk.text)
    return "".join(texts)


async def read_ref(journal: _Reader, stream: str, offset: int) -> str:
    """The whole text at ``stream@offset``: a tool output (its chunks joined) or a context
    item's content, exactly as recorded.

    Raises RefError when the stream has no such position or the event there holds neither.
    """
    version = await journal.version(stream)
    if not 1 <= offset <= version:
        held = f"positions 1 to {version}" if version else "no events"
        raise RefError(
            f"ref {stream}@{offset}: stream {stream!r} has {held}; pass the position of a tool "
            "result or a context item"
        )
    chunks: list[StoredEvent] = []  # the run of chunk events just before, still undecoded
    async for stored in journal.read_all(stream):
        if stored.position < offset:
            if stored.type == OutputChunk.event_type:
                chunks.append(stored)
            else:
                chunks.clear()
            continue
        if stored.type == ToolCallResult.event_type:
            result = stored.decode(ToolCallResult)
            assert isinstance(result, ToolCallResult)
            joined = _joined(chunks, result, offset) if not result.content else None
            return result.content if joined is None else joined
        if stored.type == ContextAdded.event_type:
            item = stored.decode(ContextAdded)
            assert isinstance(item, ContextAdded)
            return item.content
        raise RefError(
            f"ref {stream}@{offset} names a {stored.type} event, which holds no output; "
            "a ref reads a tool result or a context item"
        )
    raise RefError(f"ref {stream}@{offset}: the position was not found in the stream")
