"""Checkpoints: a fold's state replaced for good by a stored value.

A checkpoint is an event of the fold's ``checkpoint_type`` holding the new state and the
cursor of the read it replaces (``through``); the fold reader restores from the newest
usable one and folds the events after ``through`` on top. Writing one is here; reading
them is the reader's (:mod:`contextfold.folds.reader`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import CheckpointError
from ..events import RawEvent
from ..folds.fold import FoldBase
from ..folds.reader import FoldReader

__all__ = ["Append", "checkpoint", "publish_checkpoint"]

S = TypeVar("S")

Append = Callable[[RawEvent], Awaitable[Any]]
"""How a checkpoint event is appended to the stream (the journal's append, no channels)."""


async def checkpoint(
    reader: FoldReader,
    fold: FoldBase[S],
    namespace: str,
    stream: str,
    next_state: Callable[[S], S | Awaitable[S]],
    *,
    append: Append,
) -> S:
    """Replace the fold's state with ``next_state(state)`` for good, as a checkpoint event.

    Events appended while ``next_state`` runs are folded on top of the new state, which is
    returned. Raises CheckpointError (``unsupported``, ``invalid-state``, ``next-failed``)
    and stores nothing then.
    """
    fold.check_checkpointable()
    state, cursor = await reader.read_with_cursor(fold, namespace, stream)
    try:
        result = next_state(state)
        new_state = await result if isinstance(result, Awaitable) else result
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"fold {fold.name}: the checkpoint's next function failed: {exc!r}; nothing was stored",
            reason="next-failed",
        ) from exc
    return await publish_checkpoint(reader, fold, namespace, stream, new_state, cursor, append)


async def publish_checkpoint(
    reader: FoldReader,
    fold: FoldBase[S],
    namespace: str,
    stream: str,
    new_state: S,
    through: str | None,
    append: Append,
) -> S:
    """Store ``new_state`` as the checkpoint of the read that ended at ``through``, then
    read again (events appended since are folded on top). Raises CheckpointError
    (``unsupported``, ``invalid-state``) and stores nothing when the state does not encode."""
    fold.check_checkpointable()
    encoded = fold.encode_state(new_state)
    await append(
        RawEvent(
            fold.checkpoint_type,
            {"fold": fold.name, "version": fold.version, "through": through, "state": encoded},
        )
    )
    return await reader.read(fold, namespace, stream)
