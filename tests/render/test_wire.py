"""Wire bodies: snapshots, role mapping, tool pairing, cache breakpoints, properties."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import itertools
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from contextfold import wire
from contextfold.errors import RenderError
from contextfold.render import anthropic, openai_chat, openai_responses, pairing
from contextfold.render.anthropic import DEMOTED_MARKERS, MAX_CACHE_BREAKPOINTS
from contextfold.render.pairing import order_tool_results
from contextfold.wire import (
    TRANSPORTS,
    NeutralMessage,
    NeutralRequest,
    Role,
    ToolCall,
    ToolDefinition,
    Transport,
    render_body,
    render_request,
)

SNAPSHOTS = Path(__file__).parent / "snapshots"

_READ = ToolDefinition.from_schema(
    name="read_file",
    description="Read a file of the workspace.",
    parameters={
        "type": "object",
        "properties": {"path": {"type": "string", "description": "Workspace path"}},
        "required": ["path"],
    },
)
_SEARCH = ToolDefinition.from_schema(
    name="search",
    description="Search the workspace.",
    parameters={
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["query"],
    },
)


def _msg(role: Role, content: str, **kwargs: Any) -> NeutralMessage:
    return NeutralMessage(role=role, content=content, **kwargs)


def _snapshot_request(**changes: Any) -> NeutralRequest:
    request = NeutralRequest(
        model="test-model",
        system="Context protocol: each item starts with a one-line header (@offset ...).",
        messages=(
            _msg("developer", "@2\nSkills: read_file, search.", cache_breakpoint=True),
            _msg("user", '@5 refs=["/github@40"]\nReview PR #123.'),
            _msg(
                "assistant",
                "@7\nReading the diff and searching for callers.",
                tool_calls=(
                    ToolCall(id="call_1", name="read_file", arguments='{"path":"src/a.py"}'),
                    ToolCall(id="call_2", name="search", arguments='{"query":"fold("}'),
                ),
            ),
            _msg("tool", "@8\ndef fold(): ...", tool_call_id="call_1"),
            _msg("tool", "@9\n3 matches", tool_call_id="call_2"),
            _msg("developer", "@10\nCI finished: green."),
            _msg("user", "@12\nAlso check the tests, please."),
        ),
        tools=(_READ, _SEARCH),
        max_tokens=1024,
        temperature=0.2,
    )
    return dataclasses.replace(request, **changes)


def _check_snapshot(name: str, body: dict[str, Any], data: bytes) -> None:
    path = SNAPSHOTS / f"{name}.json"
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOTS.mkdir(exist_ok=True)
        text = json.dumps(body, indent=2, ensure_ascii=False)
        path.write_text(text + "\n", encoding="utf-8")
    if not path.exists():
        pytest.fail(
            f"snapshot {path} is missing: run with UPDATE_SNAPSHOTS=1, review and commit it",
            pytrace=False,
        )
    expected = json.loads(path.read_text(encoding="utf-8"))
    assert body == expected
    # Byte for byte, key order included (the snapshot keeps the body's order).
    assert data == json.dumps(expected, separators=(",", ":"), ensure_ascii=False).encode()


# -- snapshots ------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_body_matches_snapshot(transport: Transport) -> None:
    rendered = render_request(_snapshot_request(), transport)
    _check_snapshot(transport, rendered.json(), rendered.body)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_streaming_body_matches_snapshot(transport: Transport) -> None:
    rendered = render_request(_snapshot_request(stream=True), transport)
    _check_snapshot(f"{transport}-stream", rendered.json(), rendered.body)


# -- the data model and RenderedRequest ----------------------------------------------


def test_rendered_request_carries_body_hash_and_fresh_json() -> None:
    rendered = render_request(_snapshot_request(), "anthropic")
    assert rendered.transport == "anthropic"
    assert rendered.sha256 == hashlib.sha256(rendered.body).hexdigest()
    assert render_body(_snapshot_request(), "anthropic") == rendered.body
    first = rendered.json()
    first["model"] = "changed"
    assert rendered.json()["model"] == "test-model"
    with pytest.raises(dataclasses.FrozenInstanceError):
        rendered.body = b"{}"  # type: ignore[misc]


def test_body_is_compact_json_with_the_history_last() -> None:
    history_key = {"openai-chat": "messages", "openai-responses": "input", "anthropic": "messages"}
    for transport in TRANSPORTS:
        body = render_body(_snapshot_request(), transport)
        parsed = json.loads(body)
        compact = json.dumps(parsed, separators=(",", ":"), ensure_ascii=False)
        assert body == compact.encode()
        # What stays the same across requests comes first, the growing history last.
        assert list(parsed)[-1] == history_key[transport]
        assert next(iter(parsed)) == "model"


def test_rendering_does_not_mutate_or_share_state() -> None:
    request = _snapshot_request()
    before = copy.deepcopy(request)
    bodies = [anthropic.render_anthropic(request) for _ in range(2)]
    bodies[0]["tools"][0]["input_schema"]["type"] = "mutated"
    bodies[0]["messages"][0]["content"][0]["text"] = "mutated"
    assert anthropic.render_anthropic(request) == bodies[1]
    assert request == before


def test_data_model_is_frozen_and_hashable() -> None:
    request = _snapshot_request()
    assert hash(request) == hash(_snapshot_request())
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.messages[0].content = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        NeutralMessage("user", "positional")  # type: ignore[call-arg]


def test_tool_definition_schema_is_canonical_and_copied() -> None:
    a = ToolDefinition.from_schema(
        name="t", description="d", parameters={"type": "object", "properties": {}}
    )
    b = ToolDefinition.from_schema(
        name="t", description="d", parameters={"properties": {}, "type": "object"}
    )
    assert a == b and hash(a) == hash(b)
    schema = a.arguments_schema()
    schema["type"] = "mutated"
    assert a.arguments_schema()["type"] == "object"


@pytest.mark.parametrize(
    "parameters",
    [{"type": "string"}, {"type": "object", "x": float("nan")}],
)
def test_tool_definition_refuses_non_object_or_non_json_schemas(
    parameters: dict[str, Any],
) -> None:
    with pytest.raises(ValidationError, match="tool 't' parameters"):
        ToolDefinition.from_schema(name="t", description="d", parameters=parameters)


def test_tool_definition_without_type_is_sent_as_an_object_schema() -> None:
    bare = ToolDefinition(name="now", description="The time.")
    request = _snapshot_request(tools=(bare,))
    chat = render_request(request, "openai-chat").json()["tools"][0]["function"]
    assert chat["parameters"] == {"type": "object"}
    responses = render_request(request, "openai-responses").json()["tools"][0]
    assert responses["parameters"] == {"type": "object"}
    assert render_request(request, "anthropic").json()["tools"][0] == {
        "name": "now",
        "description": "The time.",
        "input_schema": {"type": "object"},
    }


def test_tool_definition_keeps_schema_text_canonical() -> None:
    spaced = ToolDefinition(name="t", parameters='{ "type": "object", "properties": {} }')
    assert spaced.parameters == '{"properties":{},"type":"object"}'
    assert spaced == ToolDefinition.from_schema(
        name="t", parameters={"properties": {}, "type": "object"}
    )
    with pytest.raises(ValidationError, match="not JSON text"):
        ToolDefinition(name="t", parameters="{not json")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"role": "tool", "content": "x"}, "tool_call_id"),
        ({"role": "user", "content": "x", "tool_call_id": "c"}, "tool_call_id"),
        (
            {
                "role": "user",
                "content": "x",
                "tool_calls": (ToolCall(id="c", name="n", arguments=""),),
            },
            "tool_calls",
        ),
        ({"role": "critic", "content": "x"}, "role"),
    ],
)
def test_message_shape_is_checked(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(RenderError, match=match):
        NeutralMessage(**kwargs)


@pytest.mark.parametrize(
    "changes",
    [{"max_tokens": 0}, {"max_tokens": True}, {"temperature": float("inf")}, {"model": ""}],
)
def test_request_fields_are_checked(changes: dict[str, Any]) -> None:
    with pytest.raises(RenderError):
        _snapshot_request(**changes)


def test_duplicate_tool_names_are_refused() -> None:
    with pytest.raises(RenderError, match="read_file"):
        _snapshot_request(tools=(_READ, _READ))


def test_unknown_transport_is_refused() -> None:
    with pytest.raises(RenderError, match="transport"):
        render_body(_snapshot_request(), "gemini")  # type: ignore[arg-type]


def test_renderers_are_registered_once_per_transport() -> None:
    # import contextfold registered the built-in ones; the registry keeps each transport's.
    request = _snapshot_request()
    before = render_body(request, "anthropic")
    assert (
        before
        == json.dumps(
            anthropic.render_anthropic(request), separators=(",", ":"), ensure_ascii=False
        ).encode()
    )
    wire.register_renderer("anthropic", anthropic.render_anthropic)  # the same one: a no-op
    with pytest.raises(RenderError, match="'anthropic' already has a renderer"):
        wire.register_renderer("anthropic", openai_chat.render_openai_chat)
    with pytest.raises(RenderError, match="unknown transport 'gemini'"):
        wire.register_renderer("gemini", anthropic.render_anthropic)  # type: ignore[arg-type]
    assert render_body(request, "anthropic") == before  # the refused one changed nothing


@pytest.mark.parametrize("module", [wire, pairing, openai_chat, openai_responses, anthropic])
def test_all_is_sorted_and_complete(module: Any) -> None:
    names = module.__all__
    # isort style (ruff RUF022): CONSTANTS, then Classes, then functions, each sorted.
    assert list(names) == sorted(names, key=lambda n: (not n.isupper(), not n[0].isupper(), n))
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and getattr(value, "__module__", module.__name__) == module.__name__
        and (callable(value) or name.isupper())
        and name != "annotations"
    }
    assert public <= set(names), public - set(names)


# -- tool pairing ---------------------------------------------------------------------


def _call(call_id: str) -> ToolCall:
    return ToolCall(id=call_id, name="read_file", arguments='{"path":"a"}')


def _with(*messages: NeutralMessage) -> NeutralRequest:
    return _snapshot_request(messages=messages)


_BROKEN_PAIRINGS = {
    "unanswered": (
        (_msg("user", "u"), _msg("assistant", "", tool_calls=(_call("c1"), _call("c2")))),
        _msg("tool", "r", tool_call_id="c1"),
        "'c2'",
    ),
    "result-without-call": (
        (_msg("user", "u"),),
        _msg("tool", "r", tool_call_id="ghost"),
        "'ghost'",
    ),
    "answered-twice": (
        (
            _msg("assistant", "", tool_calls=(_call("c1"),)),
            _msg("tool", "r", tool_call_id="c1"),
        ),
        _msg("tool", "again", tool_call_id="c1"),
        "'c1'",
    ),
}


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("case", sorted(_BROKEN_PAIRINGS))
def test_broken_tool_pairing_names_the_call(transport: Transport, case: str) -> None:
    head, tail, call_id = _BROKEN_PAIRINGS[case]
    with pytest.raises(RenderError, match=call_id):
        render_body(_with(*head, tail), transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_result_before_its_call_is_refused(transport: Transport) -> None:
    messages = (
        _msg("user", "u"),
        _msg("tool", "early", tool_call_id="c1"),
        _msg("assistant", "", tool_calls=(_call("c1"),)),
    )
    with pytest.raises(RenderError, match="'c1'"):
        render_body(_with(*messages), transport)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_duplicate_call_ids_are_refused(transport: Transport) -> None:
    messages = (
        _msg("assistant", "", tool_calls=(_call("c1"), _call("c1"))),
        _msg("tool", "r", tool_call_id="c1"),
    )
    with pytest.raises(RenderError, match="two calls"):
        render_body(_with(*messages), transport)


def test_results_move_up_to_their_call() -> None:
    late_user = _msg("user", "arrived while the tool ran")
    messages = (
        _msg("user", "go"),
        _msg("assistant", "", tool_calls=(_call("c1"), _call("c2"))),
        late_user,
        _msg("tool", "second", tool_call_id="c2"),
        _msg("tool", "first", tool_call_id="c1"),
    )
    ordered = order_tool_results(messages)
    assert [m.content for m in ordered] == ["go", "", "second", "first", late_user.content]

    chat = render_request(_with(*messages), "openai-chat").json()["messages"]
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "tool", "user"]
    items = render_request(_with(*messages), "openai-responses").json()["input"]
    assert [i["type"] for i in items] == [
        "message",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "message",
    ]
    turns = render_request(_with(*messages), "anthropic").json()["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert [b["type"] for b in turns[2]["content"]] == ["tool_result", "tool_result", "text"]


# -- role mapping ---------------------------------------------------------------------


def test_openai_chat_keeps_native_roles_and_tool_shape() -> None:
    body = render_request(_snapshot_request(), "openai-chat").json()
    assert [m["role"] for m in body["messages"]] == [
        "system",
        "developer",
        "user",
        "assistant",
        "tool",
        "tool",
        "developer",
        "user",
    ]
    assistant = body["messages"][3]
    assert assistant["tool_calls"][0] == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"path":"src/a.py"}'},
    }
    assert body["messages"][4] == {
        "role": "tool",
        "tool_call_id": "call_1",
        "content": "@8\ndef fold(): ...",
    }
    assert body["max_completion_tokens"] == 1024 and "max_tokens" not in body
    assert "stream" not in body and "stream_options" not in body
    assert "strict" not in body["tools"][0]["function"]


def test_openai_chat_stream_asks_for_usage() -> None:
    body = render_request(_snapshot_request(stream=True), "openai-chat").json()
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def test_openai_responses_maps_system_calls_and_outputs() -> None:
    body = render_request(_snapshot_request(), "openai-responses").json()
    assert body["instructions"].startswith("Context protocol")
    roles = [item.get("role", item["type"]) for item in body["input"]]
    assert roles == [
        "developer",
        "user",
        "assistant",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "developer",
        "user",
    ]
    assert body["input"][5] == {
        "type": "function_call_output",
        "call_id": "call_1",
        "output": "@8\ndef fold(): ...",
    }
    assert body["tools"][0]["strict"] is False
    assert body["max_output_tokens"] == 1024


def test_assistant_tool_call_without_text_sends_no_empty_message() -> None:
    messages = (
        _msg("user", "go"),
        _msg("assistant", "", tool_calls=(_call("c1"),)),
        _msg("tool", "r", tool_call_id="c1"),
    )
    chat = render_request(_with(*messages), "openai-chat").json()["messages"]
    assert "content" not in chat[2]
    items = render_request(_with(*messages), "openai-responses").json()["input"]
    assert [i["type"] for i in items] == ["message", "function_call", "function_call_output"]
    turns = render_request(_with(*messages), "anthropic").json()["messages"]
    assert [b["type"] for b in turns[1]["content"]] == ["tool_use"]


def test_anthropic_leading_system_and_developer_join_the_system_parameter() -> None:
    body = render_request(_snapshot_request(), "anthropic").json()
    assert [b["text"] for b in body["system"]] == [
        _snapshot_request().system,
        "@2\nSkills: read_file, search.",
    ]
    assert body["system"][-1]["cache_control"] == {"type": "ephemeral"}


def test_anthropic_mid_history_developer_and_system_become_marked_user_text() -> None:
    messages = (
        _msg("user", "hello"),
        _msg("developer", "dev note"),
        _msg("system", "late instruction"),
        _msg("assistant", "ok"),
    )
    body = render_request(_with(*messages), "anthropic").json()
    assert len(body["system"]) == 1
    first = body["messages"][0]
    assert first["role"] == "user"
    # The marker is its own block: each message's text still opens a block of its own.
    assert [b["text"] for b in first["content"]] == [
        "hello",
        DEMOTED_MARKERS["developer"],
        "dev note",
        DEMOTED_MARKERS["system"],
        "late instruction",
    ]


def test_anthropic_demoted_empty_message_sends_no_marker() -> None:
    messages = (_msg("user", "hello"), _msg("developer", ""), _msg("assistant", "ok"))
    body = render_request(_with(*messages), "anthropic").json()
    assert [b["text"] for b in body["messages"][0]["content"]] == ["hello"]


def test_anthropic_tool_use_and_result_blocks() -> None:
    body = render_request(_snapshot_request(), "anthropic").json()
    assistant = body["messages"][1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][1] == {
        "type": "tool_use",
        "id": "call_1",
        "name": "read_file",
        "input": {"path": "src/a.py"},
    }
    results = body["messages"][2]["content"]
    assert [b["type"] for b in results] == ["tool_result"] * 2 + ["text"] * 3
    assert [b["text"] for b in results[2:4]] == [
        DEMOTED_MARKERS["developer"],
        "@10\nCI finished: green.",
    ]
    assert results[0] == {
        "type": "tool_result",
        "tool_use_id": "call_1",
        "content": "@8\ndef fold(): ...",
    }
    assert body["tools"][0]["input_schema"] == _READ.arguments_schema()
    assert "temperature" not in body
    assert body["max_tokens"] == 1024


def test_anthropic_empty_arguments_mean_an_empty_object() -> None:
    messages = (
        _msg("assistant", "", tool_calls=(ToolCall(id="c1", name="read_file", arguments=""),)),
        _msg("tool", "", tool_call_id="c1"),
    )
    body = render_request(_with(*messages), "anthropic").json()
    assert body["messages"][0]["content"][0]["input"] == {}
    assert body["messages"][1]["content"][0] == {
        "type": "tool_result",
        "tool_use_id": "c1",
        "cache_control": {"type": "ephemeral"},
    }


@pytest.mark.parametrize("arguments", ["[1, 2]", "not json", '"text"'])
def test_anthropic_refuses_non_object_arguments(arguments: str) -> None:
    messages = (
        _msg("assistant", "", tool_calls=(ToolCall(id="bad", name="n", arguments=arguments),)),
        _msg("tool", "r", tool_call_id="bad"),
    )
    with pytest.raises(RenderError, match="'bad'"):
        render_body(_with(*messages), "anthropic")


def test_anthropic_needs_max_tokens_and_a_turn() -> None:
    with pytest.raises(RenderError, match="max_tokens"):
        render_body(_snapshot_request(max_tokens=None), "anthropic")
    with pytest.raises(RenderError, match="at least one"):
        render_body(_with(_msg("developer", "only a prefix")), "anthropic")
    with pytest.raises(RenderError, match="at least one"):
        render_body(_with(), "anthropic")


def test_anthropic_drops_empty_text_and_keeps_alternation() -> None:
    messages = (_msg("user", "a"), _msg("assistant", ""), _msg("user", "b"))
    body = render_request(_with(*messages), "anthropic").json()
    assert [t["role"] for t in body["messages"]] == ["user"]
    assert [b["text"] for b in body["messages"][0]["content"]] == ["a", "b"]


# -- cache breakpoints ----------------------------------------------------------------


def _markers(body: dict[str, Any]) -> list[str]:
    blocks = [*body.get("system", []), *(b for t in body["messages"] for b in t["content"])]
    return [
        b.get("text", b.get("tool_use_id", b.get("id"))) for b in blocks if "cache_control" in b
    ]


def test_anthropic_marks_system_prefix_and_tail() -> None:
    body = render_request(_snapshot_request(), "anthropic").json()
    assert _markers(body) == [
        "@2\nSkills: read_file, search.",
        "@12\nAlso check the tests, please.",
    ]


def test_anthropic_keeps_the_latest_four_breakpoints() -> None:
    prefix = tuple(
        _msg("user" if i % 2 else "assistant", f"p{i}", cache_breakpoint=True) for i in range(6)
    )
    body = render_request(_with(*prefix, _msg("user", "tail")), "anthropic").json()
    markers = _markers(body)
    assert len(markers) == MAX_CACHE_BREAKPOINTS
    assert markers == ["p3", "p4", "p5", "tail"]


def test_anthropic_breakpoint_on_empty_message_moves_to_previous_block() -> None:
    messages = (
        _msg("user", "a"),
        _msg("assistant", "", cache_breakpoint=True),
        _msg("user", "b"),
    )
    body = render_request(_with(*messages), "anthropic").json()
    assert _markers(body) == [_snapshot_request().system, "a", "b"]


@pytest.mark.parametrize("transport", ["openai-chat", "openai-responses"])
def test_openai_bodies_carry_no_cache_control(transport: Transport) -> None:
    prefix = tuple(_msg("user", f"p{i}", cache_breakpoint=True) for i in range(6))
    assert b"cache_control" not in render_body(_with(*prefix), transport)


# -- properties -----------------------------------------------------------------------

_TOKEN = re.compile(r"<m\d+>")
_ALL_ROLES: tuple[Role, ...] = ("system", "developer", "user", "assistant", "tool")


@st.composite
def conversations(draw: st.DrawFn) -> tuple[NeutralMessage, ...]:
    """Random histories over all five roles; every call is answered, maybe late."""
    messages: list[NeutralMessage] = []
    pending: list[str] = []
    calls = 0
    for _ in range(draw(st.integers(0, 14))):
        role = draw(st.sampled_from(_ALL_ROLES))
        token = f"<m{len(messages)}>"
        breakpoint = draw(st.booleans())
        if role == "tool":
            if not pending:
                continue
            call_id = pending.pop(draw(st.integers(0, len(pending) - 1)))
            messages.append(_msg("tool", token, tool_call_id=call_id, cache_breakpoint=breakpoint))
        elif role == "assistant":
            tool_calls = []
            for _ in range(draw(st.integers(0, 3))):
                arguments = draw(st.sampled_from(['{"path":"a"}', "", "{}", '{"n":[1,2]}']))
                tool_calls.append(
                    ToolCall(id=f"call_{calls}", name="read_file", arguments=arguments)
                )
                pending.append(f"call_{calls}")
                calls += 1
            content = draw(st.sampled_from([token, ""])) if tool_calls else token
            messages.append(
                _msg(
                    "assistant", content, tool_calls=tuple(tool_calls), cache_breakpoint=breakpoint
                )
            )
        else:
            messages.append(_msg(role, token, cache_breakpoint=breakpoint))
    for call_id in pending:
        messages.append(_msg("tool", f"<m{len(messages)}>", tool_call_id=call_id))
    return tuple(messages)


def _texts(transport: Transport, body: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(wire role, text) for every piece of content in the body, in wire order."""
    if transport == "openai-chat":
        for message in body["messages"]:
            yield message["role"], message.get("content") or ""
    elif transport == "openai-responses":
        yield "system", body.get("instructions", "")
        for item in body["input"]:
            if item["type"] == "message":
                yield item["role"], item["content"]
            elif item["type"] == "function_call_output":
                yield "tool", item["output"]
    else:
        for block in body.get("system", []):
            yield "system", block["text"]
        for turn in body["messages"]:
            for block in turn["content"]:
                if block["type"] == "text":
                    yield turn["role"], block["text"]
                elif block["type"] == "tool_result":
                    assert turn["role"] == "user"
                    yield "tool", block.get("content", "")


