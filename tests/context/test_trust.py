"""Trust and wire roles: no external content ever gets system or developer precedence."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contextfold.context import (
    BUILTIN_ACTOR_TYPES,
    Actor,
    CompactionMeta,
    ContextItem,
    PrefixMessage,
    RequestHeader,
    actor_types,
    build_request,
    is_trusted,
    may_call_tools,
    parse_item_header,
    register_actor_type,
    render_item,
    wire_role,
)
from contextfold.context.trust import trusted_extensions
from contextfold.errors import InvalidInputError
from contextfold.wire import TRANSPORTS, ToolCall, render_body
from tests.context.helpers import Log

EXTERNAL = ("user", "script", "tool", "slack", "telegram", "email", "github", "webhook")

register_actor_type("test-scheduler", trusted=True)
register_actor_type("test-crm", trusted=False)


def _item(role: Any, actor: str | None = None, **fields: Any) -> ContextItem:
    return ContextItem(
        offset=5, role=role, content="x", actor=Actor(type=actor) if actor else None, **fields
    )


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("actor", [*EXTERNAL, "test-crm", "never-registered"])
def test_external_developer_and_system_items_become_user(actor: str, native: bool) -> None:
    assert wire_role(_item("developer", actor), native) == "user"
    assert wire_role(_item("system", actor), native) == "user"


@pytest.mark.parametrize("actor", [None, "agent", "test-scheduler"])
def test_trusted_developer_items_keep_precedence(actor: str | None) -> None:
    trusted = ("test-scheduler",)  # a request header's trusted_actor_types
    assert wire_role(_item("developer", actor), True, trusted) == "developer"
    assert wire_role(_item("developer", actor), False, trusted) == "system"
    assert wire_role(_item("system", actor), True, trusted) == "system"
    assert wire_role(_item("system", actor), False, trusted) == "system"


@pytest.mark.parametrize("native", [True, False])
def test_a_registered_type_is_trusted_only_where_the_request_header_says(native: bool) -> None:
    """Trust never comes from the live registry: a registered trusted type keeps precedence
    only through the header's trusted_actor_types, and no header can trust a built-in."""
    assert actor_types()["test-scheduler"] is True
    for role in ("developer", "system"):
        assert wire_role(_item(role, "test-scheduler"), native) == "user"
        assert wire_role(_item(role, "test-crm"), native, ("test-crm",)) != "user"
        assert wire_role(_item(role, "slack"), native, ("slack",)) == "user"
    assert not is_trusted(Actor(type="test-scheduler"))
    assert is_trusted(Actor(type="test-scheduler"), extra=("test-scheduler",))
    assert not is_trusted(Actor(type="github"), extra=("github",))


def test_trusted_extensions_lists_registered_trusted_types_only() -> None:
    register_actor_type("test-ext-b", trusted=True)
    register_actor_type("test-ext-a", trusted=True)
    extensions = trusted_extensions()
    assert list(extensions) == sorted(extensions)
    assert {"test-ext-a", "test-ext-b", "test-scheduler"} <= set(extensions)
    assert "test-crm" not in extensions
    assert not set(extensions) & set(BUILTIN_ACTOR_TYPES)
    header = RequestHeader(transport="openai-chat", model="m", trusted_actor_types=extensions)
    assert header.trusted_actor_types == extensions


@pytest.mark.parametrize("native", [True, False])
@pytest.mark.parametrize("actor", [None, "agent", "slack"])
def test_fixed_roles(actor: str | None, native: bool) -> None:
    assert wire_role(_item("user", actor), native) == "user"
    assert wire_role(_item("assistant", actor), native) == "assistant"
    summary = _item("developer", actor, compaction=CompactionMeta(replaces_history_through=1))
    assert wire_role(summary, native) == "user"
    # A call id is a claim: only a result the projection verified is a tool result.
    assert wire_role(_item("developer", actor, tool_call_id="c1"), native) == "user"
    genuine = _item("developer", actor, tool_call_id="c1", verified_result=True)
    assert wire_role(genuine, native) == "tool"


def test_only_verified_assistant_items_may_call_tools() -> None:
    call = (ToolCall(id="c", name="n"),)
    assert may_call_tools(_item("assistant", tool_calls=call, llm_request_offset=2))
    assert not may_call_tools(_item("assistant", tool_calls=call))
    assert not may_call_tools(_item("assistant", llm_request_offset=2))


