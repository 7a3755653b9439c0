"""An assembly kept for the next request holds its serialized messages at their size: the
bytes orjson reserved while writing them (many times a long text) are not kept with them."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

import contextfold.render  # noqa: F401  (registers the built-in renderers)
from contextfold import wire
from contextfold.render import assembly
from contextfold.wire import NeutralMessage, NeutralRequest, Transport

SIZE = 256 * 1024


@pytest.mark.parametrize("transport", ["openai-chat", "openai-responses"])
def test_a_kept_assembly_holds_about_its_bytes(transport: Transport) -> None:
    messages = (
        NeutralMessage(role="user", content=f"kept by {transport}"),
        NeutralMessage(role="user", content="x" * SIZE),
        NeutralMessage(role="user", content="end"),
    )
    request = NeutralRequest(model="m", system="protocol", messages=messages)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        body = wire.render_body(request, transport)
        assert len(body) > SIZE
        del body
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert (transport, messages[0], messages[1]) in assembly._RECENT
    # The long message's one serialized copy, and small change; orjson reserved ~16x.
    assert held < 2 * SIZE, held
