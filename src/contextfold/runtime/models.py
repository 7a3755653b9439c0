"""Model clients: send a rendered request, get the model's output back.

Remote clients send the exact body bytes contextfold rendered through the official SDKs'
low-level ``post`` (so auth, retries and streaming are theirs, and responses and streams are
parsed into the SDKs' types): the bytes on the wire are the recorded bytes, and the recorded
hash is theirs.
:class:`LocalModel` and :class:`FunctionModel` answer offline and deterministically, for
the demo and for users' own tests.
"""

from __future__ import annotations

import abc
import importlib
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._aio import CancelWatch
from ..errors import ModelError
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
    """Anything that completes a request. ``transport`` picks the wire format rendered.

    ``complete`` raises ModelError when the provider fails (streaming included) and lets
    a cancellation through as it is.
    """

    transport: Transport
    model: str

    async def complete(
        self, request: NeutralRequest, rendered: RenderedRequest, *, on_delta: OnDelta | None = None
    ) -> ModelOutput: ...


class _DeltaFailed(Exception):
    """An ``on_delta`` callback raised: the observer failed, not the provider."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


async def _emit(on_delta: OnDelta | None, kind: str, text: str) -> None:
    if on_delta is not None and text:
        try:
            result = on_delta(kind, text)
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            raise _DeltaFailed(exc) from exc


@contextmanager
def _provider_errors(transport: str, model: str) -> Iterator[None]:
    """Translate any failure of a model call, stream iteration included, into ModelError:
    the one place clients' errors enter the error tree. Cancellation is a BaseException
    and passes untouched; an ``on_delta`` callback's own error is re-raised as it was."""
    try:
        yield
    except ModelError:
        raise
    except _DeltaFailed as failed:
        error = failed.error
        raise error from error.__cause__  # as the observer raised it, not chained to the marker
    except Exception as exc:
        raise ModelError(
            f"{transport} request to model {model!r} failed: {type(exc).__name__}: {exc}"
        ) from exc


class FunctionModel:
    """A model that is a Python function of the neutral request (sync or async).

    ``fn(request) -> ModelOutput | str``. For tests of agents built on contextfold: an
    exception ``fn`` raises becomes a ModelError, like a provider failure.
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
        with _provider_errors(self.transport, self.model):
            return await self._complete(request, rendered, on_delta)

    async def _complete(
        self, request: NeutralRequest, rendered: RenderedRequest, on_delta: OnDelta | None
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


class _SDKModel(abc.ABC):
    """A remote model reached through its official SDK.

    The round trip is here, once: send the rendered body bytes as they are, read a whole
    response or a stream (closed however reading ends), and turn failures into ModelError.
    Subclasses name their endpoint and SDK types and read their own protocol.
    """

    transport: Transport

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
    ):
        self.model = model
        self.client = client if client is not None else self._default_client(base_url, api_key)

    async def complete(
        self, request: NeutralRequest, rendered: RenderedRequest, *, on_delta: OnDelta | None = None
    ) -> ModelOutput:
        # The SDK is looked up and called inside the translation: a client missing the
        # endpoint fails as a ModelError, like any provider failure.
        cancel = CancelWatch()
        with _provider_errors(self.transport, self.model):
            body = rendered.json()
            stream = bool(body.get("stream"))
            response = await self._post(body, rendered.body, stream)
            if not stream:
                return self._parse(response)
            try:
                # The SDK may have swallowed a cancel as the stream opened (Python 3.11's
                # wait_for): reading it to its end could take minutes.
                cancel.check()
                return await self._read_stream(response, on_delta)
            finally:
                await response.close()  # on cancel and error too: release the connection

    @staticmethod
    @abc.abstractmethod
    def _default_client(base_url: str | None, api_key: str | None) -> Any:
        """The SDK's async client, when none was given."""

    @abc.abstractmethod
    async def _post(self, body: dict[str, Any], content: bytes, stream: bool) -> Any:
        """POST ``content`` (the rendered bytes, whose parsed value is ``body``) as it is."""

    @staticmethod
    @abc.abstractmethod
    def _parse(response: Any) -> ModelOutput:
        """A whole (not streamed) response."""

    @abc.abstractmethod
    async def _read_stream(self, response: Any, on_delta: OnDelta | None) -> ModelOutput:
        """A streamed response, emitting its text through ``on_delta`` as it comes."""