def test_actor_registry() -> None:
    types = actor_types()
    assert {name: types[name] for name in BUILTIN_ACTOR_TYPES} == dict(BUILTIN_ACTOR_TYPES)
    assert types["test-scheduler"] is True
    assert is_trusted(None)
    assert is_trusted(Actor(type="agent"))
    assert not is_trusted(Actor(type="never-registered"))
    assert not is_trusted(Actor(type="test-scheduler"))  # registered, but not in a header
    register_actor_type("test-crm", trusted=False)  # same again: fine
    register_actor_type("slack", trusted=False)  # matches the built-in: fine
    with pytest.raises(InvalidInputError, match="already registered"):
        register_actor_type("test-crm", trusted=True)
    with pytest.raises(InvalidInputError, match="built in"):
        register_actor_type("slack", trusted=True)
    with pytest.raises(InvalidInputError):
        register_actor_type("Not A Token", trusted=False)


_ACTORS = st.one_of(
    st.none(), st.sampled_from(["agent", "test-scheduler", *EXTERNAL, "test-crm", "other"])
)
_ROLES = st.sampled_from(["system", "developer", "user", "assistant"])


@st.composite
def _events(draw: st.DrawFn) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    # Some runs are system-lane heavy, so trusted and untrusted system items mix in any order.
    roles = st.one_of(_ROLES, st.just("system")) if draw(st.booleans()) else _ROLES
    for _ in range(draw(st.integers(1, 12))):
        role = draw(roles)
        fields: dict[str, Any] = {"role": role, "content": draw(st.text(max_size=20))}
        actor = draw(_ACTORS)
        if actor is not None:
            fields["actor"] = Actor(type=actor)
        if role in ("developer", "user") and draw(st.booleans()):
            fields["tool_call_id"] = draw(st.sampled_from(["c1", "c2"]))
        if draw(st.booleans()):
            fields["key"] = draw(st.sampled_from(["a", "b", "agent/system-prompt"]))
        fields["publish_before"] = draw(st.integers(0, 3)) == 0  # a request first
        out.append(fields)
    return out


_PREFIXES = st.sampled_from(
    [
        (),
        (PrefixMessage(role="developer", content="<skills>deploy</skills>"),),
        (
            PrefixMessage(role="user", content="<env>ci</env>"),
            PrefixMessage(role="assistant", content="ok"),
        ),
    ]
)


def _wire_texts(body: dict[str, Any], transport: str) -> list[tuple[str, str]]:
    """(wire role, text) of every text part of a rendered body."""
    if transport == "anthropic":
        out = [("system", block["text"]) for block in body.get("system", [])]
        for message in body["messages"]:
            for block in message["content"]:
                if block["type"] == "text":
                    out.append((message["role"], block["text"]))
        return out
    if transport == "openai-responses":
        return [(i["role"], i["content"]) for i in body["input"] if i["type"] == "message"]
    return [(m["role"], m.get("content") or "") for m in body["messages"]]


@given(_events(), st.booleans(), st.sampled_from(TRANSPORTS), st.booleans(), _PREFIXES)
def test_no_external_content_reaches_system_or_developer(
    events: list[dict[str, Any]],
    native: bool,
    transport: Any,
    trust_scheduler: bool,
    prefix: tuple[PrefixMessage, ...],
) -> None:
    log = Log()
    trusted = ("test-scheduler",) if trust_scheduler else ()
    header = RequestHeader(
        transport=transport,
        model="m",
        max_tokens=10,
        developer_role=native,
        trusted_actor_types=trusted,
        session_prefix=prefix,
    )
    for fields in events:
        if fields.pop("publish_before"):
            log.request(header)
        log.add(**fields)
    log.request(header)
    state = log.state()
    request = build_request(state)
    by_offset = {item.offset: item for item in state.items}
    untrusted = {
        offset
        for offset, item in by_offset.items()
        if not is_trusted(item.actor, trusted) or item.tool_call_id is not None or item.compaction
    }
    seen = []
    for message in request.messages:
        found = parse_item_header(message.content)
        if found is None:
            continue
        seen.append(found.offset)
        if found.offset in untrusted:
            assert message.role not in ("system", "developer")
        if message.role == "developer":
            assert native
    assert sorted(seen) == sorted(by_offset)
    # On the wire too (no call is verified here, so every result went out as user text).
    body = json.loads(render_body(request, transport))
    for role, text in _wire_texts(body, transport):
        found = parse_item_header(text)
        if role in ("system", "developer") and found is not None:
            assert found.offset not in untrusted
    # Wherever untrusted system-lane items sit, every trusted one keeps instruction
    # precedence: Anthropic's system parameter, or ahead of OpenAI's first user message.
    instructions = _instruction_texts(body, transport)
    for item in state.system:
        assert (render_item(item) in instructions) == (item.offset not in untrusted)


def _instruction_texts(body: dict[str, Any], transport: str) -> list[str]:
    texts = _wire_texts(body, transport)
    if transport == "anthropic":
        return [text for role, text in texts if role == "system"]
    first_user = next(i for i, (role, _) in enumerate(texts) if role == "user")
    return [text for role, text in texts[:first_user] if role in ("system", "developer")]
