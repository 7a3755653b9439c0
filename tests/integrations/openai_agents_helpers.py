"""Shared helpers of the OpenAI Agents SDK tests: journals per backend and a scripted model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest
from adk_helpers import ProbeStore
from agents import Model, ModelResponse, ModelSettings, Tool, Usage, set_tracing_disabled
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

from contextfold.errors import StoreUnavailableError
from contextfold.events import Event, NewEvent, StoredEvent
from contextfold.store.base import AppendResult, Store

__all__ = [
    "BACKENDS",
    "Call",
    "HookedStore",
    "ScriptedModel",
    "backend_url",
    "decoded",
    "function_call",
    "text_message",
]

E = TypeVar("E", bound=Event)


def decoded(stored: StoredEvent, cls: type[E]) -> E:
    """The stored event's payload as ``cls``."""
    return cast(E, stored.decode(cls))


# The SDK traces runs to OpenAI by default: these tests send nothing anywhere.
set_tracing_disabled(True)

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

    def __init__(self, *outputs: list[Any]) -> None:
        self.outputs = list(outputs)
        self.calls: list[Call] = []

    def enqueue(self, output: list[Any]) -> None:
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
        response_id = f"resp_{len(self.calls)}"
        return ModelResponse(output=output, usage=Usage(requests=1), response_id=response_id)

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
            id=f"resp_{len(self.calls)}",
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


class HookedStore(ProbeStore):
    """A probing store (reads recorded) whose appends can be preceded by another writer's
    (``before``, called once per append with the events' types) or lose their outcome after
    committing (``lose``: the append is stored, then the call fails as a lost connection)."""

    def __init__(self, inner: Store) -> None:
        super().__init__(inner)
        self.before: Callable[[str, tuple[str, ...]], Awaitable[None]] | None = None
        self.lose: Callable[[tuple[str, ...]], bool] = lambda types: False

    async def append(
        self,
        namespace: str,
        stream: str,
        events: Sequence[NewEvent],
        *,
        expected_version: int | None,
        idempotency_key: str | None,
    ) -> AppendResult:
        types = tuple(event.type for event in events)
        hook, self.before = self.before, None
        if hook is not None:
            await hook(stream, types)
        done = await super().append(
            namespace,
            stream,
            events,
            expected_version=expected_version,
            idempotency_key=idempotency_key,
        )
        if self.lose(types):
            self.lose = lambda types: False
            raise StoreUnavailableError(f"injected: the answer to an append to {stream!r} was lost")
        return done
