"""Files on context items: named in the item as iterate does (``[File attached: cat.png
(image/png)]``), images with data or a URL sent as each provider's image part, items
without files rendered exactly as before."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contextfold as cf
from contextfold.context import (
    Actor,
    ContextAdded,
    FileAttachment,
    LlmRequestRequested,
    RequestHeader,
    build_request,
    fold_context,
    item_headers,
    parse_item_header,
)
from contextfold.context.attachments import attachment_line, image_part
from contextfold.errors import RenderError
from contextfold.events import EventMeta
from contextfold.testing import envelope
from contextfold.wire import (
    TRANSPORTS,
    ImagePart,
    NeutralMessage,
    NeutralRequest,
    Transport,
    render_request,
)

PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n fake cat").decode()
CAT = FileAttachment(uri=f"data:image/png;base64,{PNG}", media_type="image/png", name="cat.png")
DOG = FileAttachment(uri="https://example.test/dog.jpg", media_type="image/jpeg", name="dog.jpg")
PDF = FileAttachment(uri="s3://bucket/report.pdf", media_type="application/pdf", name="r.pdf")


def _state(*items: ContextAdded, transport: Transport = "openai-chat") -> cf.AgentContextState:
    events = [
        *items,
        LlmRequestRequested(header=RequestHeader(transport=transport, model="m", max_tokens=64)),
    ]
    envelopes = [
        envelope(e, i, meta=EventMeta(event_id=f"e{i}", time="t", actor="agent"))
        for i, e in enumerate(events, start=1)
    ]
    return fold_context(envelopes)


def _messages(state: cf.AgentContextState) -> tuple[NeutralMessage, ...]:
    """The item messages of the state's request (its time tail left out)."""
    return build_request(state).messages[:-1]


def _user(content: str = "What is this?", *files: FileAttachment) -> ContextAdded:
    return ContextAdded(role="user", actor=Actor(type="user"), content=content, files=files)


def test_files_are_named_in_the_item_as_iterate_renders_them() -> None:
    [message] = _messages(_state(_user("Look.", CAT, PDF)))
    assert message.content == (
        '@1 actor=user files=["s3://bucket/report.pdf"]\n'
        "Look.\n"
        "[File attached: cat.png (image/png)]\n"
        "[File attached: r.pdf (application/pdf)]"
    )
    assert message.images == (ImagePart(media_type="image/png", data=PNG),)


def test_an_item_of_files_alone_names_them_after_its_header() -> None:
    [message] = _messages(_state(_user("", DOG)))
    assert message.content == (
        '@1 actor=user files=["https://example.test/dog.jpg"]\n'
        "[File attached: dog.jpg (image/jpeg)]"
    )


@pytest.mark.parametrize(
    ("file", "line"),
    [
        (FileAttachment(uri="file:///tmp/a.txt"), "[File attached: file:///tmp/a.txt]"),
        (
            FileAttachment(uri=f"data:image/gif;base64,{PNG}"),
            "[File attached: inline data (image/gif)]",
        ),
        (FileAttachment(uri="x", name="two\nlines]\u2028x"), "[File attached: two lines] x]"),
    ],
)
def test_every_file_gets_one_line(file: FileAttachment, line: str) -> None:
    assert attachment_line(file) == line


@pytest.mark.parametrize(
    "file",
    [
        PDF,
        FileAttachment(uri="s3://bucket/cat.png", media_type="image/png"),  # bytes out of reach
        FileAttachment(uri="https://example.test/x.svg", media_type="image/svg+xml"),
        FileAttachment(uri="https://example.test/cat.png"),  # no media type
        FileAttachment(uri="data:image/png,not-base64"),
        FileAttachment(uri="data:image/png;base64,not base64!"),
        FileAttachment(uri="data:image/tiff;base64,AAAA"),
    ],
)
def test_only_images_with_reachable_bytes_become_image_parts(file: FileAttachment) -> None:
    assert image_part(file) is None
    [message] = _messages(_state(_user("x", file)))
    assert message.images == ()


