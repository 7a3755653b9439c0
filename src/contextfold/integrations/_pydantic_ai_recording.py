"""What a pydantic-ai agent sends its model, recorded on a journal stream: :class:`RecordingModel`.

Before each request (streamed or not) the wrapper appends, in one append, a
``pydantic-ai/sent-message`` event for each message the stream has not recorded yet (the
message's JSON and its SHA-256) and a ``pydantic-ai/request-sent`` event naming the request's
messages by digest, with the model settings and request parameters as JSON and the SHA-256 of
the whole request. A message sent again in the next request is not stored again, so the record
grows with the conversation, not with its square. Nothing is sent when the record cannot be
written.

:func:`recorded_requests` reads the record back, :func:`verify_recorded` recomputes every digest,
and :func:`messages_digest` is the digest a request's messages are compared by: equal to a
record's ``messages_sha256`` exactly when the messages are the ones that were sent.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import AsyncGenerator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import TypeAdapter
from pydantic_ai import RunContext
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import KnownModelName, Model, ModelRequestParameters, StreamedResponse
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_core import to_jsonable_python
from pyrsistent import PSet, pset

from ..canonical import canonical_json, sha256_hex
from ..errors import InvalidInputError
from ..events import Envelope, Event
from ..folds.fold import Fold
from ..journal import Journal, SyncJournal
from ..journal.encode import check_stream
from ._journal_bridge import JournalBridge

__all__ = [
    "PydanticAiRequestSent",
    "PydanticAiSentMessage",
    "RecordedRequest",
    "RecordingModel",
    "messages_digest",
    "parameters_json",
    "recorded_requests",
    "request_digest",
    "settings_json",
    "verify_recorded",
]

_PARAMETERS: TypeAdapter[ModelRequestParameters] = TypeAdapter(ModelRequestParameters)


class PydanticAiSentMessage(Event, type="pydantic-ai/sent-message", runtime_only=True):
    """A message as sent to a model (pydantic-ai's JSON), stored once per stream."""

    sha256: str
    """SHA-256 of the message's canonical JSON."""
    message: dict[str, Any]


class PydanticAiRequestSent(Event, type="pydantic-ai/request-sent", runtime_only=True):
    """One request a pydantic-ai agent sent its model."""

    model: str
    messages: tuple[str, ...]
    """The SHA-256 of each message, in the order sent."""
    messages_sha256: str
    """:func:`messages_digest` of the messages."""
    settings: dict[str, Any] | None
    parameters: dict[str, Any]
    sha256: str
    """:func:`request_digest` of the whole request."""


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """A recorded request, as read back from the journal."""

    position: int
    model: str
    messages: tuple[ModelMessage, ...]
    settings: Any
    parameters: Any
    messages_sha256: str
    sha256: str


_SENT: Fold[PSet[str]] = Fold("pydantic_ai_sent_messages", initial=lambda: pset())


@_SENT.on(PydanticAiSentMessage)
def _sent(state: PSet[str], env: Envelope[PydanticAiSentMessage]) -> PSet[str]:
    return state.add(env.payload.sha256)


def _dumped(messages: Sequence[ModelMessage]) -> list[dict[str, Any]]:
    dumped: list[dict[str, Any]] = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    return dumped


def messages_digest(messages: Sequence[ModelMessage]) -> str:
    """SHA-256 of the canonical JSON of ``messages`` as pydantic-ai dumps them."""
    return sha256_hex(canonical_json(_dumped(messages)))


def settings_json(settings: ModelSettings | None) -> dict[str, Any] | None:
    """Model settings as the JSON a record stores (what no encoder knows: its repr)."""
    if settings is None:
        return None
    dumped: dict[str, Any] = to_jsonable_python(settings, fallback=repr)
    return dumped


def parameters_json(parameters: ModelRequestParameters) -> dict[str, Any]:
    """Request parameters (tools, output mode, instructions) as the JSON a record stores,
    sets sorted."""
    dumped: dict[str, Any] = _PARAMETERS.dump_python(parameters, mode="json", fallback=repr)
    for field in dataclasses.fields(parameters):
        value = getattr(parameters, field.name)
        if isinstance(value, (set, frozenset)) and field.name in dumped:
            dumped[field.name] = sorted(dumped[field.name], key=repr)  # sets have no order
    return dumped


def request_digest(
    model: str,
    messages: Sequence[ModelMessage] | Sequence[dict[str, Any]],
    settings: Any,
    parameters: Any,
) -> str:
    """SHA-256 of a request: canonical JSON of model, messages, settings and parameters (the
    JSON forms a record stores; messages may be given as messages or as their JSON)."""
    listed: list[Any] = list(messages)
    if listed and not isinstance(listed[0], dict):
        listed = _dumped(listed)
    body = {"model": model, "messages": listed, "settings": settings, "parameters": parameters}
    return sha256_hex(canonical_json(body))


class RecordingModel(WrapperModel):
    """A pydantic-ai model that records every request on ``stream`` before sending it to
    ``wrapped`` (see the module docstring). Raises InvalidInputError for a bad journal or
    stream; a request whose record cannot be appended raises the journal's error unsent.
    """

    def __init__(
        self,
        wrapped: Model | KnownModelName | str,
        journal: Journal | SyncJournal,
        stream: str,
    ) -> None:
        super().__init__(wrapped)
        self._bridge = JournalBridge(journal, what="RecordingModel")
        self._stream = check_stream(stream)

    @property
    def stream(self) -> str:
        """The stream requests are recorded on."""
        return self._stream

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        await self._record(messages, model_settings, model_request_parameters)
        return await self.wrapped.request(messages, model_settings, model_request_parameters)

    @asynccontextmanager
    async def request_stream(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
        run_context: RunContext[Any] | None = None,
    ) -> AsyncGenerator[StreamedResponse, None]:
        await self._record(messages, model_settings, model_request_parameters)
        async with self.wrapped.request_stream(
            messages, model_settings, model_request_parameters, run_context
        ) as streamed:
            yield streamed

    async def _record(
        self,
        messages: list[ModelMessage],
        settings: ModelSettings | None,
        parameters: ModelRequestParameters,
    ) -> None:
        dumped = _dumped(messages)
        digests = [sha256_hex(canonical_json(message)) for message in dumped]
        settings_dumped = settings_json(settings)
        parameters_dumped = parameters_json(parameters)
        model: str = self.model_id
        sent = PydanticAiRequestSent(
            model=model,
            messages=tuple(digests),
            messages_sha256=sha256_hex(canonical_json(dumped)),
            settings=settings_dumped,
            parameters=parameters_dumped,
            sha256=request_digest(model, dumped, settings_dumped, parameters_dumped),
        )
        await self._bridge.arun(functools.partial(self._append, dumped, digests, sent))

    async def _append(
        self, dumped: list[dict[str, Any]], digests: list[str], sent: PydanticAiRequestSent
    ) -> None:
        journal = self._bridge.journal
        known = await journal.fold(_SENT, self._stream)
        fresh: dict[str, dict[str, Any]] = {}
        for digest, message in zip(digests, dumped, strict=True):
            if digest not in known and digest not in fresh:
                fresh[digest] = message
        events: list[Event] = [PydanticAiSentMessage(sha256=d, message=m) for d, m in fresh.items()]
        await journal.append(self._stream, [*events, sent])


_Messages = dict[str, tuple[int, bytes, bytes]]
"""Digest -> (position, stored JSON, canonical JSON) of each recorded message."""


async def _records(
    journal: Journal, stream: str
) -> tuple[_Messages, list[tuple[int, PydanticAiRequestSent]]]:
    messages: _Messages = {}
    requests: list[tuple[int, PydanticAiRequestSent]] = []
    types: list[type[Event]] = [PydanticAiSentMessage, PydanticAiRequestSent]
    async for stored in journal.read_all(stream, types=types):
        event = stored.decode()
        if isinstance(event, PydanticAiSentMessage):
            stored_json = orjson.dumps(event.message)
            found = (stored.position, stored_json, canonical_json(event.message))
            messages.setdefault(event.sha256, found)
        elif isinstance(event, PydanticAiRequestSent):
            requests.append((stored.position, event))
    return messages, requests


async def _read(
    journal: Journal | SyncJournal, stream: str
) -> tuple[_Messages, list[tuple[int, PydanticAiRequestSent]]]:
    bridge = JournalBridge(journal, what="reading recorded requests")
    return await bridge.arun(functools.partial(_records, bridge.journal, check_stream(stream)))


async def recorded_requests(
    journal: Journal | SyncJournal, stream: str
) -> tuple[RecordedRequest, ...]:
    """Every request recorded on ``stream``, oldest first, with its messages decoded by
    pydantic-ai's adapter. Raises InvalidInputError naming the request whose messages are
    missing from the stream."""
    messages, requests = await _read(journal, stream)
    found: list[RecordedRequest] = []
    for position, sent in requests:
        missing = [d for d in sent.messages if d not in messages]
        if missing:
            raise InvalidInputError(
                f"stream {stream!r} position {position}: the request names message "
                f"{missing[0][:12]}… which the stream does not hold"
            )
        body = b"[" + b",".join(messages[d][1] for d in sent.messages) + b"]"
        found.append(
            RecordedRequest(
                position=position,
                model=sent.model,
                messages=tuple(ModelMessagesTypeAdapter.validate_json(body)),
                settings=sent.settings,
                parameters=sent.parameters,
                messages_sha256=sent.messages_sha256,
                sha256=sent.sha256,
            )
        )
    return tuple(found)


async def verify_recorded(journal: Journal | SyncJournal, stream: str) -> tuple[str, ...]:
    """What does not add up in the record on ``stream``: each problem names the position at
    fault (a message whose JSON no longer has its digest, a request naming a message the
    stream lacks, or whose digest differs from its content). Empty when it is intact."""
    messages, requests = await _read(journal, stream)
    problems: list[str] = []
    for digest, (position, _, canonical) in messages.items():
        if sha256_hex(canonical) != digest:
            problems.append(f"position {position}: the message's JSON does not have its digest")
    for position, sent in requests:
        missing = [d for d in sent.messages if d not in messages]
        if missing:
            problems.append(f"position {position}: message {missing[0][:12]}… is not recorded")
            continue
        dumped = [orjson.loads(messages[d][2]) for d in sent.messages]
        if sha256_hex(canonical_json(dumped)) != sent.messages_sha256:
            problems.append(f"position {position}: the messages do not have the request's digest")
        elif request_digest(sent.model, dumped, sent.settings, sent.parameters) != sent.sha256:
            problems.append(f"position {position}: the request does not have its digest")
    return tuple(problems)
