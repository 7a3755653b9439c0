"""uvicorn's HTTP/1.1 protocol (h11) with a deadline for each request's headers.

uvicorn closes a keep-alive connection left idle between requests, but waits forever
for the headers of a request once any byte of it, or nothing at all, has arrived on a
new connection. Here every connection must complete its request headers within
``header_timeout`` seconds of opening, or of its previous response, or it is closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["DEFAULT_HEADER_TIMEOUT", "HeaderTimeoutProtocol", "header_timeout_protocol"]

DEFAULT_HEADER_TIMEOUT = 10.0
"""Seconds a connection has to send its request headers."""


class HeaderTimeoutProtocol(H11Protocol):
    """h11 protocol closing connections whose request headers do not arrive in time."""

    header_timeout: float = DEFAULT_HEADER_TIMEOUT

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._headers_due: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is not h11.IDLE:  # the headers are in
            self._headers_arrived()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._await_headers()  # the next request's headers, on a kept-alive connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_arrived()
        super().connection_lost(exc)

    def _await_headers(self) -> None:
        self._headers_arrived()
        self._headers_due = self.loop.call_later(self.header_timeout, self._headers_late)

    def _headers_arrived(self) -> None:
        if self._headers_due is not None:
            self._headers_due.cancel()
            self._headers_due = None

    def _headers_late(self) -> None:
        self._headers_due = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def header_timeout_protocol(seconds: float) -> type[HeaderTimeoutProtocol]:
    """The protocol class for uvicorn's ``http=`` option, with ``seconds`` to send headers."""
    return type("HeaderTimeoutProtocol", (HeaderTimeoutProtocol,), {"header_timeout": seconds})
