"""Helpers of the server tests: serving an app on loopback, reading SSE, building events."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp

from contextfold.events import Event
from contextfold.server.runner import uvicorn_config

__all__ = [
    "Running",
    "Serve",
    "SseFrame",
    "SseReader",
    "raw",
    "running",
]


@dataclass(frozen=True)
class Running:
    """A served app: its base URL and an httpx client bound to it."""

    url: str
    client: httpx.AsyncClient


Serve = Callable[..., AbstractAsyncContextManager[Running]]


@asynccontextmanager
async def running(app: ASGIApp, **options: Any) -> AsyncIterator[Running]:
    """Serve ``app`` on 127.0.0.1:<free port>, in this loop, until the block ends, with the
    uvicorn configuration ``contextfold serve`` uses (``options`` override it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    settings: dict[str, Any] = {"log_config": None, "log_level": "warning"}
    config = uvicorn_config(app, **{**settings, "timeout_graceful_shutdown": 2, **options})
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        if not server.started:
            await task  # raises what stopped it
            raise RuntimeError("uvicorn did not start")
        url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            yield Running(url, client)
    finally:
        server.should_exit = True
        await task
        sock.close()


@dataclass
class SseFrame:
    """One parsed SSE event (``event`` is ``message`` when the frame names none)."""

    data: str
    id: str | None = None
    event: str = "message"


@dataclass
class SseReader:
    """Parses an httpx streaming response as SSE, counting comment lines (heartbeats)."""

    response: httpx.Response
    comments: list[str] = field(default_factory=list)
    _lines: AsyncIterator[str] | None = None

    async def next(self, timeout: float = 5.0) -> SseFrame:
        """The next event frame; TimeoutError when none comes in time."""
        return await asyncio.wait_for(self._next(), timeout)

    async def next_comment(self, timeout: float = 5.0) -> str:
        """Wait for the next comment line (e.g. a heartbeat)."""
        seen = len(self.comments)

        async def wait() -> str:
            while len(self.comments) == seen:
                await self._line()
            return self.comments[seen]

        return await asyncio.wait_for(wait(), timeout)

    async def rest(self, timeout: float = 5.0) -> list[str]:
        """The remaining non-comment lines, once the server ends the stream."""

        async def collect() -> list[str]:
            lines: list[str] = []
            try:
                while True:
                    line = await self._line()
                    if line:
                        lines.append(line)
            except StopAsyncIteration:
                return lines

        return await asyncio.wait_for(collect(), timeout)

    async def _line(self) -> str | None:
        if self._lines is None:
            self._lines = self.response.aiter_lines()
        line = await anext(self._lines)
        if line.startswith(":"):
            self.comments.append(line[1:].strip())
            return None
        return line

    async def _next(self) -> SseFrame:
        data: list[str] = []
        frame = SseFrame(data="")
        while True:
            line = await self._line()
            if line is None:
                continue
            if line == "":
                if data:
                    frame.data = "\n".join(data)
                    return frame
                frame = SseFrame(data="")
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            elif name == "id":
                frame.id = value
            elif name == "event":
                frame.event = value


def raw(event: Event) -> dict[str, Any]:
    """The HTTP envelope ``{"type", "payload"}`` of a typed event."""
    return {"type": type(event).event_type, "payload": event.model_dump(mode="json")}
