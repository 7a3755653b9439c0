"""Bearer-token authentication of the API routes.

With a token configured, every request needs ``Authorization: Bearer <token>``, except
the inspector's static files, which hold no data. The check fails closed: a path it does
not know as public (also under a mount prefix it cannot see through) needs the token.
Browsers cannot set headers on an ``EventSource``, so the SSE routes (and only they) also
take the token as an ``access_token`` query parameter (RFC 6750 §2.3); it may then show
up in access logs.
"""

from __future__ import annotations

import hmac

from starlette.datastructures import Headers, QueryParams
from starlette.types import ASGIApp, Receive, Scope, Send

from .errors import AuthenticationError, error_response

__all__ = ["PUBLIC_PATHS", "BearerAuth"]

PUBLIC_PATHS = frozenset({"/", "/inspector.js", "/inspector.css"})
"""Paths served without a token (relative to the app's root path)."""

_SSE_SUFFIXES = ("/tail", "/live")


class BearerAuth:
    """ASGI middleware refusing unauthenticated API requests with a JSON 401."""

    def __init__(self, app: ASGIApp, *, token: str, public: frozenset[str] = PUBLIC_PATHS) -> None:
        if not isinstance(token, str) or not token:
            raise ValueError("the server token must be a non-empty str")
        self.app = app
        self.public = public
        self._token = token.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or _route_path(scope) in self.public:
            await self.app(scope, receive, send)
            return
        given = self._credentials(scope)
        if given is None or not hmac.compare_digest(given.encode(), self._token):
            reason = "no bearer token was sent" if given is None else "the bearer token is wrong"
            response = error_response(
                AuthenticationError(
                    f"{reason}: send the server's token as 'Authorization: Bearer <token>'"
                )
            )
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)

    @staticmethod
    def _credentials(scope: Scope) -> str | None:
        header = Headers(scope=scope).get("authorization")
        if header is not None:
            scheme, _, value = header.partition(" ")
            return value.strip() if scheme.lower() == "bearer" and value.strip() else ""
        if scope["method"] == "GET" and scope["path"].endswith(_SSE_SUFFIXES):
            return QueryParams(scope["query_string"]).get("access_token")
        return None


def _route_path(scope: Scope) -> str:
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path
