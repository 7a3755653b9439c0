"""Model clients: send a rendered request, get the model's output back. Only the I/O.

Remote clients send the exact body bytes contextfold rendered through the official SDKs'
low-level ``post`` (so auth, retries and streaming are theirs, and responses and streams are
parsed into the SDKs' types): the bytes on the wire are the recorded bytes, and the recorded
hash is theirs. What an answer means (text, tool calls, usage) is read by the provider's own
module in ``contextfold.render``, purely; here are the round trip and the translation of
failures into ModelError.
:class:`LocalModel` and :class:`FunctionModel` answer offline and deterministically, for
the demo and for users' own tests.
"""

from __future__ import annotations

import abc
import importlib
import inspect
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Literal, Protocol, cast
from urllib.parse import urlsplit

from .._aio import CancelWatch
from ..context.compaction import check_context_window, known_context_window
from ..errors import ConfigurationError, ModelError
from ..render import anthropic, openai_chat, openai_responses
from ..wire import ModelOutput, NeutralRequest, RenderedRequest, Transport, Usage

__all__ = [
    "LOCAL_SERVER_KEY",
    "AnthropicModel",
    "FunctionModel",
    "ModelClient",
    "OnDelta",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "clock_of",
    "context_window_of",
    "developer_role_of",
]

Clock = Literal["tail", "date"]
"""Where a request states its time: see ``RequestHeader.clock``."""

log = logging.getLogger(__name__)

OnDelta = Callable[[str, str], Awaitable[None] | None]
"""Called with (kind, text) for each streamed fragment; kind is "text" or "reasoning"."""


class ModelClient(Protocol):
    """Anything that completes a request. ``transport`` picks the wire format rendered.

    ``complete`` raises ModelError when the provider fails (streaming included) and lets
    a cancellation through as it is. A client may also have ``developer_role`` (see
    :func:`developer_role_of`) and ``clock`` (see :func:`clock_of`): one without them gets
    its transport's default and the time tail.
    """

    transport: Transport
    model: str

    async def complete(
        self, request: NeutralRequest, rendered: RenderedRequest, *, on_delta: OnDelta | None = None
    ) -> ModelOutput: ...


def developer_role_of(client: ModelClient) -> bool | None:
    """Whether ``client``'s endpoint takes the native ``developer`` role (None: its
    transport's default), as the agent records it in each request header
    (``RequestHeader.developer_role``) so that rebuilds render the same roles."""
    role = getattr(client, "developer_role", None)
    if role is not None and not isinstance(role, bool):
        raise ConfigurationError(
            f"{type(client).__name__}.developer_role must be True, False or None, got {role!r}"
        )
    return role


def clock_of(client: ModelClient) -> Clock:
    """Where requests to ``client`` state their time (``RequestHeader.clock``): ``"tail"``
    unless the client says ``"date"`` (a server whose cache keeps what it generated)."""
    clock = getattr(client, "clock", None)
    if clock is None:
        return "tail"
    if clock not in ("tail", "date"):
        raise ConfigurationError(
            f"{type(client).__name__}.clock must be 'tail', 'date' or None, got {clock!r}"
        )
    return cast(Clock, clock)


async def context_window_of(client: ModelClient) -> tuple[int | None, str]:
    """The context window of ``client``'s model and where it comes from: the client's own
    ``context_window`` (``"option"``); contextfold's table for a model it knows (None,
    ``"table"``); else what the client's server reports (``"server"``, see
    :meth:`_SDKModel.server_context_window`); else None, ``"unreported"`` when the server
    was asked, ``"default"`` for a client without one (both: the default window)."""
    window = getattr(client, "context_window", None)
    if window is not None:
        return check_context_window(window), "option"
    if known_context_window(client.model) is not None:
        return None, "table"
    ask = getattr(client, "server_context_window", None)
    if ask is None:
        return None, "default"  # not a server's model (a function, the local model)
    reported = await ask()
    return (reported, "server") if reported is not None else (None, "unreported")


def _check_clock(clock: Clock | None) -> Clock | None:
    if clock is not None and clock not in ("tail", "date"):
        raise ConfigurationError(f"clock must be 'tail', 'date' or None, got {clock!r}")
    return clock


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
        developer_role: bool | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.fn = fn
        self.clock = _check_clock(clock)
        self.model = model
        self.transport: Transport = transport
        self.stream_chunk = stream_chunk
        self.developer_role = developer_role
        """Whether the requests it gets use the ``developer`` role (None: the transport's
        default), to test an agent as a server without one sees it."""

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
        if output.usage is None:
            # Deterministic usage: request bytes / 4, like the default token counter.
            usage = Usage(
                input_tokens=len(rendered.body) // 4, output_tokens=len(output.text) // 4 + 1
            )
            output = replace(output, usage=usage)
        return output


