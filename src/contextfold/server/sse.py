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

import logging
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass

import anyio
from anyio.abc import TaskGroup
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .. import canonical
from ..errors import ContextfoldError
from .errors import error_body

__all__ = ["DEFAULT_HEARTBEAT", "EventStreamResponse", "SSEMessage", "aclose_iterator"]

logger = logging.getLogger("contextfold.server")

DEFAULT_HEARTBEAT = 15.0
"""Seconds of silence after which a heartbeat comment is sent."""

_HEARTBEAT = b": heartbeat\n\n"


@dataclass(frozen=True, slots=True)
class SSEMessage:
    """One SSE frame. ``data`` may hold line breaks (each line becomes a ``data:`` line)."""

    data: str
    id: str | None = None
    """Sent as ``id:``; the client returns the last one as ``Last-Event-ID`` on reconnect."""
    event: str | None = None
    """Sent as ``event:``; None for the default ``message`` event."""

    def encode(self) -> bytes:
        """The frame as sent. Raises ValueError for an id or event name with a line break."""
        lines: list[str] = []
        for name, value in (("event", self.event), ("id", self.id)):
            if value is None:
                continue
            if any(ch in value for ch in "\r\n\0"):
                raise ValueError(f"SSE {name} {value!r} must not contain CR, LF or NUL")
            lines.append(f"{name}: {value}")
        lines.extend(f"data: {line}" for line in self.data.replace("\r\n", "\n").split("\n"))
        return ("\n".join(lines) + "\n\n").encode()


class EventStreamResponse(Response):
    """A ``text/event-stream`` response of the messages of ``source`` (see the module doc)."""

    media_type = "text/event-stream"

    def __init__(
        self,
        source: AsyncIterable[SSEMessage],
        *,
        heartbeat: float = DEFAULT_HEARTBEAT,
        retry_ms: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if heartbeat <= 0:
            raise ValueError(f"heartbeat must be a positive number of seconds, got {heartbeat!r}")
        self.source = source
        self.heartbeat = heartbeat
        self.retry_ms = retry_ms
        self.status_code = 200
        self.background = None
        # no-cache and no proxy buffering: every frame must reach the client as it is sent
        self.init_headers(
            {"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})}
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        first = (
            b": stream open\n\n"
            if self.retry_ms is None
            else f"retry: {self.retry_ms}\n\n".encode()
        )
        try:
            await send({"type": "http.response.body", "body": first, "more_body": True})
            async with anyio.create_task_group() as group:
                group.start_soon(self._watch_disconnect, receive, group)
                await self._pump(send, group)
                group.cancel_scope.cancel()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away mid-write: nothing left to tell it

    @staticmethod
    async def _watch_disconnect(receive: Receive, group: TaskGroup) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        group.cancel_scope.cancel()

    async def _pump(self, send: Send, group: TaskGroup) -> None:
        # The source runs in its own task and hands frames over a channel, so waiting for
        # a frame can time out (heartbeat) without cancelling the source mid-step.
        sender, frames = anyio.create_memory_object_stream[bytes](0)
        group.start_soon(self._produce, sender)
        async with frames:
            while True:
                with anyio.move_on_after(self.heartbeat) as waited:
                    try:
                        frame = await frames.receive()
                    except anyio.EndOfStream:
                        return
                if waited.cancelled_caught:
                    frame = _HEARTBEAT
                await send({"type": "http.response.body", "body": frame, "more_body": True})

    async def _produce(self, sender: anyio.abc.ObjectSendStream[bytes]) -> None:
        iterator: AsyncIterator[SSEMessage] = aiter(self.source)
        async with sender:
            try:
                async for message in iterator:
                    await sender.send(message.encode())
            except Exception as exc:
                if not isinstance(exc, ContextfoldError):
                    logger.error("event stream source failed", exc_info=exc)
                data = canonical.dumps(error_body(exc)[1]).decode()
                await sender.send(SSEMessage(data, event="error").encode())
            finally:
                with anyio.CancelScope(shield=True):
                    await aclose_iterator(iterator)


async def aclose_iterator(iterator: object) -> None:
    """Close an async iterator that can be closed (an async generator): its ``finally``
    blocks run now, not whenever the garbage collector gets to it."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()
