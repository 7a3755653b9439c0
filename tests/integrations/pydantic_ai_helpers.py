"""Shared pieces of the pydantic-ai integration tests: journals on every backend, one part of
every kind the installed pydantic-ai defines, and a tool-calling FunctionModel."""

from __future__ import annotations

import typing
import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import (
    AgentInstructionSource,
    AudioUrl,
    BinaryContent,
    CachePoint,
    CapabilityLoadDeltaPart,
    Citation,
    CompactionPart,
    ContentCitationAnchor,
    DocumentCitationSource,
    DocumentUrl,
    FilePart,
    ImageUrl,
    InstructionBaselinePart,
    InstructionDeltaPart,
    InstructionDigest,
    InstructionId,
    InstructionPart,
    LoadCapabilityCallPart,
    LoadCapabilityReturnPart,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    ModelSettingsDeltaPart,
    NativeToolCallPart,
    NativeToolReturnPart,
    NativeToolSearchCallPart,
    NativeToolSearchReturnPart,
    RetryFeedbackPart,
    RetryInfo,
    RetryPromptPart,
    SpeechPart,
    SpeechTimestamp,
    StructuredContent,
    SystemPromptPart,
    TextContent,
    TextPart,
    ThinkingPart,
    ToolAvailabilityDeltaPart,
    ToolCallPart,
    ToolReturnPart,
    ToolSearchCallPart,
    ToolSearchReturnPart,
    UploadedFile,
    UserPromptPart,
    VideoUrl,
    WebCitationSource,
)
from pydantic_ai.models.function import AgentInfo
from pydantic_ai.usage import RequestUsage

__all__ = [
    "BACKENDS",
    "LEGACY",
    "REQUEST_PARTS",
    "RESPONSE_PARTS",
    "T0",
    "adapter_round_trip",
    "adding_model",
    "backend_url",
    "installed_tags",
    "retry_prompt",
]

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]

T0 = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)
_PNG = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\x00\x80"
# Tags of the legacy members that load a stored "retry-prompt" part (covered by it).
LEGACY = frozenset({"legacy-retry-tool-return", "legacy-retry-feedback"})


def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The journal URL of ``request.param``: memory, a real SQLite file or a fresh database
    of the suite's PostgreSQL server."""
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'journal.db'}"
    return str(request.getfixturevalue("pg_dsn"))


def installed_tags(union: Any) -> frozenset[str]:
    """The discriminator tags of a pydantic-ai part union (``ModelRequestPart``, …)."""
    members = typing.get_args(typing.get_args(union)[0])
    tags = set()
    for member in members:
        for extra in typing.get_args(member)[1:]:
            tag = getattr(extra, "tag", None)
            if isinstance(tag, str):
                tags.add(tag)
    return frozenset(tags)


