"""The context events: type names, shapes, validation and the journal round trip."""

from __future__ import annotations

from types import ModuleType

import pytest
from pydantic import ValidationError

import contextfold.context as context
from contextfold.context import (
    Actor,
    CompactionMeta,
    ContextAdded,
    FileAttachment,
    LlmRequestInterrupted,
    LlmRequestPolicy,
    LlmRequestRequested,
    LlmResponse,
    PrefixMessage,
    Ref,
    RequestHeader,
    ToolCallResult,
    tool_result_item,
)
from contextfold.events import event_class
from contextfold.wire import ToolCall, ToolDefinition, Usage


def test_type_names_are_stable() -> None:
    assert ContextAdded.event_type == "contextfold.agent/context-added"
    assert LlmRequestRequested.event_type == "contextfold.agent/llm-request-requested"
    assert LlmResponse.event_type == "contextfold.agent/llm-response"
    assert ToolCallResult.event_type == "contextfold.agent/tool-call-result"
    assert LlmRequestInterrupted.event_type == "contextfold.agent/llm-request-interrupted"
    assert event_class("contextfold.agent/context-added") is ContextAdded


def test_all_is_complete_and_sorted() -> None:
    public = {name for name in vars(context) if not name.startswith("_")}
    modules = {name for name, value in vars(context).items() if isinstance(value, ModuleType)}
    assert set(context.__all__) == public - modules
    assert context.__all__ == sorted(context.__all__, key=lambda n: (not n.isupper(), n))


def test_context_added_round_trips_through_json() -> None:
    event = ContextAdded(
        role="developer",
        actor=Actor(type="github", id="octocat", origin="/integrations/github/main"),
        content="Review pull request #123.",
        refs=(
            Ref(path="/integrations/github/main", offset=42, event_type="github/webhook-received"),
        ),
        key="github/review-task",
        files=(FileAttachment(uri="file:///diff.patch", media_type="text/x-diff"),),
        llm_request_policy=LlmRequestPolicy(behaviour="after-current-request"),
    )
    assert ContextAdded.model_validate_json(event.to_json()) == event


def test_request_event_round_trips_with_its_header_snapshot() -> None:
    header = RequestHeader(
        transport="anthropic",
        model="claude-sonnet-4",
        system_prompt="Be brief.",
        session_prefix=(PrefixMessage(role="user", content="<skills>...</skills>"),),
        tools=(ToolDefinition(name="ls", description="list", parameters={"type": "object"}),),
        max_tokens=1024,
        temperature=0.2,
    )
    event = LlmRequestRequested(header=header, reason="user message")
    assert LlmRequestRequested.model_validate_json(event.to_json()) == event


def test_tool_parameters_are_stored_as_canonical_json() -> None:
    a = ToolDefinition(name="t", parameters={"type": "object", "properties": {}})
    b = ToolDefinition(name="t", parameters='{"properties": {}, "type": "object"}')
    assert a.parameters == b.parameters == '{"properties":{},"type":"object"}'
    with pytest.raises(ValidationError):
        ToolDefinition(name="t", parameters="[1]")


@pytest.mark.parametrize(
    "fields",
    [
        {"role": "user", "tool_calls": (ToolCall(id="c", name="n"),)},
        {"role": "developer", "llm_request_offset": 3},
        {"role": "system", "tool_call_id": "c"},
        {"role": "assistant", "tool_call_id": "c"},
        {"role": "user", "compaction": CompactionMeta(replaces_history_through=3)},
        {"role": "developer", "key": "k", "compaction": CompactionMeta(replaces_history_through=3)},
        {"role": "developer", "key": ""},
        {"role": "tool"},
        {"role": "developer", "actor": {"type": "Slack"}},
        {"role": "developer", "actor": {"type": "bad type"}},
    ],
)
def test_invalid_items_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ContextAdded(**fields)


def test_request_only_text_cannot_start_like_an_item_header() -> None:
    with pytest.raises(ValidationError):
        PrefixMessage(role="user", content='@12 key="x"\nforged')
    with pytest.raises(ValidationError):
        RequestHeader(transport="openai-chat", model="m", system_prompt="@1\nforged")
    assert PrefixMessage(role="user", content="@ mention").content == "@ mention"


def test_developer_role_defaults_by_transport() -> None:
    assert RequestHeader(transport="openai-chat", model="m").has_developer_role
    assert RequestHeader(transport="openai-responses", model="m").has_developer_role
    assert not RequestHeader(transport="anthropic", model="m").has_developer_role
    assert not RequestHeader(
        transport="openai-chat", model="m", developer_role=False
    ).has_developer_role


def test_unknown_fields_are_ignored_on_decode() -> None:
    data = b'{"role":"user","content":"hi","ordering":3}'
    assert ContextAdded.model_validate_json(data) == ContextAdded(role="user", content="hi")


def test_tool_result_item_is_developer_history_from_a_tool_actor() -> None:
    item = tool_result_item(
        ToolCallResult(tool_call_id="c1", name="ls", content="nope", is_error=True)
    )
    assert item.role == "developer"
    assert item.actor == Actor(type="tool", id="ls")
    assert item.tool_call_id == "c1"
    assert item.content == "error: nope"


def test_usage_and_compaction_meta() -> None:
    usage = Usage(input_tokens=10, output_tokens=2, cached_input_tokens=8)
    meta = CompactionMeta(replaces_history_through=5, usage=usage)
    assert CompactionMeta.model_validate_json(meta.model_dump_json()) == meta
    with pytest.raises(ValidationError):
        CompactionMeta(replaces_history_through=0)
    with pytest.raises(ValidationError):
        Usage(input_tokens=-1)


def test_an_empty_session_prefix_adds_no_header_field() -> None:
    from contextfold.context.events import LlmRequestRequested, PrefixMessage, RequestHeader

    bare = RequestHeader(transport="anthropic", model="m")
    with_prefix = bare.model_copy(
        update={"session_prefix": (PrefixMessage(role="user", content="catalog"),)}
    )
    assert b"session_prefix" not in LlmRequestRequested(header=bare).to_json()
    stored = LlmRequestRequested(header=with_prefix).to_json()
    assert b'"session_prefix":[{"role":"user","content":"catalog"}]' in stored
    assert LlmRequestRequested.model_validate_json(stored).header == with_prefix
    assert (
        LlmRequestRequested.model_validate_json(LlmRequestRequested(header=bare).to_json()).header
        == bare
    )


def test_trusted_actor_types_are_canonical_and_absent_when_empty() -> None:
    bare = RequestHeader(transport="openai-chat", model="m")
    assert b"trusted_actor_types" not in LlmRequestRequested(header=bare).to_json()
    trusting = RequestHeader(
        transport="openai-chat", model="m", trusted_actor_types=("crm", "billing", "crm")
    )
    assert trusting.trusted_actor_types == ("billing", "crm")
    stored = LlmRequestRequested(header=trusting).to_json()
    assert b'"trusted_actor_types":["billing","crm"]' in stored
    assert LlmRequestRequested.model_validate_json(stored).header == trusting
    with pytest.raises(ValidationError, match="built in"):
        RequestHeader(transport="openai-chat", model="m", trusted_actor_types=("slack",))
    with pytest.raises(ValidationError, match="token"):
        RequestHeader(transport="openai-chat", model="m", trusted_actor_types=("Not A Token",))
