"""Bearer-token authentication of the API routes.

With tokens configured, every request needs ``Authorization: Bearer <token>``, except
the inspector's static files, which hold no data. Each token names a
:class:`~.writers.Writer` (the app's ``token`` an external one, each of its
``trusted_tokens`` a trusted one), put in the request's scope for the routes. The check
fails closed: a path it does not know as public (also under a mount prefix it cannot see
through) needs the token.
Browsers cannot set headers on an ``EventSource``, so the SSE routes (and only they) also
take the token as an ``access_token`` query parameter (RFC 6750 §2.3). The server's
access log shows its value masked (:class:`AccessTokenRedaction`, which ``serve`` puts on
uvicorn's access logger).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable, Mapping
from urllib.parse import unquote_plus

from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ConfigurationError
from .errors import AuthenticationError, error_response
from .writers import WRITER_SCOPE_KEY, Writer

__all__ = [
    "ACCESS_TOKEN_PARAMETER",
    "PUBLIC_PATHS",
    "AccessTokenRedaction",
    "BearerAuth",
    "redact_access_token",
    "token_writers",
]

ACCESS_TOKEN_PARAMETER = "access_token"
"""The query parameter an SSE request may carry the token in."""

PUBLIC_PATHS = frozenset({"/", "/inspector.js", "/inspector.css", "/favicon.svg"})
"""Paths served without a token (relative to the app's root path)."""

_SSE_SUFFIXES = ("/tail", "/live")


def token_writers(token: str | None, trusted_tokens: Iterable[str] = ()) -> dict[str, Writer]:
    """Each accepted token with the writer it authenticates: ``token`` an external writer
    (named ``token``), each of ``trusted_tokens`` a trusted one. Empty: no authentication.
    Raises ConfigurationError for an empty token, or a trusted token equal to ``token``."""
    if token is not None and (not isinstance(token, str) or not token):
        raise ConfigurationError("token must be a non-empty str, or None for no authentication")
    if isinstance(trusted_tokens, str):
        raise ConfigurationError("trusted_tokens must be a collection of tokens, not one str")
    tokens = {} if token is None else {token: Writer("token")}
    for trusted in trusted_tokens:
        if not isinstance(trusted, str) or not trusted:
            raise ConfigurationError("every trusted token must be a non-empty str")
        if trusted == token:
            raise ConfigurationError("a trusted token must differ from token")
        tokens[trusted] = Writer("trusted", trusted=True)
    return tokens


class BearerAuth:
    """ASGI middleware refusing unauthenticated API requests with a JSON 401.

    ``tokens`` maps each accepted token to the writer it authenticates. Raises
    ConfigurationError for no token or an empty one.
    """

    def __init__(
        self, app: ASGIApp, *, tokens: Mapping[str, Writer], public: frozenset[str] = PUBLIC_PATHS
    ) -> None:
        if not tokens:
            raise ConfigurationError("the server needs at least one token")
        for token in tokens:
            if not isinstance(token, str) or not token:
                raise ConfigurationError("every server token must be a non-empty str")
        self.app = app
        self.public = public
        self._tokens = tuple((token.encode(), writer) for token, writer in tokens.items())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _route_path(scope) in self.public:
            await self.app(scope, receive, send)
            return
        given = self._credentials(scope)
        writer = None if given is None else self._writer(given.encode())
        if writer is None:
            reason = "no bearer token was sent" if given is None else "the bearer token is wrong"
            response = error_response(
                AuthenticationError(
                    f"{reason}: send the server's token as 'Authorization: Bearer <token>'"
                )
            )
            await response(scope, receive, send)
            return
        await self.app({**scope, WRITER_SCOPE_KEY: writer}, receive, send)

    def _writer(self, given: bytes) -> Writer | None:
        found = None
        for token, writer in self._tokens:  # compare with every token: no early exit
            if hmac.compare_digest(given, token):
                found = writer
        return found

    @staticmethod
    def _credentials(scope: Scope) -> str | None:
        header = Headers(scope=scope).get("authorization")
        if header is not None:
            scheme, _, value = header.partition(" ")
            return value.strip() if scheme.lower() == "bearer" and value.strip() else ""
        if scope["method"] == "GET" and scope["path"].endswith(_SSE_SUFFIXES):
            return QueryParams(scope["query_string"]).get(ACCESS_TOKEN_PARAMETER)
        return None


def _route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def redact_access_token(target: str) -> str:
    """``target`` (a path with its query, as sent) with the value of every
    ``access_token`` parameter masked, however its name is percent-encoded."""
    path, mark, query = target.partition("?")
    if not mark:
        return target
    parts = query.split("&")
    for index, part in enumerate(parts):
        name, _, _ = part.partition("=")
        if unquote_plus(name) == ACCESS_TOKEN_PARAMETER:
            parts[index] = f"{name}=***"
    return f"{path}?{'&'.join(parts)}"


class AccessTokenRedaction(logging.Filter):
    """A log filter masking the token in request targets: put on uvicorn's access logger
    (``uvicorn.access``), whose lines carry each request's path and query."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                redact_access_token(arg) if isinstance(arg, str) else arg for arg in record.args
            )
        return True
