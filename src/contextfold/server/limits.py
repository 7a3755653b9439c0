"""Requests in flight, counted and bounded, and request bodies read against a deadline.

Limits count requests the app is working on (live streams included), never idle
connections: a connection that has not finished its request headers never reaches the
app (the runner's protocol closes it after its header timeout), so a crowd of silent
sockets cannot turn ordinary requests away. Past ``max_requests`` in flight a request
gets 503, past ``max_client_requests`` from one client address 429 (both with
``Retry-After``); a body that has not fully arrived ``body_timeout`` seconds after the
request started gets 408 and its connection is closed. Behind a proxy every request has
the proxy's address: give the proxy its own limits.
"""

from __future__ import annotations

import math

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import ConfigurationError
from .errors import RequestTimeoutError, ServerBusyError, TooManyRequestsError, error_response

__all__ = [
    "DEFAULT_BODY_TIMEOUT",
    "DEFAULT_EXTRA_REQUESTS",
    "RequestLimits",
    "check_positive_seconds",
]

DEFAULT_EXTRA_REQUESTS = 100
"""Requests in flight allowed beyond ``max_live_streams``: room for ordinary requests
while every stream slot is taken."""

DEFAULT_BODY_TIMEOUT = 30.0
"""Seconds a request body may take to arrive, from the end of its headers."""


def check_positive_seconds(name: str, seconds: object) -> float:
    """``seconds`` as a float; ValueError naming ``name`` unless a positive finite number."""
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds <= 0
    ):
        raise ConfigurationError(
            f"{name} must be a positive, finite number of seconds, got {seconds!r}"
        )
    return float(seconds)


class RequestLimits:
    """ASGI middleware bounding the HTTP requests in flight (in total and per client
    address) and the time their bodies take to arrive."""

    def __init__(
        self, app: ASGIApp, *, max_requests: int, max_client_requests: int, body_timeout: float
    ) -> None:
        self.app = app
        self.max_requests = max_requests
        self.max_client_requests = max_client_requests
        self.body_timeout = body_timeout
        self.in_flight = 0
        self._by_client: dict[str, int] = {}

    def client_requests(self, address: str) -> int:
        """Requests in flight from ``address``."""
        return self._by_client.get(address, 0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = str(client[0]) if client else ""
        if self.in_flight >= self.max_requests:
            busy = ServerBusyError(
                f"the server has {self.in_flight} requests in flight, its limit "
                f"(max_requests={self.max_requests}): retry later"
            )
            await error_response(busy)(scope, receive, send)
            return
        if self.client_requests(address) >= self.max_client_requests:
            crowded = TooManyRequestsError(
                f"client {address or 'unknown'} has {self.client_requests(address)} requests "
                f"in flight, its limit (max_client_requests={self.max_client_requests}): "
                "finish some first"
            )
            await error_response(crowded)(scope, receive, send)
            return
        self.in_flight += 1
        self._by_client[address] = self.client_requests(address) + 1
        try:
            await _Deadline(self.body_timeout).run(self.app, scope, receive, send)
        finally:
            self.in_flight -= 1
            left = self._by_client[address] - 1
            if left:
                self._by_client[address] = left
            else:
                del self._by_client[address]


class _Deadline:
    """One request's body deadline: its ``receive`` fails with RequestTimeoutError once
    the deadline passes with the body incomplete (after the response started, it reports
    the client gone instead: an error could no longer be answered)."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.deadline = anyio.current_time() + timeout
        self.body_done = False
        self.responding = False

    async def run(self, app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
        async def timed_receive() -> Message:
            if self.body_done:
                return await receive()
            try:
                with anyio.fail_after(max(self.deadline - anyio.current_time(), 0)):
                    message = await receive()
            except TimeoutError:
                if self.responding:
                    return {"type": "http.disconnect"}
                raise RequestTimeoutError(
                    f"the request body did not arrive within {self.timeout:g} s: "
                    "nothing was written; send the whole body at once"
                ) from None
            if message["type"] != "http.request" or not message.get("more_body", False):
                self.body_done = True
            return message

        async def watched_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.responding = True
            await send(message)

        await app(scope, timed_receive, watched_send)