def _expected_wire_role(transport: Transport, message: NeutralMessage, leading: bool) -> str:
    if transport != "anthropic" or message.role not in ("system", "developer"):
        return message.role
    return "system" if leading else "user"


def _check_pairing(transport: Transport, body: dict[str, Any]) -> None:
    if transport == "openai-chat":
        chat = body["messages"]
        for index, message in enumerate(chat):
            ids = [call["id"] for call in message.get("tool_calls", ())]
            following = chat[index + 1 : index + 1 + len(ids)]
            assert sorted(m.get("tool_call_id") for m in following) == sorted(ids)
    elif transport == "openai-responses":
        items = body["input"]
        index = 0
        while index < len(items):
            run = index
            while run < len(items) and items[run]["type"] == "function_call":
                run += 1
            ids = [item["call_id"] for item in items[index:run]]
            outputs = items[run : run + len(ids)]
            assert all(item["type"] == "function_call_output" for item in outputs)
            assert sorted(item["call_id"] for item in outputs) == sorted(ids)
            index = max(run + len(ids), index + 1)
    else:
        turns = body["messages"]
        assert all(a["role"] != b["role"] for a, b in itertools.pairwise(turns))
        used = 0
        for index, turn in enumerate(turns):
            ids = [b["id"] for b in turn["content"] if b["type"] == "tool_use"]
            used += len(ids)
            if ids:
                nxt = turns[index + 1]["content"]
                assert [b["type"] for b in nxt[: len(ids)]] == ["tool_result"] * len(ids)
                assert sorted(b["tool_use_id"] for b in nxt[: len(ids)]) == sorted(ids)
        results = sum(b["type"] == "tool_result" for t in turns for b in t["content"])
        assert results == used


