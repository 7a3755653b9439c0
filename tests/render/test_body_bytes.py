"""Equal requests give equal bodies, equal to a fresh rendering byte for byte; the body check
still refuses what JSON cannot carry, naming the field."""

from __future__ import annotations

import hashlib
import math

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

import contextfold.render  # noqa: F401  (registers the built-in renderers)
from contextfold import wire
from contextfold.errors import RenderError
from contextfold.wire import TRANSPORTS, NeutralMessage, NeutralRequest, Transport

texts = st.text(max_size=60)
messages = st.lists(
    st.builds(NeutralMessage, role=st.sampled_from(["user", "assistant"]), content=texts),
    min_size=1,
    max_size=6,
).map(lambda found: (*found, NeutralMessage(role="user", content="end")))
temperatures = st.none() | st.sampled_from([0.0, -0.0, 1, 1.0, 0.5])
requests = st.builds(
    NeutralRequest,
    model=st.just("m"),
    system=texts,
    messages=messages,
    max_tokens=st.just(64),
    temperature=temperatures,
)


@given(requests, st.sampled_from(TRANSPORTS))
def test_an_equal_request_gives_the_fresh_bytes(
    request: NeutralRequest, transport: Transport
) -> None:
    first = wire.render_request(request, transport)
    again = NeutralRequest(
        model=request.model,
        system=request.system,
        messages=tuple(NeutralMessage(role=m.role, content=m.content) for m in request.messages),
        max_tokens=request.max_tokens,
        temperature=request.temperature,
    )
    assert wire.render_request(again, transport) == first
    assert wire.render_request(again, transport, previous=first) == first
    body = wire._encode(wire._RENDERERS[transport](request), transport)
    assert first.body == body
    assert first.sha256 == hashlib.sha256(body).hexdigest()


@pytest.mark.parametrize(("one", "other"), [(0.0, -0.0), (1, 1.0)])
def test_equal_temperatures_with_other_bytes_are_not_confused(one: float, other: float) -> None:
    def make(temperature: float) -> NeutralRequest:
        message = NeutralMessage(role="user", content="hi")
        return NeutralRequest(model="m", system="", messages=(message,), temperature=temperature)

    first = wire.render_request(make(one), "openai-chat").body
    second = wire.render_request(make(other), "openai-chat").body
    assert first != second
    assert second == wire._encode(wire._RENDERERS["openai-chat"](make(other)), "openai-chat")


def test_a_body_without_null_is_not_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    def walk(*args: object, **kwargs: object) -> None:
        raise AssertionError("the whole body was walked")

    monkeypatch.setattr(wire, "check_json_value", walk)
    assert wire._encode({"a": [1, 2.5, "text"], "b": {"c": True}}, "openai-chat") == (
        b'{"a":[1,2.5,"text"],"b":{"c":true}}'
    )


@given(st.sampled_from([math.nan, math.inf, -math.inf]))
def test_a_non_finite_float_is_refused_naming_its_field(value: float) -> None:
    with pytest.raises(RenderError, match=r"anthropic body\.messages\[1\]\.x"):
        wire._encode({"messages": [{"x": 1}, {"x": value}]}, "anthropic")


def test_a_body_with_null_text_is_still_sent() -> None:
    body = {"messages": [{"content": 'the tool said "null"'}], "n": None}
    assert wire._encode(body, "anthropic") == orjson.dumps(body)


def test_an_unencodable_value_is_refused_naming_its_field() -> None:
    with pytest.raises(RenderError, match=r"openai-chat body\.tools\[0\]: set"):
        wire._encode({"tools": [{1, 2}]}, "openai-chat")
