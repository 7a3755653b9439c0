"""Checks before routing: the ``Host`` header (against DNS rebinding) and the path bytes.

Both answer with the service's JSON error body (400), never a plain-text page, and
nothing behind them runs for a refused request.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import unquote_to_bytes

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ConfigurationError, InvalidInputError
from .errors import HostNotAllowedError, error_response

__all__ = ["HostGuard", "PathGuard", "host_name"]


def host_name(header: str | None) -> str | None:
    """The host of a ``Host`` header value, lowercase and without the port (IPv6 keeps
    its brackets: ``[::1]``); None when there is none."""
    if not header:
        return None
    if header.startswith("["):
        end = header.find("]")
        if end < 0:
            return None
        rest = header[end + 1 :]
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            return None
        return header[: end + 1].lower()
    name, colon, port = header.rpartition(":")
    if not colon:
        name = header
    elif not port.isdigit() or ":" in name:
        return None
    return name.lower() or None


class HostGuard:
    """ASGI middleware serving only the ``Host`` names in ``allowed``: exact names,
    ``*.example.com`` for a domain's subdomains, or ``*`` for any."""

    def __init__(self, app: ASGIApp, *, allowed: Sequence[str]) -> None:
        for pattern in allowed:
            wild = "*" in pattern[1:] or (pattern.startswith("*") and not pattern.startswith("*."))
            if wild and pattern != "*":
                raise ConfigurationError(f"host pattern {pattern!r} must be a name or '*.domain'")
        self.app = app
        self.allowed = tuple(pattern.lower() for pattern in allowed)
        self.any = "*" in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.any or scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("host")
        host = host_name(header)
        if host is None or not any(self._matches(host, pattern) for pattern in self.allowed):
            shown = "no Host header" if header is None else f"the Host header {header[:100]!r}"
            refusal = HostNotAllowedError(
                f"{shown} is not served here: this server answers to "
                f"{', '.join(self.allowed)} (against DNS rebinding; a server with a token "
                "answers to any host)"
            )
            await error_response(refusal)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _matches(host: str, pattern: str) -> bool:
        return host == pattern or (pattern.startswith("*.") and host.endswith(pattern[1:]))


class PathGuard:
    """ASGI middleware refusing a path or query string that is not UTF-8 once
    percent-decoded (``/v1/streams/%ff/events``): servers decode such bytes to U+FFFD,
    which would name another stream than the one sent."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            raw_path = scope.get("raw_path")
            query: bytes = scope.get("query_string", b"")
            for what, raw in (("path", raw_path), ("query string", query)):
                if raw and not _is_utf8(raw):
                    shown = raw.decode("latin-1")[:200]
                    refusal = InvalidInputError(
                        f"the {what} {shown!r} is not valid UTF-8 once percent-decoded: "
                        "percent-encode the UTF-8 bytes of the name"
                    )
                    await error_response(refusal)(scope, receive, send)
                    return
        await self.app(scope, receive, send)


def _is_utf8(raw: bytes) -> bool:
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