def _render(messages: tuple[NeutralMessage, ...], transport: Transport) -> bytes | None:
    """The body, or None when Anthropic has no turn to send (only a system prefix)."""
    try:
        return render_body(_with(*messages), transport)
    except RenderError as exc:
        only_prefix = all(m.role in ("system", "developer") for m in messages)
        if transport == "anthropic" and only_prefix and "at least one" in str(exc):
            return None
        raise


@settings(max_examples=300, deadline=None)
@given(messages=conversations(), transport=st.sampled_from(TRANSPORTS))
def test_user_and_tool_content_never_gain_precedence(
    messages: tuple[NeutralMessage, ...], transport: Transport
) -> None:
    data = _render(messages, transport)
    if data is None:
        return
    assert _render(messages, transport) == data
    assert render_body(copy.deepcopy(_with(*messages)), transport) == data
    body = json.loads(data)

    seen: dict[str, str] = {}
    order: list[str] = []
    for role, text in _texts(transport, body):
        for token in _TOKEN.findall(text):
            assert token not in seen, f"{token} rendered twice"
            seen[token] = role
            order.append(token)
    ordered = order_tool_results(messages)
    leading = next(
        (i for i, m in enumerate(ordered) if m.role not in ("system", "developer")), len(ordered)
    )
    for index, message in enumerate(ordered):
        for token in _TOKEN.findall(message.content):
            assert seen[token] == _expected_wire_role(transport, message, index < leading)
            if message.role in ("user", "tool"):
                assert seen[token] not in ("system", "developer")
    if transport == "anthropic":
        # Every message's text opens a block of its own (a demotion marker is a separate
        # block), so a first line such as an item header stays a first line on the wire.
        blocks = {text for _, text in _texts(transport, body)}
        assert all(m.content in blocks for m in ordered if m.content)
    expected_order = [t for m in ordered for t in _TOKEN.findall(m.content)]
    if transport != "anthropic":  # Anthropic lifts tool results to the front of a turn
        assert order == expected_order
    else:
        assert sorted(order) == sorted(expected_order)
    _check_pairing(transport, body)


