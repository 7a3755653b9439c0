"""Server-sent events: frame encoding and a streaming response that heartbeats and stops.

:class:`EventStreamResponse` sends each :class:`SSEMessage` of an async iterable as it
comes, a comment line when nothing was sent for ``heartbeat`` seconds (so proxies and
clients keep an idle stream open), and stops as soon as the client disconnects: a
separate task waits for ``http.disconnect``, so a tail that is idle does not live on
until its next event. The source iterable is closed in every case.

An error raised by the source after the response started cannot change the status any
more: it is sent as a final ``event: error`` frame with the usual JSON error body.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass

import anyio
from anyio import CancelScope
from anyio.abc import TaskGroup
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .. import canonical
from ..errors import ConfigurationError, ContextfoldError, InvalidInputError
from .errors import TooManyStreamsError, error_body

__all__ = [
    "DEFAULT_HEARTBEAT",
    "DEFAULT_MAX_LIVE_STREAMS",
    "WRITE_CHUNK",
    "EventStreamResponse",
    "SSEMessage",
    "StreamSlots",
    "aclose_iterator",
]

logger = logging.getLogger("contextfold.server")

DEFAULT_HEARTBEAT = 15.0
"""Seconds of silence after which a heartbeat comment is sent."""

_HEARTBEAT = b": heartbeat\n\n"

DEFAULT_MAX_LIVE_STREAMS = 100
"""Open SSE streams (``/tail`` and ``/live`` together) a server holds at once by default."""

WRITE_CHUNK = 64 * 1024
"""The most bytes of a frame handed to the server in one send."""


class StreamSlots:
    """A counter of open SSE streams, shared by every SSE route of an app: a request past
    the limit is refused at once (TooManyStreamsError, 503) instead of waiting.

    :meth:`close` ends every stream for a server that shuts down: they never end by
    themselves, and one cut after the grace period is logged as a failed request.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.closed = False
        self._scopes: set[CancelScope] = set()

    def acquire(self) -> None:
        """Take a slot, or raise TooManyStreamsError. Pair with :meth:`release`."""
        if self.open >= self.limit:
            raise TooManyStreamsError(
                f"this server already holds its limit of {self.limit} live streams: retry later"
            )
        self.open += 1

    def release(self) -> None:
        self.open -= 1

    def close(self) -> None:
        """End every open stream now, and any started later at once (cleanly: the
        client sees the stream end, and an ``EventSource`` reconnects later)."""
        self.closed = True
        for scope in list(self._scopes):
            scope.cancel()

    @contextlib.contextmanager
    def ending(self, scope: CancelScope) -> Iterator[None]:
        """While in the block, :meth:`close` cancels ``scope`` (at once if closed already)."""
        if self.closed:
            scope.cancel()
        self._scopes.add(scope)
        try:
            yield
        finally:
            self._scopes.discard(scope)


@dataclass(frozen=True, slots=True)
class SSEMessage:
    """One SSE frame. ``data`` may hold line breaks (each line becomes a ``data:`` line;
    a client joins them with LF). ``data`` as bytes (UTF-8, e.g. JSON as encoded) is sent
    without another copy of it when it holds no line break."""

    data: str | bytes
    id: str | None = None
    """Sent as ``id:``; the client returns the last one as ``Last-Event-ID`` on reconnect."""
    event: str | None = None
    """Sent as ``event:``; None for the default ``message`` event."""

    def encode(self) -> bytes:
        """The frame as sent. Raises InvalidInputError for an id or event name with a line break."""
        return b"".join(self.pieces())

    def pieces(self) -> tuple[bytes, ...]:
        """The frame as sent, in pieces whose joining is :meth:`encode`: one line of bytes
        ``data`` is a piece of its own, not copied. Raises as :meth:`encode`."""
        lines: list[str] = []
        for name, value in (("event", self.event), ("id", self.id)):
            if value is None:
                continue
            if any(ch in value for ch in "\r\n\0"):
                raise InvalidInputError(f"SSE {name} {value!r} must not contain CR, LF or NUL")
            lines.append(f"{name}: {value}\n")
        data = self.data
        if isinstance(data, bytes):
            if b"\n" not in data and b"\r" not in data:
                return ("".join(lines).encode() + b"data: ", data, b"\n\n")
            data = data.decode()
        # SSE ends a line at CR, LF or CRLF: each becomes its own data: line.
        text = data.replace("\r\n", "\n").replace("\r", "\n")
        lines.extend(f"data: {line}\n" for line in text.split("\n"))
        return (("".join(lines) + "\n").encode(),)


