"""The HTTP + SSE server of a journal, and the web inspector page, as a Starlette app.

Routes (JSON unless noted; the namespace is the ``X-Contextfold-Namespace`` header):

    GET  /                                        the inspector page (HTML, no data in it)
    GET  /v1/streams                              streams with their versions
    POST /v1/streams/{stream}/events              append -> 201 (200: idempotent retry)
    GET  /v1/streams/{stream}/events              a page: ?after=<cursor>&limit=
    GET  /v1/streams/{stream}/context             the agent context, items with headers
    GET  /v1/streams/{stream}/requests/{offset}   the exact rebuilt request body
    GET  /v1/streams/{stream}/verify              recorded requests whose rebuild drifts
    GET  /v1/streams/{stream}/tail                SSE: events as they land (resumable)
    GET  /v1/sessions/{session}/transcript        transcript rows (with transcript=)
    GET  /v1/sessions/{session}/live              SSE of the transcript bus (with bus=)

Errors are JSON ``{"error": {"type", "message"}}`` (see :mod:`.errors`); no failed request
writes anything. The app never opens or closes the journal it is given: its owner does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from importlib import resources

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..errors import ContextfoldError
from ..journal import Journal
from ..store.base import check_namespace
from ..transcript.bus import TranscriptBus
from ..transcript.store.base import TranscriptStore
from .auth import BearerAuth
from .body import DEFAULT_MAX_BODY_BYTES
from .errors import handle_exception
from .sessions import SessionRoutes
from .sse import DEFAULT_HEARTBEAT, DEFAULT_MAX_LIVE_STREAMS, StreamSlots
from .streams import StreamRoutes

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
}


def create_app(
    journal: Journal,
    *,
    transcript: TranscriptStore | None = None,
    bus: TranscriptBus | None = None,
    token: str | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    heartbeat: float = DEFAULT_HEARTBEAT,
    tail_poll_interval: float = DEFAULT_TAIL_POLL_INTERVAL,
    allowed_hosts: Sequence[str] | None = None,
    trusted_writer: bool = False,
    namespaces: Iterable[str] | None = None,
    max_live_streams: int = DEFAULT_MAX_LIVE_STREAMS,
) -> Starlette:
    """The server app over ``journal`` (and optionally a transcript store and bus).

    ``token``: require ``Authorization: Bearer <token>`` on every ``/v1/`` route.
    ``max_body_bytes``: larger request bodies get 413 before they are read in full.
    ``heartbeat``: seconds of SSE silence before a comment keeps the stream open.
    ``tail_poll_interval``: seconds between a tail's polls for other processes' appends.
    ``allowed_hosts``: accepted ``Host`` headers (against DNS rebinding). When None: the
    loopback names (:data:`LOOPBACK_HOSTS`) without a token, any host with one.
    ``trusted_writer``: accept appends of the events only the agent runtime writes (LLM
    requests and responses, recorded requests, interruptions, halts, fold checkpoints,
    and context items posing as the agent's own). Only for a trusted backend that appends
    on the agent's behalf; by default they get 400, so a client cannot forge the agent.
    ``namespaces``: the namespaces served (others get 403); any namespace when None.
    ``max_live_streams``: SSE streams (``/tail`` and ``/live``) open at once; past it 503.
    ``app.state.live_streams.close()`` ends them all (a server shutting down calls it).
    Raises ValueError for an empty token or a bad limit.
    """
    if token is not None and not token:
        raise ValueError("token must be a non-empty str, or None for no authentication")
    for name, limit in (("max_body_bytes", max_body_bytes), ("max_live_streams", max_live_streams)):
        if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
            raise ValueError(f"{name} must be a positive int, got {limit!r}")
    for name, seconds in (("heartbeat", heartbeat), ("tail_poll_interval", tail_poll_interval)):
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, int | float)
            or not math.isfinite(seconds)
            or seconds <= 0
        ):
            raise ValueError(
                f"{name} must be a positive, finite number of seconds, got {seconds!r}"
            )
    served: frozenset[str] | None = None
    if namespaces is not None:
        if isinstance(namespaces, str):
            raise ValueError("namespaces must be a collection of names, not one str")
        try:
            served = frozenset(check_namespace(name) for name in namespaces)
        except ContextfoldError as exc:
            raise ValueError(str(exc)) from None
    if allowed_hosts is None and token is None:
        allowed_hosts = LOOPBACK_HOSTS
    slots = StreamSlots(max_live_streams)
    streams = StreamRoutes(
        journal,
        max_body_bytes=max_body_bytes,
        heartbeat=heartbeat,
        poll_interval=tail_poll_interval,
        slots=slots,
        trusted_writer=trusted_writer,
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
    routes: list[BaseRoute] = [*streams.routes(), *sessions.routes(), *_inspector_routes()]
    middleware: list[Middleware] = []
    if allowed_hosts is not None:
        middleware.append(Middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts)))
    if token is not None:
        middleware.append(Middleware(BearerAuth, token=token))
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
