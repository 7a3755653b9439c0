"""The PostgreSQL store's wake-up notifications: the key naming a stream in them and their
payload, ``"<key> <version> <head>"``, decoded."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

__all__ = ["Wake", "parse_wake", "wake_key"]


def _wake_key(namespace: str, stream: str) -> str:
    # Fixed length, far under NOTIFY's 8000-byte payload limit; names hold no NUL.
    raw = f"{namespace}\x00{stream}".encode()
    return hashlib.blake2b(raw, digest_size=16).hexdigest()


def wake_key(namespace: str, stream: str) -> str:
    """The key naming the stream in the :data:`NOTIFY_CHANNEL` notification every append to
    (and deletion of) it sends (:attr:`Wake.key`): a listener tells the streams apart by it."""
    return _wake_key(namespace, stream)


@dataclass(frozen=True, slots=True)
class Wake:
    """A :data:`NOTIFY_CHANNEL` notification: which stream changed, and to what.

    Every append sends one after it commits (several appends to a stream committing close
    together share one, naming the newest), and a deletion one at its commit.
    """

    key: str
    """The stream, as :func:`wake_key` names it."""
    version: int | None
    """The stream's version after the change (0: deleted); None when the payload does not say."""
    head: int | None
    """The global position of the stream's newest event after the change (its cursor, as
    an int); None after a deletion or when the payload does not say."""


def parse_wake(payload: str) -> Wake:
    """A notification's payload, ``"<key> <version> <head>"`` (``"<key> 0"`` for a
    deletion), decoded. A payload of another shape is a bare key (version and head None):
    a listener treats it as a change it knows nothing more of."""
    key, _, rest = payload.partition(" ")
    version_text, _, head_text = rest.partition(" ")
    version = int(version_text) if version_text.isascii() and version_text.isdigit() else None
    head = (
        int(head_text)
        if version is not None and head_text.isascii() and head_text.isdigit()
        else None
    )
    return Wake(key, version, head)
