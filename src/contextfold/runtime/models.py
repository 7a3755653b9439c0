"""Model clients: send a rendered request, get the model's output back.

Remote clients send the exact body contextfold rendered (through the official SDKs, so
auth, retries and streaming are theirs). :class:`LocalModel` and :class:`FunctionModel`
answer offline and deterministically, for the demo and for users' own tests.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import ContextfoldError
from ..render.neutral import NeutralRequest, RenderedRequest, ToolCall, Transport

__all__ = [
    "AnthropicModel",
    "FunctionModel",
    "ModelClient",
    "ModelError",
    "ModelOutput",
    "OnDelta",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "Usage",
]

OnDelta = Callable[[str, str], Awaitable[None] | None]
"""Called with (kind, text) for each streamed fragment; kind is "text" or "reasoning"."""


class ModelError(ContextfoldError):
    """The provider refused or failed a request; the message names model and transport."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage a provider reported for one request."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0


@dataclass(frozen=True, slots=True)
class ModelOutput:
    """What the model returned: text, tool calls, usage and why it stopped."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = "stop"
    reasoning: str = ""


class ModelClient(Protocol):
    """Anything that completes a request. ``transport`` picks the wire format rendered."""

    transport: Transport
    model: str

    async def complete(
        self, request: NeutralRequest, rendered: RenderedRequest, *, on_delta: OnDelta | None = None
    ) -> ModelOutput: ...


async def _emit(on_delta: OnDelta | None, kind: str, text: str) -> None:
    if on_delta is not None and text:
        result = on_delta(kind, text)
        if inspect.isawaitable(result):
            await result


class FunctionModel:
    """A model that is a Python function of the neutral request (sync or async).

    ``fn(request) -> ModelOutput | str``. For tests of agents built on contextfold.
    """

    def __init__(
        self,
        fn: Callable[[NeutralRequest], ModelOutput | str | Awaitable[ModelOutput | str]],
        *,
        model: str = "function-model",
        transport: Transport = "openai-chat",
        stream_chunk: int = 0,
    ) -> None:
        self.fn = fn
        self.model = model
        self.transport: Transport = transport
        self.stream_chunk = stream_chunk

    async def complete(
        self, request: NeutralRequest, rendered: RenderedRequest, *, on_delta: OnDelta | None = None
    ) -> ModelOutput:
        result = self.fn(request)
        if inspect.isawaitable(result):
            result = await result
        output = ModelOutput(text=result) if isinstance(result, str) else result
        if self.stream_chunk and output.text:
            for i in range(0, len(output.text), self.stream_chunk):
                await _emit(on_delta, "text", output.text[i : i + self.stream_chunk])
        if output.usage == Usage():
            # Deterministic usage: request bytes / 4, like the default token counter.
            output = ModelOutput(
                output.text,
                output.tool_calls,
                Usage(
                    input_tokens=len(rendered.body) // 4, output_tokens=len(output.text) // 4 + 1
                ),
                output.finish_reason,
                output.reasoning,
            )
        return output


def _openai_client(client: Any, base_url: str | None, api_key: str | None) -> Any:
    if client is not None:
        return client
    try:
        import openai
    except ImportError as exc:  # pragma: no cover - extras
        raise ImportError(
            "OpenAI models need the openai extra: pip install 'contextfold[openai]'"
        ) from exc
    return openai.AsyncOpenAI(base_url=base_url, api_key=api_key)


class OpenAIChatModel:
    """OpenAI Chat Completions, or any OpenAI-compatible server (vLLM, Ollama) via base_url."""

    transport: Transport = "openai-chat"

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
    ):
        self.model = model
        self.client = _openai_client(client, base_url, api_key)

    async def complete(
        self, request: NeutralRequest, rendered: RenderedRequest, *, on_delta: OnDelta | None = None
    ) -> ModelOutput:
        body = rendered.json()
        try:
            response = await self.client.chat.completions.create(**body)
        except Exception as exc:
            raise ModelError(f"openai-chat request to model {self.model!r} failed: {exc}") from exc
        if not body.get("stream"):
            choice = response.choices[0]
            calls = tuple(
                ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "")
                for c in (choice.message.tool_calls or ())
            )
            usage = response.usage
            return ModelOutput(
                text=choice.message.content or "",
                tool_calls=calls,
                usage=_openai_usage(usage),
                finish_reason=choice.finish_reason or "stop",
            )
        text: list[str] = []
        partial: dict[int, dict[str, str]] = {}
        usage_obj = None
        finish = "stop"
        async for chunk in response:
            if chunk.usage is not None:
                usage_obj = chunk.usage
            for choice in chunk.choices:
                delta = choice.delta
                if delta.content:
                    text.append(delta.content)
                    await _emit(on_delta, "text", delta.content)
                for call in delta.tool_calls or ():
                    slot = partial.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                    if call.id:
                        slot["id"] = call.id
                    if call.function is not None:
                        slot["name"] += call.function.name or ""
                        slot["arguments"] += call.function.arguments or ""
                if choice.finish_reason:
                    finish = choice.finish_reason
        calls = tuple(ToolCall(**partial[i]) for i in sorted(partial))
        return ModelOutput("".join(text), calls, _openai_usage(usage_obj), finish)


def _openai_usage(usage: Any) -> Usage:
    if usage is None:
        return Usage()
    cached = 0
    details = getattr(usage, "prompt_tokens_details", None) or getattr(
        usage, "input_tokens_details", None
    )
    if details is not None:
        cached = getattr(details, "cached_tokens", 0) or 0
    return Usage(
        input_tokens=getattr(usage, "prompt_tokens", None)
        or getattr(usage, "input_tokens", 0)
        or 0,
        output_tokens=getattr(usage, "completion_tokens", None)
        or getattr(usage, "output_tokens", 0)
        or 0,
        cached_input_tokens=cached,
    )


class OpenAIResponsesModel:
    """The OpenAI Responses API."""

    transport: Transport = "openai-responses"

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
    ):
        self.model = model
        self.client = _openai_client(client, base_url, api_key)

    async def complete(
        self, request: NeutralRequest, rendered: RenderedRequest, *, on_delta: OnDelta | None = None
    ) -> ModelOutput:
        body = rendered.json()
        try:
            response = await self.client.responses.create(**body)
        except Exception as exc:
            raise ModelError(
                f"openai-responses request to model {self.model!r} failed: {exc}"
            ) from exc
        if body.get("stream"):
            final = None
            async for event in response:
                if event.type == "response.output_text.delta":
                    await _emit(on_delta, "text", event.delta)
                elif event.type == "response.completed":
                    final = event.response
            if final is None:
                raise ModelError(
                    f"openai-responses stream for {self.model!r} ended without response.completed"
                )
            response = final
        text: list[str] = []
        calls: list[ToolCall] = []
        for item in response.output:
            if item.type == "message":
                text.extend(
                    part.text for part in item.content if getattr(part, "type", "") == "output_text"
                )
            elif item.type == "function_call":
                calls.append(
                    ToolCall(id=item.call_id, name=item.name, arguments=item.arguments or "")
                )
        return ModelOutput(
            "".join(text),
            tuple(calls),
            _openai_usage(response.usage),
            response.status or "completed",
        )


class AnthropicModel:
    """Anthropic Messages."""

    transport: Transport = "anthropic"

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
    ):
        self.model = model
        if client is None:
            try:
                import anthropic
            except ImportError as exc:  # pragma: no cover - extras
                raise ImportError(
                    "Anthropic models need the anthropic extra: "
                    "pip install 'contextfold[anthropic]'"
                ) from exc
            client = anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key)
        self.client = client

    async def complete(
        self, request: NeutralRequest, rendered: RenderedRequest, *, on_delta: OnDelta | None = None
    ) -> ModelOutput:
        body = rendered.json()
        try:
            response = await self.client.messages.create(**body)
        except Exception as exc:
            raise ModelError(f"anthropic request to model {self.model!r} failed: {exc}") from exc
        if not body.get("stream"):
            text = "".join(b.text for b in response.content if b.type == "text")
            calls = tuple(
                ToolCall(id=b.id, name=b.name, arguments=json.dumps(b.input, sort_keys=True))
                for b in response.content
                if b.type == "tool_use"
            )
            u = response.usage
            return ModelOutput(
                text,
                calls,
                Usage(
                    u.input_tokens, u.output_tokens, getattr(u, "cache_read_input_tokens", 0) or 0
                ),
                response.stop_reason or "end_turn",
            )
        text_parts: list[str] = []
        blocks: dict[int, dict[str, str]] = {}
        input_tokens = output_tokens = cached = 0
        stop = "end_turn"
        async for event in response:
            kind = event.type
            if kind == "message_start":
                u = event.message.usage
                input_tokens = u.input_tokens
                cached = getattr(u, "cache_read_input_tokens", 0) or 0
            elif kind == "content_block_start" and event.content_block.type == "tool_use":
                blocks[event.index] = {
                    "id": event.content_block.id,
                    "name": event.content_block.name,
                    "arguments": "",
                }
            elif kind == "content_block_delta":
                if event.delta.type == "text_delta":
                    text_parts.append(event.delta.text)
                    await _emit(on_delta, "text", event.delta.text)
                elif event.delta.type == "input_json_delta" and event.index in blocks:
                    blocks[event.index]["arguments"] += event.delta.partial_json
            elif kind == "message_delta":
                output_tokens = event.usage.output_tokens
                stop = event.delta.stop_reason or stop
        calls = tuple(ToolCall(**blocks[i]) for i in sorted(blocks))
        return ModelOutput(
            "".join(text_parts), calls, Usage(input_tokens, output_tokens, cached), stop
        )