_UNASKED: Any = object()


def _httpx() -> Any:
    return importlib.import_module("httpx")


def _positive(data: Any, *path: str) -> int | None:
    """The positive int at ``path`` in nested JSON objects, else None."""
    for name in path:
        if not isinstance(data, dict):
            return None
        data = data.get(name)
    return data if isinstance(data, int) and not isinstance(data, bool) and data > 0 else None


def _listed_window(listing: Any, model: str) -> int | None:
    """The window of ``model`` (or of the only model) in an OpenAI-style model list."""
    models = listing.get("data") if isinstance(listing, dict) else None
    if not isinstance(models, list):
        return None
    entries = [m for m in models if isinstance(m, dict)]
    chosen = [m for m in entries if m.get("id") == model] or (entries if len(entries) == 1 else [])
    for entry in chosen:
        window = _positive(entry, "max_model_len") or _positive(entry, "meta", "n_ctx_train")
        if window is not None:
            return window
    return None


class _StreamReader(Protocol):
    """A provider module's pure stream reader (``render.<provider>.StreamReader``)."""

    @property
    def done(self) -> bool: ...

    def feed(self, event: Any) -> tuple[tuple[str, str], ...]: ...

    def result(self) -> ModelOutput | None: ...


class _SDKModel(abc.ABC):
    """A remote model reached through its official SDK.

    The round trip is here, once: send the rendered body bytes as they are, read a whole
    response or a stream (closed however reading ends), and turn failures into ModelError.
    Subclasses name their endpoint and SDK types; their provider module reads the answer.
    """

    transport: Transport
    developer_role: bool | None = None
    """The transport's default: Anthropic has no developer role."""
    _vendor_host: str
    """The domain of the vendor's own API."""

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
        clock: Clock | None = None,
        context_window: int | None = None,
    ):
        self.model = model
        self.client = client if client is not None else self._default_client(base_url, api_key)
        self.context_window = check_context_window(context_window)
        """The model's input limit in tokens, when the caller knows it (None: contextfold's
        table for a model it knows, else the server's report, else the default)."""
        # The vendor's own API caches prompts only: the time tail costs nothing there. Any
        # other server (llama.cpp, vLLM, Ollama) may also keep what it generated, after a
        # tail that the next request no longer has.
        if clock is None:
            clock = "tail" if self._vendor_own() else "date"
        self.clock: Clock = _check_clock(clock) or "tail"
        self._window_reported: int | None = _UNASKED

    async def server_context_window(self) -> int | None:
        """The context window the server reports for the model, or None when it reports none
        (the vendor's own API never does). Asked once per client: llama.cpp's ``/props``
        (the context size of one slot), then the ``/models`` list (vLLM's ``max_model_len``,
        llama.cpp's trained context). A failure reads as no report."""
        if self._window_reported is not _UNASKED:
            return self._window_reported
        window = None
        if not self._vendor_own():
            base = str(self.client.base_url).rstrip("/")
            origin = "{0.scheme}://{0.netloc}".format(urlsplit(base))
            props = await self._get_json(f"{origin}/props")
            window = _positive(props, "default_generation_settings", "n_ctx")
            if window is None:
                window = _listed_window(await self._get_json(f"{base}/models"), self.model)
            if window is None:
                log.info("%s reported no context window for %r", base, self.model)
        self._window_reported = window
        return window

    async def _get_json(self, url: str) -> Any:
        """The JSON at ``url``, or None when there is none (any failure, said at debug)."""
        try:
            response = await self.client.get(
                url, cast_to=_httpx().Response, options={"max_retries": 0}
            )
            return response.json()
        except Exception as exc:
            log.debug("GET %s: %s", url, exc)
            return None

    def _vendor_own(self) -> bool:
        """Whether the client talks to the vendor's own API (a client without a base URL, a
        test double, counts as the vendor's: nothing says otherwise)."""
        base_url = getattr(self.client, "base_url", None)
        if base_url is None:
            return True
        host = (urlsplit(str(base_url)).hostname or "").lower()
        return host == self._vendor_host or host.endswith("." + self._vendor_host)

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

    @abc.abstractmethod
    def _parse(self, response: Any) -> ModelOutput:
        """A whole (not streamed) answer: the provider module's ``parse_response``."""

    @abc.abstractmethod
    def _reader(self) -> _StreamReader:
        """A reader of a streamed answer: the provider module's ``StreamReader``."""

    async def _read_stream(self, response: Any, on_delta: OnDelta | None) -> ModelOutput:
        """A streamed response, emitting its text through ``on_delta`` as it comes."""
        reader = self._reader()
        async for event in response:
            for kind, text in reader.feed(event):
                await _emit(on_delta, kind, text)
            if reader.done:
                break
        output = reader.result()
        if output is None:
            raise ModelError(
                f"{self.transport} stream for {self.model!r} ended before its final event"
            )
        return output


