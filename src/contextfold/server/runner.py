"""Running the server: open the journal at a URL and serve it with uvicorn until stopped."""

from __future__ import annotations

import asyncio
import ipaddress

import uvicorn

from ..journal import open_journal
from .app import create_app

__all__ = ["LOOPBACK_HOSTS", "serve", "serve_async"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
"""Host headers accepted when the server listens on loopback only."""

# Open SSE streams never end by themselves: on shutdown, give them this long, then cut.
_SHUTDOWN_GRACE = 3


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


async def serve_async(
    url: str, host: str = "127.0.0.1", port: int = 8765, *, token: str | None = None
) -> None:
    """Serve the journal at ``url`` on ``host:port`` until the process is told to stop.

    On a loopback address only loopback ``Host`` headers are accepted, so a web page
    cannot reach the server through DNS rebinding. The journal is closed on the way out.
    """
    # Entering the journal opens the store now: a bad URL or file fails before serving.
    async with open_journal(url) as journal:
        app = create_app(
            journal,
            token=token,
            allowed_hosts=LOOPBACK_HOSTS if _is_loopback(host) else None,
        )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            lifespan="off",
            timeout_graceful_shutdown=_SHUTDOWN_GRACE,
            log_level="info",
        )
        await uvicorn.Server(config).serve()


def serve(url: str, host: str = "127.0.0.1", port: int = 8765, *, token: str | None = None) -> None:
    """Blocking :func:`serve_async` (what ``contextfold serve`` runs)."""
    asyncio.run(serve_async(url, host, port, token=token))