def retry_prompt(content: str, *, tool_name: str | None, tool_call_id: str) -> Any:
    """A legacy RetryPromptPart, without the deprecation warning its constructor gives."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return RetryPromptPart(
            content, tool_name=tool_name, tool_call_id=tool_call_id, timestamp=T0
        )


def _user_content(text: str, data: bytes) -> list[Any]:
    return [
        text,
        TextContent(text, metadata={"source": "note"}),
        StructuredContent({"rows": [1, 2.5, None]}, metadata={"k": "v"}),
        ImageUrl("https://example.com/a.png", vendor_metadata={"detail": "low"}),
        AudioUrl("https://example.com/a.wav"),
        DocumentUrl("https://example.com/a.pdf", force_download=True),
        VideoUrl("https://example.com/a.mp4"),
        BinaryContent(data, media_type="image/png", vendor_metadata={"detail": "high"}),
        BinaryContent(data, media_type="application/octet-stream"),
        UploadedFile("file-1", provider_name="openai", media_type="application/pdf"),
        CachePoint(),
    ]


def _request_parts(text: str, data: bytes, signature: str) -> dict[str, Callable[[], Any]]:
    del signature
    search: Any = {"discovered_tools": [{"name": "add"}], "message": text}
    return {
        "system-prompt": lambda: SystemPromptPart(
            text, timestamp=T0, dynamic_ref="dyn", metadata={"m": [1, 2]}
        ),
        "user-prompt": lambda: UserPromptPart(_user_content(text, data), timestamp=T0),
        "speech": lambda: SpeechPart(
            speaker="user",
            transcript=text,
            audio=BinaryContent(data, media_type="audio/wav"),
            timestamps=[SpeechTimestamp(text="w", start_ms=0, duration_ms=5)],
            provider_name="openai",
        ),
        "tool-search-return": lambda: ToolSearchReturnPart(
            content=search, tool_call_id="search-1", timestamp=T0
        ),
        "capability-load-return": lambda: LoadCapabilityReturnPart(
            content={"message": text}, tool_call_id="load-1", timestamp=T0
        ),
        "tool-return": lambda: ToolReturnPart(
            "add",
            [text, {"n": 1.25, "big": 2**60}, BinaryContent(data, media_type="image/png")],
            "call-1",
            metadata={"kept": True},
            timestamp=T0,
            outcome="retried",
            retry=RetryInfo(cause="model_retry", attempt=1, max_retries=3),
        ),
        "retry-prompt": lambda: retry_prompt(text, tool_name="add", tool_call_id="call-2"),
        "retry-feedback": lambda: RetryFeedbackPart(
            text, retry=RetryInfo(cause="validation_error"), timestamp=T0
        ),
        "tool-availability-delta": lambda: ToolAvailabilityDeltaPart(
            tools_added=["add"], tool_call_id="search-1"
        ),
        "capability-load-delta": lambda: CapabilityLoadDeltaPart(loaded=["cap"]),
        "model-settings-delta": lambda: ModelSettingsDeltaPart(
            settings={"thinking": "high"}, top_level=True
        ),
        "instruction-delta": lambda: InstructionDeltaPart(
            id=InstructionId(AgentInstructionSource(), name="limits"),
            content=text,
            base_hash="0" * 64,
        ),
        "instruction-baseline": lambda: InstructionBaselinePart(
            instructions=[
                InstructionPart(text, dynamic=True, on_change="append", name="limits"),
                InstructionDigest(content_hash="1" * 64),
            ]
        ),
        "compaction": lambda: CompactionPart(text, metadata={"by": "app"}),
    }


def _response_parts(text: str, data: bytes, signature: str) -> dict[str, Callable[[], Any]]:
    citation = Citation(
        sources=[
            WebCitationSource("https://example.com", title=text, excerpts=[text]),
            DocumentCitationSource(document_id="doc-1"),
        ],
        anchor=ContentCitationAnchor(start=0, end=1),
    )
    return {
        "text": lambda: TextPart(
            text,
            id="msg_1",
            provider_name="openai",
            provider_details={"a": 1},
            citations=[citation],
        ),
        "tool-search-call": lambda: ToolSearchCallPart(
            args={"queries": [text]}, tool_call_id="search-1"
        ),
        "capability-load-call": lambda: LoadCapabilityCallPart(
            args={"id": "cap"}, tool_call_id="load-1"
        ),
        "tool-call": lambda: ToolCallPart("add", {"a": 2, "b": [text, None]}, "call-1"),
        "builtin-tool-search-call": lambda: NativeToolSearchCallPart(
            args={"queries": [text]}, tool_call_id="native-search", provider_name="anthropic"
        ),
        "builtin-tool-call": lambda: NativeToolCallPart(
            "web_search", '{"query": "x"}', "native-1", provider_name="openai", id="ws_1"
        ),
        "builtin-tool-search-return": lambda: NativeToolSearchReturnPart(
            content={"discovered_tools": [{"name": "add"}]},
            tool_call_id="native-search",
            provider_name="anthropic",
            timestamp=T0,
        ),
        "builtin-tool-return": lambda: NativeToolReturnPart(
            "web_search",
            {"results": [text]},
            "native-1",
            provider_name="openai",
            provider_details={"status": "completed"},
            timestamp=T0,
        ),
        "thinking": lambda: ThinkingPart(
            text, id="rs_1", signature=signature, provider_name="anthropic"
        ),
        "compaction": lambda: CompactionPart(
            text, id="cmp_1", provider_name="openai", provider_details={"encrypted": signature}
        ),
        "file": lambda: FilePart(BinaryContent(data, media_type="image/png"), id="f1"),
        "speech": lambda: SpeechPart(
            speaker="assistant", transcript=text, interrupted_at_ms=10, provider_name="openai"
        ),
    }


REQUEST_PARTS = _request_parts
RESPONSE_PARTS = _response_parts


def conversation(
    text: str = "héllo ✓", data: bytes = _PNG, signature: str = "EqQBCkgIAR-sig=="
) -> list[ModelMessage]:
    """One request holding a part of every request kind, one response of every response kind."""
    request: list[ModelRequestPart] = [
        make() for make in _request_parts(text, data, signature).values()
    ]
    response: list[ModelResponsePart] = [
        make() for make in _response_parts(text, data, signature).values()
    ]
    return [
        ModelRequest(request, timestamp=T0, instructions=text, run_id="run-1", metadata={"app": 1}),
        ModelResponse(
            response,
            usage=RequestUsage(input_tokens=3, output_tokens=4, details={"reasoning": 2}),
            model_name="m-1",
            timestamp=T0 + timedelta(seconds=1),
            provider_name="openai",
            provider_response_id="resp_1",
            finish_reason="tool_call",
            run_id="run-1",
        ),
    ]


def adapter_round_trip(messages: list[ModelMessage]) -> list[ModelMessage]:
    """What pydantic-ai's own adapter gives back for the JSON it dumps of ``messages``."""
    return ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(messages))


def adding_model(
    seen: list[list[ModelMessage]] | None = None,
) -> Callable[[list[ModelMessage], AgentInfo], ModelResponse]:
    """A FunctionModel function: call ``add`` on the first request of a run, then answer with
    the sum. Records the messages it is handed in ``seen``."""

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if seen is not None:
            seen.append(list(messages))
        last = messages[-1]
        assert isinstance(last, ModelRequest)
        for part in last.parts:
            if isinstance(part, ToolReturnPart):
                return ModelResponse(parts=[TextPart(f"The sum is {part.content}.")])
        call = ToolCallPart("add", {"a": 2, "b": 3}, f"call-{len(messages)}")
        return ModelResponse(parts=[call])

    return model