def _import_sdk(module: str, vendor: str) -> Any:
    """The SDK module of an optional extra, or an ImportError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - extras
        raise ImportError(
            f"{vendor} models need the {module} extra: pip install 'contextfold[{module}]'"
        ) from exc


LOCAL_SERVER_KEY = "no-key"
"""The API key sent to an OpenAI-compatible server given by base URL when no key is set:
local servers (vLLM, Ollama) take any key, but the SDK refuses to start without one."""


def _openai_client(base_url: str | None, api_key: str | None) -> Any:
    no_key = api_key is None and not os.environ.get("OPENAI_API_KEY")
    if no_key and (base_url or os.environ.get("OPENAI_BASE_URL")):
        api_key = LOCAL_SERVER_KEY
    return _import_sdk("openai", "OpenAI").AsyncOpenAI(base_url=base_url, api_key=api_key)


class _OpenAIModel(_SDKModel):
    """An OpenAI transport, on OpenAI's API or any server that speaks it (base_url).

    Only OpenAI's own API is known to take the ``developer`` role: a client pointed at
    another server (vLLM, Ollama, llama.cpp, whose chat templates may know no such role)
    sends trusted context as ``system`` unless ``developer_role=True`` confirms it has
    one; ``developer_role=False`` sends ``system`` to OpenAI too. Such a client also states
    each request's date in its system text, not its time in a tail (``clock``, see
    ``RequestHeader.clock``), unless ``clock="tail"``.
    """

    _default_client = staticmethod(_openai_client)
    _vendor_host = "openai.com"

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
        developer_role: bool | None = None,
        clock: Clock | None = None,
        context_window: int | None = None,
    ):
        super().__init__(
            model,
            client=client,
            base_url=base_url,
            api_key=api_key,
            clock=clock,
            context_window=context_window,
        )
        if developer_role is not None and not isinstance(developer_role, bool):
            raise ConfigurationError(
                f"developer_role must be True, False or None, got {developer_role!r}"
            )
        if developer_role is None and not self._vendor_own():
            developer_role = False
        # None on OpenAI's own API: the transport's default, as requests recorded before
        # this setting existed (their headers, and so their rebuilds, stay as they were).
        self.developer_role = developer_role


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


class OpenAIChatModel(_OpenAIModel):
    """OpenAI Chat Completions, or any OpenAI-compatible server (vLLM, Ollama) via base_url
    (which sends trusted context as ``system`` unless ``developer_role=True``)."""

    transport: Transport = "openai-chat"

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

    def _parse(self, response: Any) -> ModelOutput:
        return openai_chat.parse_response(response)

    def _reader(self) -> _StreamReader:
        return openai_chat.StreamReader()


class OpenAIResponsesModel(_OpenAIModel):
    """The OpenAI Responses API."""

    transport: Transport = "openai-responses"

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

    def _parse(self, response: Any) -> ModelOutput:
        return openai_responses.parse_response(response)

    def _reader(self) -> _StreamReader:
        return openai_responses.StreamReader()


class AnthropicModel(_SDKModel):
    """Anthropic Messages (a server other than Anthropic's, by base_url, gets
    ``clock="date"`` unless told otherwise, as :class:`OpenAIChatModel`)."""

    transport: Transport = "anthropic"
    _vendor_host = "anthropic.com"

    @staticmethod
    def _default_client(base_url: str | None, api_key: str | None) -> Any:
        sdk = _import_sdk("anthropic", "Anthropic")
        return sdk.AsyncAnthropic(base_url=base_url, api_key=api_key)

    async def _post(self, body: dict[str, Any], content: bytes, stream: bool) -> Any:
        sdk = _import_sdk("anthropic", "Anthropic")
        options: dict[str, Any] = {"headers": _JSON_HEADERS}
        if not stream and self.client.timeout == sdk.DEFAULT_TIMEOUT:
            # As messages.create: a whole answer's timeout scales with max_tokens, and one
            # that may take over 10 minutes must be streamed.
            options["timeout"] = self.client._calculate_nonstreaming_timeout(
                body["max_tokens"],
                sdk._constants.MODEL_NONSTREAMING_TOKENS.get(body["model"]),
            )
        return await self.client.post(
            "/v1/messages",
            cast_to=sdk.types.Message,
            content=content,
            options=options,
            stream=stream,
            stream_cls=sdk.AsyncStream[sdk.types.RawMessageStreamEvent],
        )

    def _parse(self, response: Any) -> ModelOutput:
        return anthropic.parse_response(response)

    def _reader(self) -> _StreamReader:
        return anthropic.StreamReader()
