"""Helpers of the server tests: serving an app on loopback, reading SSE, building events, and a
headless Chromium driven over the DevTools protocol."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import select
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.types import ASGIApp

from contextfold.events import Event
from contextfold.server.runner import uvicorn_config

__all__ = [
    "CHROMIUM",
    "CHROMIUM_FLAGS",
    "Chromium",
    "Running",
    "Serve",
    "SseFrame",
    "SseReader",
    "raw",
    "running",
]


# --- serving an app on loopback, reading SSE, building events ---


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


# --- headless Chromium over the DevTools protocol, for the inspector test ---
# ``--dump-dom`` dumps the page at its load event, before the inspector's fetches and its
# EventSource have delivered anything, and ``--virtual-time-budget`` never elapses while an
# EventSource is open. So the test drives the browser instead: Chromium reads protocol
# messages from fd 3 and writes to fd 4 (``--remote-debugging-pipe``), each a JSON object
# ended by a NUL byte. Calls block: run them in a thread while the server's loop serves.


CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


# Put the pipe ends on fds 3 and 4, then become Chromium (dash cannot redirect fds > 9).
_EXEC_ON_FDS_3_AND_4 = (
    "import os, sys; os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4); "
    "os.execv(sys.argv[3], sys.argv[3:])"
)


def _high(fd: int) -> int:
    # Move a pipe end above 4 so putting the other on fd 3 or 4 cannot clobber it.
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


class Chromium:
    """One headless browser with one page attached (``session``)."""

    def __init__(self, profile: Path, log: Path, *, binary: str = CHROMIUM) -> None:
        child_reads, self._to_browser = (_high(fd) for fd in os.pipe())
        self._from_browser, child_writes = (_high(fd) for fd in os.pipe())
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _EXEC_ON_FDS_3_AND_4,
                str(child_reads),
                str(child_writes),
                binary,
                *CHROMIUM_FLAGS,
                "--remote-debugging-pipe",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            pass_fds=(child_reads, child_writes),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
        )
        os.close(child_reads)
        os.close(child_writes)
        self._buffer = b""
        self._next_id = 0
        self.console: list[Any] = []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        attached = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
        self.session: str = attached["sessionId"]
        self.call("Runtime.enable", session=self.session)

    def call(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        *,
        session: str | None = None,
        timeout: float = 20.0,
    ) -> dict[str, Any]:
        """Send one command and return its result; RuntimeError on a protocol error."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("method") == "Runtime.consoleAPICalled":
                self.console.append(reply["params"])
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                result: dict[str, Any] = reply["result"]
                return result

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer in time")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium exited (code {self.process.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        message: dict[str, Any] = json.loads(raw)
        return message

    def navigate(self, url: str) -> None:
        self.call("Page.navigate", {"url": url}, session=self.session)

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page."""
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=self.session,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, *, timeout: float = 20.0) -> Any:
        """Poll until ``expression`` is truthy in the page; return its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression!r} stayed falsy for {timeout}s")
            time.sleep(0.05)

    def dump_dom(self) -> str:
        html: str = self.evaluate("document.documentElement.outerHTML")
        return html

    def close(self) -> None:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):  # it may exit first
            self.call("Browser.close", timeout=5)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()  # our own child, by its handle
            self.process.wait()
        finally:
            os.close(self._to_browser)
            os.close(self._from_browser)
            self._log.close()
