"""A worker as a process (what ``contextfold worker`` runs): the app factory named by
``module:attribute``, the journal at a URL, SIGTERM and SIGINT as a graceful stop."""

from __future__ import annotations

import asyncio
import importlib
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError
from ..journal import open_journal
from ..store.urls import parse_store_url
from .lease import LEASE_TTL
from .worker import AgentFactory, Worker, WorkerStats

__all__ = ["load_app", "serve_worker"]

log = logging.getLogger("contextfold.runtime")

_MAX_POOL = 16  # connections one worker process opens (and two listening ones of its own)


def load_app(spec: str) -> AgentFactory:
    """The factory ``spec`` names, ``package.module:attribute`` (the current directory is
    searched first, as for ``python -m``). Raises ConfigurationError naming what is missing."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(
            f"--app must be module:factory (e.g. myapp.agents:build), got {spec!r}"
        )
    if str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(f"--app {spec!r}: cannot import {module_name!r}: {exc}") from exc
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise ConfigurationError(f"--app {spec!r}: {module_name!r} has no {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise ConfigurationError(f"--app {spec!r} is not callable: it must build an Agent")
    factory: AgentFactory = found
    return factory


async def serve_worker(
    url: str,
    app: AgentFactory,
    *,
    namespace: str = "default",
    concurrency: int = 4,
    ttl: float = LEASE_TTL,
    holder: str | None = None,
    say: Callable[[str], object] = print,
) -> WorkerStats:
    """Serve the namespace at ``url`` with a :class:`Worker` until SIGTERM or SIGINT, then
    stop it gracefully (see :meth:`Worker.stop`) and return what it did. ``say`` gets a
    line when it starts; warnings (provider and store errors) are logged to stderr."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    options: dict[str, Any] = {}
    if parse_store_url(url).scheme == "postgresql":
        # An agent holds a connection only while a statement runs, never while it waits for
        # its model: a pool this size serves hundreds of streams at once, and the database's
        # max_connections is shared by every worker process and server replica.
        options["max_size"] = min(max(10, concurrency + 4), _MAX_POOL)
    async with open_journal(url, namespace=namespace, **options) as journal:
        worker = Worker(journal, app, concurrency=concurrency, ttl=ttl, holder=holder)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, worker.stop)
        try:
            say(f"worker {worker.holder} serving namespace {namespace!r}")
            await worker.run()
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
        return worker.stats
