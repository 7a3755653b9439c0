"""``open_transcript_store(url)``: a transcript backend chosen by the URL's scheme.

The URL is read by the journal's parser (:mod:`contextfold.store.urls`); the backend module
is imported only when its scheme is asked for, so the PostgreSQL driver stays optional and
no backend imports this module.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from ...errors import InvalidInputError
from ...store.urls import Scheme, backend_options, parse_store_url
from .base import TranscriptStore

__all__ = ["BACKENDS", "open_transcript_store"]

BACKENDS: Mapping[Scheme, tuple[str, str]] = {
    "memory": (".memory", "MemoryTranscriptStore"),
    "sqlite": (".sqlite", "SQLiteTranscriptStore"),
    "postgresql": (".postgres", "PostgresTranscriptStore"),
}
"""Scheme -> (module relative to this package, class name) of the backend."""


def open_transcript_store(
    url: str, *, namespace: str = "default", **options: Any
) -> TranscriptStore:
    """A transcript store for ``memory://``, ``sqlite:///path.db`` (``sqlite:///:memory:``)
    or ``postgresql://…`` (its ``pool_timeout=`` is the backend's ``timeout``); it connects
    on :meth:`~TranscriptStore.open` or first use. Other options go to the backend. Raises
    InvalidInputError for another URL, or for PostgreSQL without its extra installed."""
    parsed = parse_store_url(url, what="transcript")
    module_name, class_name = BACKENDS[parsed.scheme]
    try:
        module = importlib.import_module(module_name, __package__)
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        if parsed.scheme != "postgresql":
            raise
        raise InvalidInputError(
            "PostgreSQL support needs the postgres extra: pip install 'contextfold[postgres]'"
        ) from exc
    backend: Callable[..., TranscriptStore] = getattr(module, class_name)
    if parsed.scheme == "memory":
        return backend(namespace=namespace, **options)
    return backend(parsed.target, namespace=namespace, **backend_options(parsed, options))
