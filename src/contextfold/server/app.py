"""The HTTP + SSE server of a journal, and the web inspector page, as a Starlette app.

Routes (JSON unless noted; the namespace is the ``X-Contextfold-Namespace`` header):

    GET  /                                        the inspector page (HTML, no data in it)
    GET  /v1/streams                              a page of streams: ?prefix=&after=&limit=
    POST /v1/streams/{stream}/events              append -> 201 (200: idempotent retry)
    GET  /v1/streams/{stream}/events              a page: ?after=<cursor>&limit=
    GET  /v1/streams/{stream}/context             the agent context, items with headers
    GET  /v1/streams/{stream}/requests/{offset}   the exact rebuilt request body
    GET  /v1/streams/{stream}/verify              recorded requests whose rebuild drifts: ?limit=
    GET  /v1/streams/{stream}/tail                SSE: events as they land (resumable)
    GET  /v1/sessions/{session}/transcript        transcript rows (with transcript=)
    GET  /v1/sessions/{session}/live              SSE of the transcript bus (with bus=)
    GET  /openapi.json                            the OpenAPI 3.1 description of all of it

Errors are JSON ``{"error": {"type", "message"}}`` (see :mod:`.errors`); no failed request
writes anything. The app never opens or closes the journal it is given: its owner does.
Appending is authority only where the operator grants it (see :mod:`.writers`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib import metadata, resources

import orjson
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..errors import ConfigurationError, ContextfoldError
from ..journal import Journal
from ..journal.encode import check_namespace
from ..transcript.bus import TranscriptBus
from ..transcript.store.base import TranscriptStore
from .auth import BearerAuth, token_writers
from .body import DEFAULT_MAX_BODY_BYTES
from .errors import handle_exception
from .guard import HostGuard, PathGuard
from .limits import (
    DEFAULT_BODY_TIMEOUT,
    DEFAULT_EXTRA_REQUESTS,
    RequestLimits,
    check_positive_seconds,
)
from .openapi import OPENAPI_PATH, openapi_schema
from .sessions import SessionRoutes
from .sse import DEFAULT_HEARTBEAT, DEFAULT_MAX_LIVE_STREAMS, StreamSlots
from .streams import StreamRoutes
from .trace import TraceRoutes
from .writers import check_runtime_type_prefixes, check_trusted_actor_types

__all__ = [
    "DEFAULT_MAX_LIVE_STREAMS",
    "DEFAULT_TAIL_POLL_INTERVAL",
    "INSPECTOR_CSP",
    "LOOPBACK_HOSTS",
    "create_app",
]

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")
"""``Host`` names accepted by default when the app has no token (against DNS rebinding)."""

DEFAULT_TAIL_POLL_INTERVAL = 0.25
"""Seconds between polls of a live tail for appends by other processes (this process's
own appends wake tails at once)."""

INSPECTOR_CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The inspector's content security policy: no inline script, no third-party origin, so
even markup slipping into the page could not run."""

_STATIC = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/inspector.js": ("inspector.js", "text/javascript; charset=utf-8"),
    "/inspector.css": ("inspector.css", "text/css; charset=utf-8"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
}


