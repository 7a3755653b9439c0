"""Bodies assembled from what is new since a previous body equal bodies rendered from nothing,
byte for byte, for any sequence of requests (growing histories, broken pairing, calls
answered late or never, repeated ids, other requests in between); broken requests raise the
plain path's error; a request extending the previous one serializes only its new messages."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold.render  # noqa: F401  (registers the built-in renderers)
from contextfold import wire
from contextfold.errors import RenderError
from contextfold.render import assembly, openai_chat, openai_responses
from contextfold.render.pairing import order_tool_results
from contextfold.wire import (
    ImagePart,
    NeutralMessage,
    NeutralRequest,
    RenderedRequest,
    ToolCall,
    Transport,
)

TRANSPORTS: tuple[Transport, ...] = ("openai-chat", "openai-responses")
IMAGE = ImagePart(media_type="image/png", url="https://example.com/cat.png")


def plain(request: NeutralRequest, transport: Transport) -> bytes:
    """The body as the renderers built it before assembly: every message, every time."""
    ordered = order_tool_results(request.messages)
    body = wire._RENDERERS[transport](request)
    if transport == "openai-chat":
        lead = [{"role": "system", "content": request.system}] if request.system else []
        body["messages"] = [*lead, *(openai_chat._message(m) for m in ordered)]
    else:
        body["input"] = [item for m in ordered for item in openai_responses._items(m)]
    return orjson.dumps(body)


def outcome(render: Any, request: NeutralRequest, transport: Transport) -> bytes | int | str:
    try:
        done = render(request, transport)
        return done if isinstance(done, int) else bytes(done)
    except RenderError as exc:
        return f"RenderError: {exc}"


class _After:
    """Renders each request with the one rendered before it as ``previous``."""

    def __init__(self) -> None:
        self.previous: RenderedRequest | None = None

    def __call__(self, request: NeutralRequest, transport: Transport) -> bytes:
        self.previous = wire.render_request(request, transport, previous=self.previous)
        return self.previous.body


def _sized(request: NeutralRequest, transport: Transport) -> int:
    return wire.body_size(request, transport)


def _plain_size(request: NeutralRequest, transport: Transport) -> int:
    return len(plain(request, transport))


message = st.one_of(
    st.builds(
        NeutralMessage,
        role=st.sampled_from(["user", "developer", "system"]),
        content=st.text(max_size=20),
        cache_breakpoint=st.booleans(),
    ),
    st.builds(
        lambda text, ids: NeutralMessage(
            role="assistant", content=text, tool_calls=tuple(ToolCall(id=i, name="t") for i in ids)
        ),
        st.text(max_size=10),
        st.lists(st.sampled_from(["a", "b", "c", "d"]), max_size=2),
    ),
    st.builds(
        lambda call_id, text: NeutralMessage(role="tool", content=text, tool_call_id=call_id),
        st.sampled_from(["a", "b", "c", "d", "zz"]),
        st.text(max_size=10),
    ),
    st.just(NeutralMessage(role="user", content="look", images=(IMAGE,))),
)


@settings(max_examples=300, deadline=None)
@given(
    history=st.lists(message, max_size=24),
    cuts=st.lists(st.integers(min_value=0, max_value=24), min_size=1, max_size=6),
    other=st.lists(message, max_size=6),
    transport=st.sampled_from(TRANSPORTS),
)
def test_assembled_bodies_equal_bodies_rendered_from_nothing(
    history: list[NeutralMessage],
    cuts: list[int],
    other: list[NeutralMessage],
    transport: Transport,
) -> None:
    head = NeutralMessage(role="system", content="prompt")
    after = _After()
    for n, cut in enumerate(sorted(cuts)):
        tail = NeutralMessage(role="user", content=f"time {n}", cache_breakpoint=True)
        messages = (head, *history[:cut], tail)
        request = NeutralRequest(model="m", system="protocol", messages=messages, max_tokens=9)
        expected = outcome(plain, request, transport)
        assert outcome(wire.render_body, request, transport) == expected
        assert outcome(after, request, transport) == expected
        assert outcome(_sized, request, transport) == outcome(_plain_size, request, transport)
        # Another request in between (its system text differs: the lead is never reused).
        unrelated = NeutralRequest(model="m", system="", messages=(head, *other, tail))
        expected = outcome(plain, unrelated, transport)
        assert outcome(wire.render_body, unrelated, transport) == expected
        assert outcome(after, unrelated, transport) == expected


def _conversation(turns: int) -> tuple[NeutralMessage, ...]:
    found: list[NeutralMessage] = [NeutralMessage(role="system", content="prompt")]
    for n in range(turns):
        found.append(NeutralMessage(role="user", content=f"question {n}"))
        calls = (ToolCall(id=f"c{n}", name="read", arguments='{"path": "a"}'),)
        found.append(NeutralMessage(role="assistant", content="", tool_calls=calls))
        found.append(NeutralMessage(role="tool", content="x" * 100, tool_call_id=f"c{n}"))
        found.append(NeutralMessage(role="assistant", content=f"answer {n}"))
    return tuple(found)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_longer_request_serializes_only_its_new_messages(
    transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    history = _conversation(40)
    tail = NeutralMessage(role="user", content="now", cache_breakpoint=True)
    first = NeutralRequest(model="m", system="protocol", messages=(*history, tail))
    previous = wire.render_request(first, transport)
    encoded: list[NeutralMessage] = []
    module = openai_chat if transport == "openai-chat" else openai_responses
    units: assembly.Encode = module._units

    def counting(message: NeutralMessage) -> tuple[bytes, ...]:
        encoded.append(message)
        return units(message)

    monkeypatch.setattr(module, "_units", counting)
    more = NeutralMessage(role="user", content="one more")
    second = NeutralRequest(model="m", system="protocol", messages=(*history, more, tail))
    body = wire.render_request(second, transport, previous=previous).body
    assert encoded == [more, tail]  # the 161 messages before were serialized once, before
    assert body == plain(second, transport)
    encoded.clear()
    assert wire.render_request(second, transport).body == body  # without previous: all
    assert len(encoded) == len(second.messages)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_previous_body_of_another_transport_is_not_read(transport: Transport) -> None:
    first = NeutralRequest(model="m", system="protocol", messages=_conversation(3))
    other: Transport = "openai-responses" if transport == "openai-chat" else "openai-chat"
    elsewhere = wire.render_request(first, other)
    assert wire.render_request(first, transport, previous=elsewhere).body == plain(first, transport)


def test_what_a_renderer_serialized_is_not_scanned_again(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    dumps = json.dumps

    def spy(value: object, **kwargs: Any) -> str:
        calls.append(value)
        return str(dumps(value, **kwargs))

    monkeypatch.setattr(json, "dumps", spy)
    said = NeutralMessage(role="tool", content="the tool said null", tool_call_id="a")
    call = NeutralMessage(role="assistant", content="", tool_calls=(ToolCall(id="a", name="t"),))
    request = NeutralRequest(model="m", system="", messages=(call, said))
    body = wire.render_body(request, "openai-chat")
    assert b"null" in body and calls == []  # the null in the messages is theirs: no check
    with pytest.raises(RenderError, match=r"openai-chat body\.x: nan"):
        wire._encode({"x": float("nan"), "messages": wire.JsonArray((), 2)}, "openai-chat")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_body_is_measured_without_writing_its_messages(
    transport: Transport, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = NeutralRequest(model="m", system="protocol", messages=_conversation(20))
    size = len(wire.render_body(request, transport))

    def unwritten(value: object) -> None:
        raise AssertionError("the assembled messages were written")

    monkeypatch.setattr(wire, "_elements", unwritten)
    assert wire.body_size(request, transport) == size


class _Unwalked(dict[str, int]):
    """A kept assembly's calls that must not be walked one by one (copying is fine)."""

    def items(self) -> Any:
        raise AssertionError("the calls of the earlier request were walked")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_request_extending_the_previous_one_does_not_walk_its_calls(
    transport: Transport,
) -> None:
    history = _conversation(30)
    first = NeutralRequest(model="m", system="protocol", messages=history)
    previous = wire.render_request(first, transport)
    written = previous._written
    assert written is not None and isinstance(written.kept, assembly._Kept)
    assert len(written.kept.call_at) == 30
    unwalked = dataclasses.replace(written.kept, call_at=_Unwalked(written.kept.call_at))
    object.__setattr__(previous, "_written", dataclasses.replace(written, kept=unwalked))
    more = NeutralMessage(role="user", content="one more")
    second = NeutralRequest(model="m", system="protocol", messages=(*history, more))
    assert wire.render_request(second, transport, previous=previous).body == plain(
        second, transport
    )
    # A request sharing less than the whole earlier one still drops the calls after it.
    shorter = NeutralRequest(model="m", system="protocol", messages=(*history[:-8], more))
    assert wire.render_request(shorter, transport, previous=previous).body == plain(
        shorter, transport
    )
