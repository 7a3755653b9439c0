"""The HTTP + SSE server and web inspector (needs the ``server`` extra).

``create_app(journal)`` builds the Starlette app; ``serve(url, host, port)`` opens a
journal and runs it with uvicorn. The routes are listed in :mod:`contextfold.server.app`.
"""

try:
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "the contextfold server needs the server extra: pip install 'contextfold[server]'"
    ) from exc

from .app import create_app
from .runner import serve, serve_async

__all__ = ["create_app", "serve", "serve_async"]