class EventStreamResponse(Response):
    """A ``text/event-stream`` response of the messages of ``source`` (see the module doc)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        source: AsyncIterable[SSEMessage],
        *,
        heartbeat: float = DEFAULT_HEARTBEAT,
        headers: Mapping[str, str] | None = None,
        on_close: Callable[[], None] | None = None,
        slots: StreamSlots | None = None,
    ) -> None:
        if heartbeat <= 0:
            raise ConfigurationError(
                f"heartbeat must be a positive number of seconds, got {heartbeat!r}"
            )
        self.source = source
        self.heartbeat = heartbeat
        self.on_close = on_close
        """Called once when the response ends (or fails), e.g. to free a stream slot."""
        self.slots = slots
        """Closing these (:meth:`StreamSlots.close`) ends the stream."""
        self.status_code = 200
        self.background = None
        # no-cache and no proxy buffering: every frame must reach the client as it is sent
        self.init_headers(
            {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self._respond(scope, receive, send)
        finally:
            if self.on_close is not None:
                on_close, self.on_close = self.on_close, None
                on_close()

    async def _respond(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        if scope.get("method") == "HEAD":
            await aclose_iterator(self.source)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        writer = _Writer(send)
        try:
            await writer.write(b": stream open\n\n")  # headers and a first byte, at once
            async with anyio.create_task_group() as group:
                with (
                    self.slots.ending(group.cancel_scope)
                    if self.slots
                    else contextlib.nullcontext()
                ):
                    group.start_soon(_watch_disconnect, receive, group)
                    group.start_soon(writer.heartbeats, self.heartbeat)
                    await self._pump(writer)
                    group.cancel_scope.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except* OSError:
            pass  # the client went away mid-write: nothing left to tell it

    async def _pump(self, writer: _Writer) -> None:
        # Frames are written by this task as they come; heartbeats by another task, so the
        # source is never cancelled mid-step by a timeout (which could lose an event).
        iterator: AsyncIterator[SSEMessage] = aiter(self.source)
        try:
            async for message in iterator:
                await writer.write(*message.pieces())
        except Exception as exc:
            if not isinstance(exc, ContextfoldError):
                logger.error("event stream source failed", exc_info=exc)
            data = canonical.dumps(error_body(exc)[1]).decode()
            await writer.write(SSEMessage(data, event="error").encode())
        finally:
            with anyio.CancelScope(shield=True):
                await aclose_iterator(iterator)


class _Writer:
    """Serialized body writes, remembering when the last one was sent.

    A frame goes out in sends of at most :data:`WRITE_CHUNK` bytes: the server waits
    before each send while the connection's buffer is over its high-water mark (uvicorn:
    64 KiB), so a client that stops reading holds that much of a large frame there, not
    all of it.
    """

    def __init__(self, send: Send) -> None:
        self._send = send
        self._lock = anyio.Lock()
        self._last = anyio.current_time()

    async def write(self, *pieces: bytes) -> None:
        """Send ``pieces`` as one frame (nothing else between them)."""
        async with self._lock:
            for body in _chunks(pieces):
                await self._send({"type": "http.response.body", "body": body, "more_body": True})
            self._last = anyio.current_time()

    async def heartbeats(self, interval: float) -> None:
        while True:
            idle = anyio.current_time() - self._last
            if idle >= interval:
                await self.write(_HEARTBEAT)
            else:
                await anyio.sleep(interval - idle)


def _chunks(pieces: tuple[bytes, ...]) -> Iterator[bytes]:
    """``pieces`` joined, in sends of at most :data:`WRITE_CHUNK` bytes (one for a frame
    that fits in it)."""
    if sum(map(len, pieces)) <= WRITE_CHUNK:
        yield b"".join(pieces)
        return
    for piece in pieces:
        view = memoryview(piece)
        for start in range(0, len(view), WRITE_CHUNK):
            yield bytes(view[start : start + WRITE_CHUNK])


async def _watch_disconnect(receive: Receive, group: TaskGroup) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    group.cancel_scope.cancel()


async def aclose_iterator(iterator: object) -> None:
    """Close an async iterator that can be closed (an async generator): its ``finally``
    blocks run now, not whenever the garbage collector gets to it."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()
