"""Running the server: open the journal at a URL and serve it with uvicorn until stopped."""

from __future__ import annotations

import asyncio
import ipaddress
import socket

import uvicorn

from ..errors import InvalidInputError
from ..journal import open_journal
from .app import LOOPBACK_HOSTS, create_app
from .sse import DEFAULT_MAX_LIVE_STREAMS, StreamSlots

__all__ = ["DEFAULT_EXTRA_CONNECTIONS", "LOOPBACK_HOSTS", "serve", "serve_async"]

DEFAULT_EXTRA_CONNECTIONS = 100
"""Connections uvicorn takes beyond ``max_live_streams`` (its ``limit_concurrency`` is the
sum): room for ordinary requests while every stream slot is taken; past it, 503."""

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


def _allowed_hosts(host: str, token: str | None) -> tuple[str, ...] | None:
    if not _is_loopback(host):
        if token is None:
            raise InvalidInputError(
                f"refusing to serve on {host!r} without a token: anyone who can reach it "
                "could read and write the journal; pass --token (or CONTEXTFOLD_TOKEN), "
                "or listen on 127.0.0.1"
            )
        return None
    bare = host.strip("[]")
    bound = f"[{bare}]" if ":" in bare else bare
    return LOOPBACK_HOSTS if bound in LOOPBACK_HOSTS else (*LOOPBACK_HOSTS, bound)


async def serve_async(
    url: str,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    token: str | None = None,
    max_live_streams: int = DEFAULT_MAX_LIVE_STREAMS,
    extra_connections: int = DEFAULT_EXTRA_CONNECTIONS,
) -> None:
    """Serve the journal at ``url`` on ``host:port`` until the process is told to stop.

    On a loopback address only loopback ``Host`` headers (and the address itself) are
    accepted, so a web page cannot reach the server through DNS rebinding. Any other
    address needs a token (InvalidInputError otherwise, before anything is opened).
    The journal is closed on the way out.
    """
    allowed_hosts = _allowed_hosts(host, token)
    # Entering the journal opens the store now: a bad URL or file fails before serving.
    async with open_journal(url) as journal:
        app = create_app(
            journal,
            token=token,
            allowed_hosts=allowed_hosts,
            max_live_streams=max_live_streams,
        )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            limit_concurrency=max_live_streams + extra_connections,
            lifespan="off",
            timeout_graceful_shutdown=_SHUTDOWN_GRACE,
            log_level="info",
        )
        await _Server(config, app.state.live_streams).serve()


def serve(
    url: str,
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    token: str | None = None,
    max_live_streams: int = DEFAULT_MAX_LIVE_STREAMS,
    extra_connections: int = DEFAULT_EXTRA_CONNECTIONS,
) -> None:
    """Blocking :func:`serve_async` (what ``contextfold serve`` runs)."""
    asyncio.run(
        serve_async(
            url,
            host,
            port,
            token=token,
            max_live_streams=max_live_streams,
            extra_connections=extra_connections,
        )
    )