def create_app(
    journal: Journal,
    *,
    transcript: TranscriptStore | None = None,
    bus: TranscriptBus | None = None,
    token: str | None = None,
    trusted_tokens: Iterable[str] = (),
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    heartbeat: float = DEFAULT_HEARTBEAT,
    tail_poll_interval: float = DEFAULT_TAIL_POLL_INTERVAL,
    allowed_hosts: Sequence[str] | None = None,
    trusted_writer: bool = False,
    trusted_actor_types: Iterable[str] = (),
    runtime_type_prefixes: Iterable[str] = (),
    namespaces: Iterable[str] | None = None,
    max_live_streams: int = DEFAULT_MAX_LIVE_STREAMS,
    max_requests: int | None = None,
    max_client_requests: int | None = None,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
) -> Starlette:
    """The server app over ``journal`` (and optionally a transcript store and bus).

    ``token``: require ``Authorization: Bearer <token>`` on every ``/v1/`` route; its
    holder writes as an external client (actor ``http``, id ``token``).
    ``trusted_tokens``: tokens also accepted, whose holders are trusted writers (as with
    ``trusted_writer``, for them only). With any token, every ``/v1/`` route needs one.
    ``max_body_bytes``: larger request bodies get 413 before they are read in full.
    ``heartbeat``: seconds of SSE silence before a comment keeps the stream open.
    ``tail_poll_interval``: seconds between a tail's polls for other processes' appends.
    ``allowed_hosts``: accepted ``Host`` headers (against DNS rebinding). When None: the
    loopback names (:data:`LOOPBACK_HOSTS`) without a token, any host with one.
    ``trusted_writer``: every writer is trusted: the events only the agent runtime writes
    (requests, answers, tool results, checkpoints, …), items posing as the agent or a tool
    and ``agent/`` slots are accepted, and items keep their actors (none: platform
    precedence). Only for a trusted backend that appends on the agent's behalf; by
    default they get 400 and actorless items are stamped ``{"type": "http"}``.
    ``trusted_actor_types``: the actor types the agents trust beyond the built-in ones
    (``cf.register_actor_type(name, trusted=True)`` in their processes); only a trusted
    writer may use them. Whatever this process registered, an external writer's system or
    developer items need a built-in actor type.
    ``runtime_type_prefixes``: type prefixes (``"myapp/"``) of the application's own
    ``runtime_only`` events: only a trusted writer may append them, whether or not this
    process imported their classes (the built-in ones need no declaration).
    ``namespaces``: the namespaces served (others get 403); any namespace when None.
    ``max_live_streams``: SSE streams (``/tail`` and ``/live``) open at once; past it 503.
    ``app.state.live_streams.close()`` ends them all (a server shutting down calls it).
    ``max_requests``: requests in flight at once, live streams included (default
    ``max_live_streams`` + :data:`~.limits.DEFAULT_EXTRA_REQUESTS`); past it 503.
    ``max_client_requests``: of those, from one client address (default half of
    ``max_requests``); past it 429. ``body_timeout``: seconds a request body may take to
    arrive; past it 408 (see :mod:`.limits`).
    Raises ConfigurationError for an empty token, a bad limit or actor type.
    """
    tokens = token_writers(token, trusted_tokens)
    actor_types = check_trusted_actor_types(trusted_actor_types)
    runtime_prefixes = check_runtime_type_prefixes(runtime_type_prefixes)
    for name, limit in (("max_body_bytes", max_body_bytes), ("max_live_streams", max_live_streams)):
        _check_count(name, limit)
    if max_requests is None:
        max_requests = max_live_streams + DEFAULT_EXTRA_REQUESTS
    _check_count("max_requests", max_requests)
    if max_client_requests is None:
        max_client_requests = max(1, max_requests // 2)
    _check_count("max_client_requests", max_client_requests)
    for name, seconds in (
        ("heartbeat", heartbeat),
        ("tail_poll_interval", tail_poll_interval),
        ("body_timeout", body_timeout),
    ):
        check_positive_seconds(name, seconds)
    served: frozenset[str] | None = None
    if namespaces is not None:
        if isinstance(namespaces, str):
            raise ConfigurationError("namespaces must be a collection of names, not one str")
        try:
            served = frozenset(check_namespace(name) for name in namespaces)
        except ContextfoldError as exc:
            raise ConfigurationError(str(exc)) from None
    if allowed_hosts is None and not tokens:
        allowed_hosts = LOOPBACK_HOSTS
    slots = StreamSlots(max_live_streams)
    streams = StreamRoutes(
        journal,
        max_body_bytes=max_body_bytes,
        heartbeat=heartbeat,
        poll_interval=tail_poll_interval,
        slots=slots,
        trusted_writer=trusted_writer,
        trusted_actor_types=actor_types,
        runtime_type_prefixes=runtime_prefixes,
        namespaces=served,
    )
    sessions = SessionRoutes(
        transcript,
        bus,
        default_namespace=journal.namespace,
        heartbeat=heartbeat,
        slots=slots,
        namespaces=served,
    )
    document = openapi_schema(
        max_body_bytes=max_body_bytes,
        authenticated=bool(tokens),
        namespaced=served is not None,
        version=_version(),
    )
    routes: list[BaseRoute] = [
        *streams.routes(),
        *sessions.routes(),
        *TraceRoutes(journal, transcript, bus, namespaces=served).routes(),
        *_inspector_routes(),
        _openapi_route(orjson.dumps(document)),
    ]
    middleware = [
        Middleware(
            RequestLimits,
            max_requests=max_requests,
            max_client_requests=max_client_requests,
            body_timeout=float(body_timeout),
        ),
        Middleware(PathGuard),
    ]
    if allowed_hosts is not None:
        if isinstance(allowed_hosts, str):
            raise ConfigurationError(
                "allowed_hosts must be a collection of host names, not one str"
            )
        middleware.append(Middleware(HostGuard, allowed=tuple(allowed_hosts)))
    if tokens:
        middleware.append(Middleware(BearerAuth, tokens=tokens))
    app = Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={
            HTTPException: handle_exception,
            ContextfoldError: handle_exception,
            Exception: handle_exception,
        },
    )
    app.state.live_streams = slots
    return app


def _check_count(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive int, got {value!r}")


def _version() -> str:
    try:
        return metadata.version("contextfold")
    except metadata.PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "0"


def _openapi_route(document: bytes) -> Route:
    async def openapi(request: Request) -> Response:
        return Response(document, media_type="application/json")

    return Route(OPENAPI_PATH, openapi, methods=["GET"])


def _inspector_routes() -> list[BaseRoute]:
    folder = resources.files(__package__ or "contextfold.server") / "inspector"
    routes: list[BaseRoute] = []
    for path, (name, media_type) in _STATIC.items():
        content = (folder / name).read_bytes()

        async def static(
            request: Request, content: bytes = content, media_type: str = media_type
        ) -> Response:
            return Response(
                content,
                media_type=media_type,
                headers={
                    "Content-Security-Policy": INSPECTOR_CSP,
                    "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer",
                    "Cache-Control": "no-cache",
                },
            )

        routes.append(Route(path, static, methods=["GET"]))
    return routes