def _import_sdk(module: str, vendor: str) -> Any:
    """The SDK module of an optional extra, or an ImportError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - extras
        raise ImportError(
            f"{vendor} models need the {module} extra: pip install 'contextfold[{module}]'"
        ) from exc


def _openai_client(base_url: str | None, api_key: str | None) -> Any:
    return _import_sdk("openai", "OpenAI").AsyncOpenAI(base_url=base_url, api_key=api_key)


_JSON_HEADERS = {"Content-Type": "application/json"}


async def _openai_post(
    client: Any, path: str, content: bytes, stream: bool, cast_to: Any, event: Any
) -> Any:
    """POST the exact bytes through the OpenAI SDK, as its ``create`` would (bearer auth)."""
    openai = _import_sdk("openai", "OpenAI")
    return await client.post(
        path,
        cast_to=cast_to,
        content=content,
        options={"headers": _JSON_HEADERS, "security": {"bearer_auth": True}},
        stream=stream,
        stream_cls=openai.AsyncStream[event],
    )


class OpenAIChatModel(_SDKModel):
    """OpenAI Chat Completions, or any OpenAI-compatible server (vLLM, Ollama) via base_url."""

    transport: Transport = "openai-chat"

    _default_client = staticmethod(_openai_client)

    async def _post(self, body: dict[str, Any], content: bytes, stream: bool) -> Any:
        chat = _import_sdk("openai", "OpenAI").types.chat
        return await _openai_post(
            self.client,
            "/chat/completions",
            content,
            stream,
            chat.ChatCompletion,
            chat.ChatCompletionChunk,
        )

    @staticmethod
    def _parse(response: Any) -> ModelOutput:
        choice = response.choices[0]
        calls = tuple(
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments or "")
            for c in (choice.message.tool_calls or ())
        )
        return ModelOutput(
            text=choice.message.content or "",
            tool_calls=calls,
            usage=_openai_usage(response.usage),
            finish_reason=choice.finish_reason or "stop",
        )

    async def _read_stream(self, response: Any, on_delta: OnDelta | None) -> ModelOutput:
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
    """OpenAI's prompt (input) tokens already include the cached ones."""
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


class OpenAIResponsesModel(_SDKModel):
    """The OpenAI Responses API."""

    transport: Transport = "openai-responses"

    _default_client = staticmethod(_openai_client)

    async def _post(self, body: dict[str, Any], content: bytes, stream: bool) -> Any:
        responses = _import_sdk("openai", "OpenAI").types.responses
        return await _openai_post(
            self.client,
            "/responses",
            content,
            stream,
            responses.Response,
            responses.ResponseStreamEvent,
        )

    @staticmethod
    def _parse(response: Any) -> ModelOutput:
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

    async def _read_stream(self, response: Any, on_delta: OnDelta | None) -> ModelOutput:
        """Emits the text deltas; the ``response.completed`` event carries the whole answer."""
        async for event in response:
            if event.type == "response.output_text.delta":
                await _emit(on_delta, "text", event.delta)
            elif event.type == "response.completed":
                return self._parse(event.response)
        raise ModelError(
            f"openai-responses stream for {self.model!r} ended without response.completed"
        )


_ANTHROPIC_PROMPT = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def _anthropic_usage(reports: Iterable[Any], output_tokens: int) -> Usage:
    """Anthropic counts the prompt in three parts (uncached, cache reads, cache writes): its
    size is their sum. A later report (``message_delta``) overrides an earlier one field by
    field where it gives a value."""
    prompt = dict.fromkeys(_ANTHROPIC_PROMPT, 0)
    for report in reports:
        for name in _ANTHROPIC_PROMPT:
            value = getattr(report, name, None)
            if value is not None:
                prompt[name] = value
    return Usage(sum(prompt.values()), output_tokens, prompt["cache_read_input_tokens"])


class AnthropicModel(_SDKModel):
    """Anthropic Messages."""

    transport: Transport = "anthropic"

    @staticmethod
    def _default_client(base_url: str | None, api_key: str | None) -> Any:
        anthropic = _import_sdk("anthropic", "Anthropic")
        return anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key)

    async def _post(self, body: dict[str, Any], content: bytes, stream: bool) -> Any:
        anthropic = _import_sdk("anthropic", "Anthropic")
        options: dict[str, Any] = {"headers": _JSON_HEADERS}
        if not stream and self.client.timeout == anthropic.DEFAULT_TIMEOUT:
            # As messages.create: a whole answer's timeout scales with max_tokens, and one
            # that may take over 10 minutes must be streamed.
            options["timeout"] = self.client._calculate_nonstreaming_timeout(
                body["max_tokens"],
                anthropic._constants.MODEL_NONSTREAMING_TOKENS.get(body["model"]),
            )
        return await self.client.post(
            "/v1/messages",
            cast_to=anthropic.types.Message,
            content=content,
            options=options,
            stream=stream,
            stream_cls=anthropic.AsyncStream[anthropic.types.RawMessageStreamEvent],
        )

    @staticmethod
    def _parse(response: Any) -> ModelOutput:
        text = "".join(b.text for b in response.content if b.type == "text")
        calls = tuple(
            ToolCall(id=b.id, name=b.name, arguments=json.dumps(b.input, sort_keys=True))
            for b in response.content
            if b.type == "tool_use"
        )
        u = response.usage
        return ModelOutput(
            text, calls, _anthropic_usage([u], u.output_tokens), response.stop_reason or "end_turn"
        )

    async def _read_stream(self, response: Any, on_delta: OnDelta | None) -> ModelOutput:
        text_parts: list[str] = []
        blocks: dict[int, dict[str, str]] = {}
        reports: list[Any] = []
        output_tokens = 0
        stop = "end_turn"
        async for event in response:
            kind = event.type
            if kind == "message_start":
                reports.append(event.message.usage)
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
                reports.append(event.usage)
                output_tokens = event.usage.output_tokens
                stop = event.delta.stop_reason or stop
        calls = tuple(ToolCall(**blocks[i]) for i in sorted(blocks))
        return ModelOutput(
            "".join(text_parts), calls, _anthropic_usage(reports, output_tokens), stop
        )