@settings(max_examples=300, deadline=None)
@given(messages=conversations())
def test_anthropic_cache_markers_are_bounded_and_on_the_tail(
    messages: tuple[NeutralMessage, ...],
) -> None:
    data = _render(messages, "anthropic")
    if data is None:
        return
    body = json.loads(data)
    assert data.count(b'"cache_control"') <= MAX_CACHE_BREAKPOINTS
    assert "cache_control" in body["messages"][-1]["content"][-1]
    wanted = 1 + sum(m.cache_breakpoint for m in messages) + 1
    assert data.count(b'"cache_control"') >= min(2, wanted)


def _flat(transport: Transport, data: bytes) -> list[Any]:
    body = json.loads(data)
    if transport == "openai-chat":
        return list(body["messages"])
    if transport == "openai-responses":
        return list(body["input"])
    blocks = [("system", b) for b in body.get("system", [])]
    blocks += [(t["role"], b) for t in body["messages"] for b in t["content"]]
    return [(role, {k: v for k, v in b.items() if k != "cache_control"}) for role, b in blocks]


@settings(max_examples=200, deadline=None)
@given(messages=conversations(), transport=st.sampled_from(TRANSPORTS))
def test_appending_history_keeps_the_sent_prefix(
    messages: tuple[NeutralMessage, ...], transport: Transport
) -> None:
    full = _render(messages, transport)
    for cut in range(len(messages)):
        head = messages[:cut]
        calls = {c.id for m in head for c in m.tool_calls}
        answered = {m.tool_call_id for m in head if m.role == "tool"}
        if calls != answered:
            continue  # a request is only made once every call is answered
        prefix = _render(head, transport)
        if prefix is None or full is None:
            continue
        before, after = _flat(transport, prefix), _flat(transport, full)
        assert after[: len(before)] == before
