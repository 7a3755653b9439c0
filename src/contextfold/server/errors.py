"""HTTP errors: contextfold's error tree mapped to status codes and JSON bodies, in one place.

Every error response of the server, from a route, the auth check or the router, is built
by :func:`error_response`: ``{"error": {"type": <class name>, "message": <text>}}`` with
the status of the first matching entry of :data:`STATUS`. The server's own errors are
subclasses of the tree, so a Python caller catching ``InvalidInputError`` catches them too.

    ContextfoldError
    ├── AuthenticationError          401  token configured, missing or wrong
    ├── ForbiddenError               403  a namespace outside the server's allow-list
    ├── NotFoundError                404  unknown route, or a surface this server lacks
    ├── RebuildError                 404  the offset is no recorded request
    ├── RefError                     404  the offset holds no tool output or context item
    ├── UnknownStreamError           404  a read of a stream without events
    ├── UnknownCursorError           404  ``after`` names no event of the stream
    ├── StoreError
    │   ├── ConflictError            409  wrong expected version, idempotency key reuse
    │   ├── StorageFullError         507  the disk is full or a file-size quota is reached
    │   └── StoreUnavailableError    503
    ├── TooManyStreamsError          503  every live-stream (SSE) slot is taken
    ├── TooManyRequestsError         429  this client address has its share in flight
    ├── ServerBusyError              503  the server has its limit of requests in flight
    └── InvalidInputError            400  bad names, payloads, query values, paths
        ├── RequestBodyError         400  not JSON, unknown or missing fields
        ├── HostNotAllowedError      400  a ``Host`` header the server does not serve
        ├── RequestTimeoutError      408  the body did not arrive in time
        ├── BodyTooLargeError        413
        └── UnsupportedMediaTypeError 415
"""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import (
    ConflictError,
    ContextfoldError,
    InvalidInputError,
    RebuildError,
    RefError,
    StorageFullError,
    StoreFileMovedError,
    StoreUnavailableError,
    UnknownCursorError,
    UnknownStreamError,
)

__all__ = [
    "STATUS",
    "AuthenticationError",
    "BodyTooLargeError",
    "ForbiddenError",
    "HostNotAllowedError",
    "NotFoundError",
    "RequestBodyError",
    "RequestTimeoutError",
    "ServerBusyError",
    "TooManyRequestsError",
    "TooManyStreamsError",
    "UnsupportedMediaTypeError",
    "error_body",
    "error_response",
    "handle_exception",
]

logger = logging.getLogger("contextfold.server")


class AuthenticationError(ContextfoldError):
    """The server has a token and the request's ``Authorization: Bearer`` is missing or wrong."""


class ForbiddenError(ContextfoldError, PermissionError):
    """The request names a namespace this server does not serve (``namespaces=``)."""


class TooManyStreamsError(ContextfoldError):
    """Every live-stream slot (``max_live_streams``) is taken: retry later."""


class TooManyRequestsError(ContextfoldError):
    """The client's address has its share of requests in flight (``max_client_requests``)."""


class ServerBusyError(ContextfoldError):
    """The server has its limit of requests in flight (``max_requests``): retry later."""


class NotFoundError(ContextfoldError, LookupError):
    """No such route, or the server was started without the surface asked for."""


class RequestBodyError(InvalidInputError):
    """The request body is not a JSON object of the documented shape (names the field)."""


class HostNotAllowedError(InvalidInputError):
    """The ``Host`` header names a host the server does not serve (against DNS rebinding)."""


class RequestTimeoutError(InvalidInputError):
    """The request body did not arrive within the server's body timeout; nothing was written."""


class BodyTooLargeError(InvalidInputError):
    """The request body is over the server's size limit; nothing was read past it."""


class UnsupportedMediaTypeError(InvalidInputError):
    """A request body was sent with another content type than ``application/json``."""


STATUS: tuple[tuple[type[BaseException], int], ...] = (
    (AuthenticationError, 401),
    (ForbiddenError, 403),
    (NotFoundError, 404),
    (RebuildError, 404),
    (RefError, 404),
    (UnknownStreamError, 404),
    (UnknownCursorError, 404),  # before InvalidInputError, its base: a well-formed cursor
    (ConflictError, 409),
    (RequestTimeoutError, 408),
    (BodyTooLargeError, 413),
    (UnsupportedMediaTypeError, 415),
    (InvalidInputError, 400),
    (StorageFullError, 507),
    (StoreUnavailableError, 503),
    (StoreFileMovedError, 503),  # reopening the journal, not a retry, fixes it
    (TooManyStreamsError, 503),
    (TooManyRequestsError, 429),
    (ServerBusyError, 503),
    (ContextfoldError, 500),
)
"""Status of each error class; the first entry the error is an instance of wins."""

_HTTP_TYPES = {404: "NotFoundError", 405: "MethodNotAllowedError"}


def error_body(exc: BaseException) -> tuple[int, dict[str, dict[str, str]]]:
    """The status and JSON body for ``exc`` (500 ``InternalError`` for anything unexpected)."""
    if isinstance(exc, HTTPException):
        kind = _HTTP_TYPES.get(exc.status_code, "HTTPError")
        return exc.status_code, {"error": {"type": kind, "message": str(exc.detail)}}
    for cls, status in STATUS:
        if isinstance(exc, cls):
            return status, {"error": {"type": type(exc).__name__, "message": str(exc)}}
    return 500, {"error": {"type": "InternalError", "message": "internal server error"}}


def error_response(exc: BaseException) -> Response:
    """The JSON error response for ``exc``."""
    status, body = error_body(exc)
    headers = {"WWW-Authenticate": 'Bearer realm="contextfold"'} if status == 401 else None
    if isinstance(exc, TooManyRequestsError | ServerBusyError):
        headers = {"Retry-After": "1"}
    elif isinstance(exc, RequestTimeoutError):
        headers = {"Connection": "close"}  # the rest of the body is not worth waiting for
    if isinstance(exc, HTTPException) and exc.headers:
        headers = {**(headers or {}), **exc.headers}
    return JSONResponse(body, status_code=status, headers=headers)


async def handle_exception(request: Request, exc: Exception) -> Response:
    """Starlette exception handler: every error a route raises goes through here. A fault
    the server expects (a full disk) is logged in one line, without a traceback."""
    if isinstance(exc, StorageFullError):
        logger.error("%s %s failed: %s", request.method, request.url.path, exc)
    elif error_body(exc)[0] >= 500 and not isinstance(exc, TooManyStreamsError):
        logger.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(exc)