def test_images_go_out_only_on_user_messages() -> None:
    trusted = ContextAdded(role="developer", actor=Actor(type="agent"), content="a", files=(CAT,))
    webhook = ContextAdded(role="developer", actor=Actor(type="slack"), content="b", files=(CAT,))
    first, second = _messages(_state(trusted, webhook))
    assert (first.role, first.images) == ("developer", ())
    assert "[File attached: cat.png (image/png)]" in first.content
    assert (second.role, len(second.images)) == ("user", 1)  # downgraded: sent as user
    with pytest.raises(RenderError, match="only user"):
        NeutralMessage(role="assistant", content="x", images=second.images)


def test_an_image_part_has_one_source_of_a_type_every_provider_takes() -> None:
    with pytest.raises(RenderError, match="exactly one"):
        ImagePart(media_type="image/png")
    with pytest.raises(RenderError, match="exactly one"):
        ImagePart(media_type="image/png", data="AA==", url="https://x.test/a.png")
    with pytest.raises(RenderError, match="media_type"):
        ImagePart(media_type="image/bmp", data="AA==")


def _request() -> NeutralRequest:
    images = (
        ImagePart(media_type="image/png", data=PNG),
        ImagePart(media_type="image/jpeg", url=DOG.uri),
    )
    return NeutralRequest(
        model="m",
        system="S",
        messages=(
            NeutralMessage(role="user", content="@1\nLook.", images=images, cache_breakpoint=True),
        ),
        max_tokens=64,
    )


def test_openai_chat_sends_text_then_image_url_parts() -> None:
    body = render_request(_request(), "openai-chat").json()
    assert body["messages"][1] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "@1\nLook."},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
            {"type": "image_url", "image_url": {"url": DOG.uri}},
        ],
    }


def test_openai_responses_sends_input_text_then_input_image_parts() -> None:
    body = render_request(_request(), "openai-responses").json()
    assert body["input"] == [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "@1\nLook."},
                {
                    "type": "input_image",
                    "image_url": f"data:image/png;base64,{PNG}",
                    "detail": "auto",
                },
                {"type": "input_image", "image_url": DOG.uri, "detail": "auto"},
            ],
        }
    ]


def test_anthropic_sends_text_then_image_blocks_the_last_one_cached() -> None:
    body = render_request(_request(), "anthropic").json()
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "@1\nLook."},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                },
                {
                    "type": "image",
                    "source": {"type": "url", "url": DOG.uri},
                    "cache_control": {"type": "ephemeral"},
                },
            ],
        }
    ]


def _wire_texts(body: dict[str, Any], transport: Transport) -> list[str]:
    key = "input" if transport == "openai-responses" else "messages"
    texts: list[str] = []
    for message in body[key]:
        content = message.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(part["text"] for part in content if "text" in part)
    return texts


_NAMES = st.text(st.characters(codec="utf-8"), max_size=12)


@settings(max_examples=150)
@given(
    st.lists(
        st.tuples(
            st.text(max_size=30),
            st.lists(
                st.builds(
                    FileAttachment,
                    uri=st.sampled_from([CAT.uri, DOG.uri, PDF.uri, "file:///@1\n@2"]),
                    media_type=st.sampled_from([None, "image/png", "image/jpeg", "text/plain"]),
                    name=st.one_of(st.none(), _NAMES),
                ),
                max_size=3,
            ),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_attached_files_never_forge_a_header_on_any_wire(
    items: list[tuple[str, list[FileAttachment]]],
) -> None:
    state = _state(*(_user(content, *files) for content, files in items))
    request = build_request(state)
    assert [h.offset for h in item_headers(request)] == list(range(1, len(items) + 1))
    for transport in TRANSPORTS:
        body = json.loads(render_request(request, transport).body)
        found = [h for h in map(parse_item_header, _wire_texts(body, transport)) if h]
        assert [h.offset for h in found] == list(range(1, len(items) + 1)), transport


def test_items_without_files_render_exactly_as_before() -> None:
    state = _state(_user("plain"), ContextAdded(role="developer", content="dev"))
    request = build_request(state)
    assert [m.content for m in request.messages[:-1]] == ["@1 actor=user\nplain", "@2\ndev"]
    assert all(m.images == () for m in request.messages)
    body = render_request(request, "openai-chat").json()
    assert body["messages"][1] == {"role": "user", "content": "@1 actor=user\nplain"}
