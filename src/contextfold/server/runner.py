"""Running the server: open the journal at a URL and serve it with uvicorn until stopped."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
from collections.abc import Iterable
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from ..errors import ConfigurationError, InvalidInputError, StoreUnavailableError
from ..journal import open_journal
from ..store.urls import _without_password, parse_store_url, sqlite_path_hint
from ..transcript.store.factory import open_transcript_store
from .app import LOOPBACK_HOSTS, create_app
from .auth import AccessTokenRedaction, token_writers
from .limits import DEFAULT_EXTRA_REQUESTS, check_positive_seconds
from .protocol import DEFAULT_HEADER_TIMEOUT, header_timeout_protocol
from .sse import DEFAULT_MAX_LIVE_STREAMS, StreamSlots
from .writers import check_runtime_type_prefixes, check_trusted_actor_types

__all__ = [
    "DEFAULT_EXTRA_CONNECTIONS",
    "LOOPBACK_HOSTS",
    "serve",
    "serve_async",
    "uvicorn_config",
]

DEFAULT_EXTRA_CONNECTIONS = DEFAULT_EXTRA_REQUESTS
"""Requests in flight beyond ``max_live_streams`` (the app's ``max_requests`` is the sum):
room for ordinary requests while every stream slot is taken; past it, 503. Idle
connections count for nothing: those that do not send their headers in time are closed."""

# Requests still running when shutdown begins get this long, then are cut.
_SHUTDOWN_GRACE = 3


class _Server(uvicorn.Server):
    """uvicorn, ending the app's live streams as shutdown begins: they never end by
    themselves, so each would be cut after the grace period and logged as a failure."""

    def __init__(self, config: uvicorn.Config, streams: StreamSlots) -> None:
        super().__init__(config)
        self._streams = streams

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._streams.close()
        await super().shutdown(sockets)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _allowed_hosts(host: str, authenticated: bool) -> tuple[str, ...] | None:
    if not _is_loopback(host):
        if not authenticated:
            raise InvalidInputError(
                f"refusing to serve on {host!r} without a token: anyone who can reach it "
                "could read and write the journal; pass --token (or CONTEXTFOLD_TOKEN), "
                "or listen on 127.0.0.1"
            )
        return None
    bare = host.strip("[]")
    bound = f"[{bare}]" if ":" in bare else bare
    return LOOPBACK_HOSTS if bound in LOOPBACK_HOSTS else (*LOOPBACK_HOSTS, bound)


def uvicorn_config(
    app: ASGIApp,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    **options: Any,
) -> uvicorn.Config:
    """The uvicorn configuration ``serve`` runs ``app`` with: HTTP/1.1 whose connections
    must send their request headers within ``header_timeout`` seconds (see
    :mod:`.protocol`), no connection cap (the app counts requests in flight instead).
    ``options`` go to uvicorn as they are. Its access log masks ``access_token`` values
    (:class:`.auth.AccessTokenRedaction`)."""
    seconds = check_positive_seconds("header_timeout", header_timeout)
    settings: dict[str, Any] = {
        "lifespan": "off",
        "timeout_graceful_shutdown": _SHUTDOWN_GRACE,
        "log_level": "info",
        **options,
    }
    config = uvicorn.Config(
        app, host=host, port=port, http=header_timeout_protocol(seconds), **settings
    )
    access = logging.getLogger("uvicorn.access")  # configured by the line above
    if not any(isinstance(f, AccessTokenRedaction) for f in access.filters):
        access.addFilter(AccessTokenRedaction())
    return config


def _check_address(host: object, port: object) -> None:
    if not isinstance(host, str) or not host:
        raise InvalidInputError(f"host must be a non-empty interface name, got {host!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise InvalidInputError(f"port must be a TCP port from 0 to 65535, got {port!r}")


STARTUP_TIMEOUT = 5.0
"""Seconds ``serve`` waits for its journal to open before it gives up with one clear line."""


async def serve_async(
    url: str,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    token: str | None = None,
    trusted_tokens: Iterable[str] = (),
    trusted_actor_types: Iterable[str] = (),
    runtime_type_prefixes: Iterable[str] = (),
    max_live_streams: int = DEFAULT_MAX_LIVE_STREAMS,
    extra_connections: int = DEFAULT_EXTRA_CONNECTIONS,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    create: bool = False,
    pool_timeout: float | None = None,
) -> None:
    """Serve the journal at ``url`` on ``host:port`` until the process is told to stop.

    On a loopback address only loopback ``Host`` headers (and the address itself) are
    accepted, so a web page cannot reach the server through DNS rebinding. Any other
    address needs a token (InvalidInputError otherwise, before anything is opened).
    ``trusted_tokens`` authenticate trusted writers, ``trusted_actor_types`` are the
    actor types the agents trust beyond the built-in ones and ``runtime_type_prefixes`` the
    application's runtime-only event types (see ``create_app``). At most
    ``max_live_streams + extra_connections`` requests are in flight; a connection that
    has not sent its request headers ``header_timeout`` seconds after opening is closed.
    The transcript kept in the same database is served too. The journal is closed on the
    way out. An SQLite file that does not exist is refused (StoreUnavailableError, a typo
    would serve an empty journal) unless ``create``. ``pool_timeout``: on PostgreSQL,
    seconds a request waits for a connection before it is answered 503 (default: the
    URL's ``pool_timeout``, else 5). Raises InvalidInputError for a bad address,
    ConfigurationError for a bad token, limit or pool timeout, both before anything is
    opened.
    """
    _check_address(host, port)
    trusted = tuple(trusted_tokens)
    actor_types = check_trusted_actor_types(trusted_actor_types)
    runtime_prefixes = check_runtime_type_prefixes(runtime_type_prefixes)
    allowed_hosts = _allowed_hosts(host, bool(token_writers(token, trusted)))
    check_positive_seconds("header_timeout", header_timeout)
    if (
        isinstance(extra_connections, bool)
        or not isinstance(extra_connections, int)
        or extra_connections < 0
    ):
        raise ConfigurationError(
            f"extra_connections must be an int >= 0, got {extra_connections!r}"
        )
    options = _store_options(url, create=create, pool_timeout=pool_timeout)
    # Entering the journal opens the store now: a bad URL or file fails before serving, and
    # an unreachable database within STARTUP_TIMEOUT (its pool timeout may be longer).
    async with contextlib.AsyncExitStack() as stack:
        try:
            async with asyncio.timeout(STARTUP_TIMEOUT):
                journal = await stack.enter_async_context(open_journal(url, **options))
        except TimeoutError:
            raise StoreUnavailableError(
                f"the journal at {_without_password(url)} did not open within "
                f"{STARTUP_TIMEOUT:g} s: check that the database is up and the URL is right"
            ) from None
        transcript = open_transcript_store(url, namespace=journal.namespace, **options)
        await transcript.open()
        try:
            app = create_app(
                journal,
                transcript=transcript,
                token=token,
                trusted_tokens=trusted,
                trusted_actor_types=actor_types,
                runtime_type_prefixes=runtime_prefixes,
                allowed_hosts=allowed_hosts,
                max_live_streams=max_live_streams,
                max_requests=max_live_streams + extra_connections,
            )
            config = uvicorn_config(app, host, port, header_timeout=header_timeout)
            await _Server(config, app.state.live_streams).serve()
        finally:
            await transcript.close()


def _store_options(url: str, *, create: bool, pool_timeout: float | None) -> dict[str, Any]:
    """The store options ``serve`` opens ``url`` with; refuses an SQLite file that does not
    exist (unless ``create``) and a pool timeout for another database than PostgreSQL."""
    parsed = parse_store_url(url)
    options: dict[str, Any] = {}
    if pool_timeout is not None:
        if parsed.scheme != "postgresql":
            raise ConfigurationError(
                f"pool_timeout (--pool-timeout) applies to a postgresql:// journal; "
                f"{parsed.scheme} has no connection pool"
            )
        options["timeout"] = check_positive_seconds("pool_timeout", pool_timeout)
    path = parsed.target
    if parsed.scheme == "sqlite" and path != ":memory:" and not create and not os.path.exists(path):
        raise StoreUnavailableError(
            f"no journal to serve at {url}: the file {path} does not exist"
            f"{sqlite_path_hint(path)}; check the path, or pass --create (create=True) to "
            "start a new journal there"
        )
    return options


def serve(
    url: str,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    token: str | None = None,
    trusted_tokens: Iterable[str] = (),
    trusted_actor_types: Iterable[str] = (),
    runtime_type_prefixes: Iterable[str] = (),
    max_live_streams: int = DEFAULT_MAX_LIVE_STREAMS,
    extra_connections: int = DEFAULT_EXTRA_CONNECTIONS,
    header_timeout: float = DEFAULT_HEADER_TIMEOUT,
    create: bool = False,
    pool_timeout: float | None = None,
) -> None:
    """Blocking :func:`serve_async` (what ``contextfold serve`` runs)."""
    asyncio.run(
        serve_async(
            url,
            host,
            port,
            token=token,
            trusted_tokens=trusted_tokens,
            trusted_actor_types=trusted_actor_types,
            runtime_type_prefixes=runtime_type_prefixes,
            max_live_streams=max_live_streams,
            extra_connections=extra_connections,
            header_timeout=header_timeout,
            create=create,
            pool_timeout=pool_timeout,
        )
    )
