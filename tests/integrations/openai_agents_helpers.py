"""Shared helpers of the OpenAI Agents SDK tests: journals per backend and a scripted model."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from agents import Model, ModelResponse, ModelSettings, Tool, Usage
from agents.agent_output import AgentOutputSchemaBase
from agents.handoffs import Handoff
from agents.items import TResponseInputItem, TResponseOutputItem, TResponseStreamEvent
from agents.models.interface import ModelTracing
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

__all__ = [
    "BACKENDS",
    "Call",
    "ScriptedModel",
    "backend_url",
    "function_call",
    "text_message",
]

BACKENDS = ["memory", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The journal URL of ``request.param``: memory, a real SQLite file or a fresh PostgreSQL
    database of the suite's server."""
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'journal.db'}"
    return str(request.getfixturevalue("pg_dsn"))


def text_message(text: str, id: str = "msg_1") -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
    )


def function_call(name: str, arguments: str, call_id: str = "call_1") -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        type="function_call", name=name, arguments=arguments, call_id=call_id
    )


@dataclass(frozen=True)
class Call:
    """One request the scripted model got."""

    instructions: str | None
    input: list[TResponseInputItem]
    tools: tuple[str, ...]


class ScriptedModel(Model):
    """A model that answers each request with the next scripted output (no network)."""

    def __init__(self, *outputs: list[TResponseOutputItem]) -> None:
        self.outputs = list(outputs)
        self.calls: list[Call] = []

    def enqueue(self, output: list[TResponseOutputItem]) -> None:
        self.outputs.append(output)

    def _answer(
        self, instructions: str | None, input: str | list[TResponseInputItem], tools: list[Tool]
    ) -> list[TResponseOutputItem]:
        items: list[TResponseInputItem] = (
            [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        )
        self.calls.append(Call(instructions, items, tuple(tool.name for tool in tools)))
        if not self.outputs:
            raise AssertionError("the scripted model got a request it has no answer for")
        return self.outputs.pop(0)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        output = self._answer(system_instructions, input, tools)
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=None)

    async def stream_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> AsyncIterator[TResponseStreamEvent]:
        output = self._answer(system_instructions, input, tools)
        response = Response(
            id="resp_scripted",
            created_at=0,
            model="scripted",
            object="response",
            output=output,
            tool_choice="auto",
            tools=[],
            parallel_tool_calls=False,
            status="completed",
        )
        yield ResponseCompletedEvent(
            type="response.completed", response=response, sequence_number=0
        )
