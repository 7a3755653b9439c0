"""A rendered request kept for the next one holds about its body: what the renderer keeps
to assemble the next request points into that body, it holds no copy of the serialized
messages; a long content is written in pieces, so writing it never reserves many times its
size, and gives the bytes writing it whole gives."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

import contextfold.render  # noqa: F401  (registers the built-in renderers)
from contextfold import wire
from contextfold.render import assembly
from contextfold.wire import ImagePart, NeutralMessage, NeutralRequest, ToolCall, Transport

from .test_assembly import plain

SIZE = 256 * 1024


def _held(make: Callable[[], object]) -> tuple[int, object]:
    """Bytes still allocated by ``make()`` while its value is held, and the value."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        value = make()
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, value
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("transport", ["openai-chat", "openai-responses"])
def test_a_rendered_request_holds_about_its_body(transport: Transport) -> None:
    messages = (
        NeutralMessage(role="user", content=f"kept by {transport}"),
        NeutralMessage(role="user", content="x" * SIZE),
        NeutralMessage(role="user", content="end"),
    )
    request = NeutralRequest(model="m", system="protocol", messages=messages)
    body, written = _held(lambda: wire.render_body(request, transport))
    held, rendered = _held(lambda: wire.render_request(request, transport))
    assert isinstance(rendered, wire.RenderedRequest) and rendered.body == written
    assert rendered._written is not None  # kept for the next request
    # The body as orjson allocated it, and small change: the long message once.
    assert held - body < SIZE // 8, (held, body)


def _peak_writing(request: NeutralRequest, transport: Transport) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        body = wire.render_body(request, transport)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert body == plain(request, transport)
    return peak


@pytest.mark.parametrize("transport", ["openai-chat", "openai-responses"])
def test_writing_a_long_content_reserves_a_few_times_its_size(transport: Transport) -> None:
    size = 1024 * 1024
    messages = (
        NeutralMessage(role="user", content=f"long for {transport}"),
        NeutralMessage(role="user", content="é" * (size // 2)),  # 1 MiB as UTF-8
        NeutralMessage(role="user", content="end"),
    )
    # Whole, orjson reserved about 16 bytes per character: 8 MiB here.
    assert _peak_writing(NeutralRequest(model="m", system="", messages=messages), transport) < (
        5 * size
    )


long_texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=40)


@given(
    texts=st.lists(long_texts, min_size=1, max_size=4),
    transport=st.sampled_from(["openai-chat", "openai-responses"]),
)
def test_a_content_written_in_pieces_is_the_content_written_whole(
    texts: list[str], transport: Transport
) -> None:
    image = ImagePart(media_type="image/png", data="aGk=")
    call = ToolCall(id="c1", name="read", arguments='{"a": "\u0000 é"}')
    messages: list[NeutralMessage] = [NeutralMessage(role="user", content="first")]
    for text in texts:
        messages.append(NeutralMessage(role="user", content=text))
        messages.append(NeutralMessage(role="user", content=text, images=(image,)))
    messages.append(NeutralMessage(role="assistant", content=texts[0], tool_calls=(call,)))
    messages.append(NeutralMessage(role="tool", content=texts[-1], tool_call_id="c1"))
    request = NeutralRequest(model="m", system="s", messages=tuple(messages))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(assembly, "_PIECE", 3)  # every text of over 3 characters in pieces
        assert wire.render_body(request, transport) == plain(request, transport)
