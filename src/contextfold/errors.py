"""The one error tree of contextfold.

Every error names what was at fault (stream, position, field, fold) and what to do. A
class with a builtin in parentheses also derives from it, so ``except ValueError`` (or
``TypeError``, ``LookupError``) keeps catching it. A test checks this drawing against the
classes.

    ContextfoldError
    ├── EventDefinitionError (TypeError)       an Event subclass is ill-defined
    ├── UnknownEventTypeError (LookupError)    a stored type name has no registered Event class
    ├── InvalidInputError (ValueError)         an argument is not acceptable; nothing was written
    │   ├── InvalidStreamNameError
    │   ├── PayloadError                       not JSON, NaN/inf, over the size limit
    │   │   └── StrictJsonError                JSON text that would not round-trip unchanged
    │   ├── InvalidCursorError
    │   │   └── UnknownCursorError             names no event of the stream (surfaces)
    │   └── ConfigurationError                 a setting out of range or of a wrong kind
    ├── UsageError (TypeError)                 the wrong kind of object, a forbidden use
    ├── StoreError
    │   ├── ConflictError
    │   │   ├── WrongExpectedVersionError
    │   │   ├── IdempotencyConflictError
    │   │   ├── LeaseHeldError                 another agent instance holds the stream's lease
    │   │   └── LeaseLostError                 this instance lost its lease: append refused
    │   ├── CorruptEventError                  a stored row no longer decodes as JSON
    │   ├── StoreFileMovedError                the SQLite file was moved or deleted while open
    │   ├── StorageFullError                   the disk is full or a file-size quota is reached
    │   └── StoreUnavailableError              the backend could not be reached or is closed
    ├── FoldDefinitionError (TypeError)        a fold or what a handler returns is wrong
    ├── MissingSegmentError (LookupError)      in a handler: the event is left out
    ├── CheckpointError                        a fold's state could not be replaced by a checkpoint
    ├── CompactionError                        a fold could not be compacted (summarized)
    ├── RenderError (ValueError)               a state cannot be rendered for the transport
    ├── RebuildError                           a recorded request cannot be rebuilt
    ├── RefError (LookupError)                 a ref names no tool output or context item
    ├── UnknownStreamError (LookupError)       a read of a stream without events
    ├── ModelError                             a model provider refused or failed a request
    ├── ProviderBlockedError (RuntimeError)    a test tried to reach a real model provider
    ├── BackpressureError                      too many events waiting: refused, none dropped
    └── BusOverflowError                       a live subscriber fell too far behind and was cut off
"""

from __future__ import annotations

__all__ = [
    "BackpressureError",
    "BusOverflowError",
    "CheckpointError",
    "CompactionError",
    "ConfigurationError",
    "ConflictError",
    "ContextfoldError",
    "CorruptEventError",
    "EventDefinitionError",
    "FoldDefinitionError",
    "IdempotencyConflictError",
    "InvalidCursorError",
    "InvalidInputError",
    "InvalidStreamNameError",
    "LeaseHeldError",
    "LeaseLostError",
    "MissingSegmentError",
    "ModelError",
    "PayloadError",
    "ProviderBlockedError",
    "RebuildError",
    "RefError",
    "RenderError",
    "StorageFullError",
    "StoreError",
    "StoreFileMovedError",
    "StoreUnavailableError",
    "StrictJsonError",
    "UnknownCursorError",
    "UnknownEventTypeError",
    "UnknownStreamError",
    "UsageError",
    "WrongExpectedVersionError",
]


class ContextfoldError(Exception):
    """Base of every error contextfold raises on purpose."""


class EventDefinitionError(ContextfoldError, TypeError):
    """An Event subclass has no valid type name, or reuses another class's name."""


class UnknownEventTypeError(ContextfoldError, LookupError):
    """A stored event's type name has no registered Event class in this process."""


class InvalidInputError(ContextfoldError, ValueError):
    """An argument is not acceptable; nothing was written."""


class InvalidStreamNameError(InvalidInputError):
    """A stream name is empty, too long, or holds control, bidi or zero-width characters."""


class PayloadError(InvalidInputError):
    """A value to store is not JSON (a key that is no str, NaN or infinity, an integer past
    64 bits, nesting too deep), or an event payload is over the size limit; the message names
    the field at fault."""


class StrictJsonError(PayloadError):
    """A JSON text is valid but would not round-trip unchanged (a key given twice in one
    object, an integer outside -2**63..2**64-1, nesting too deep to check); the message
    names the place (``events[0].payload.n``) and what to send instead."""


class InvalidCursorError(InvalidInputError):
    """A cursor argument has the wrong type (an unknown cursor is not an error: reads reset)."""


class UnknownCursorError(InvalidCursorError):
    """A cursor names no event of the stream it was given for (malformed, from another
    stream or journal, or the stream was recreated). Reads reset on it; the CLI and the
    HTTP API refuse it instead, so a mistake is never taken for the start of the stream."""

    def __init__(self, message: str, *, stream: str, cursor: str) -> None:
        super().__init__(message)
        self.stream = stream
        self.cursor = cursor


class ConfigurationError(InvalidInputError):
    """A setting given to a constructor or factory is out of range or of the wrong kind
    (server limits, tokens and hosts, store options, cache sizes, budgets, a toolbox); the
    message names the setting. Nothing was started."""


class UsageError(ContextfoldError, TypeError):
    """An API was given the wrong kind of object or used where it does not apply (a view of
    something that is no fold, a write to read-only fold state, a tool signature a model
    cannot be told about); the message says what it takes instead."""


class StoreError(ContextfoldError):
    """A journal backend failed or refused an operation."""


class ConflictError(StoreError):
    """An append was refused because of a concurrent or earlier write; nothing was written."""


class WrongExpectedVersionError(ConflictError):
    """The stream's version was not the one the append expected."""

    def __init__(self, message: str, *, stream: str, expected: int, actual: int) -> None:
        super().__init__(message)
        self.stream = stream
        self.expected = expected
        self.actual = actual


class IdempotencyConflictError(ConflictError):
    """An idempotency key was reused with another payload."""

    def __init__(self, message: str, *, stream: str, key: str) -> None:
        super().__init__(message)
        self.stream = stream
        self.key = key


class LeaseHeldError(ConflictError):
    """Another agent instance holds the stream's lease (``holder``, until ``expires_at``,
    an ISO-8601 time); nothing was written. Claim it again once it lapses or is released."""

    def __init__(self, message: str, *, stream: str, holder: str, expires_at: str) -> None:
        super().__init__(message)
        self.stream = stream
        self.holder = holder
        self.expires_at = expires_at


class LeaseLostError(ConflictError):
    """This agent instance no longer holds the stream's lease (another claimed it after it
    lapsed, or the stream was deleted): its append was refused, nothing was written, and the
    instance must stop. ``position`` is where the journal shows the loss (None: deleted)."""

    def __init__(self, message: str, *, stream: str, holder: str, position: int | None) -> None:
        super().__init__(message)
        self.stream = stream
        self.holder = holder
        self.position = position


class CorruptEventError(StoreError):
    """A stored row cannot be decoded; the message names stream and position."""

    def __init__(self, message: str, *, stream: str, position: int) -> None:
        super().__init__(message)
        self.stream = stream
        self.position = position


class StoreFileMovedError(StoreError):
    """The database file was moved, deleted or replaced while the store held it open.

    What it wrote from then on would be lost to whoever opens the path next, so it refuses
    every write (nothing of it is acknowledged or stored). Close the store and open it again.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class StorageFullError(StoreError):
    """The storage refused to take the write: the disk is full, or the file reached a
    size quota (SQLite cannot tell a write the system refused from an I/O error). Nothing
    was written; free space or raise the quota, then retry."""


class StoreUnavailableError(StoreError):
    """The backend cannot be reached, or the journal was closed."""


class FoldDefinitionError(ContextfoldError, TypeError):
    """A fold or segmented fold is ill-defined (bad name, duplicate or missing handlers), or
    one of its handlers returned what the fold cannot hold (not a Segment or a state, a
    mutable model)."""


class MissingSegmentError(ContextfoldError, LookupError):
    """Raised inside a fold handler when the segment an event belongs to is not in the state:
    the fold leaves the event out and reports it (reason ``missing-segment``). It does not
    reach the fold's callers."""


class CheckpointError(ContextfoldError):
    """A fold's state could not be replaced by a checkpoint; nothing was stored.

    ``reason`` is ``"unsupported"`` (the fold takes no checkpoints), ``"invalid-state"``
    (the new state does not fit the fold's schema) or ``"next-failed"`` (the function
    making the new state raised: it is the ``__cause__``).
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class CompactionError(ContextfoldError):
    """A fold could not be compacted (its older history summarized); nothing was stored.

    ``reason`` is ``"unsupported"`` (the fold does not compact this way: the message says
    what does), ``"summarize-failed"`` (the summarizer raised: it is the ``__cause__``),
    ``"invalid-state"`` (the summary does not fit the fold's summary schema) or, from the
    agent, ``"still-over-threshold"`` (two compactions in a row left the next request over
    the threshold: no third summary is paid for; the message names the request and its size).
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class RenderError(ContextfoldError, ValueError):
    """A state cannot be rendered for the requested transport."""


class RebuildError(ContextfoldError):
    """A recorded request could not be rebuilt from the journal."""


class RefError(ContextfoldError, LookupError):
    """A ref (``stream@offset``) is malformed, or names no tool output or context item."""


class UnknownStreamError(ContextfoldError, LookupError):
    """The stream has no events (never appended, or deleted); ``suggestions`` are the
    closest stream names the journal holds."""

    def __init__(self, message: str, *, stream: str, suggestions: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.stream = stream
        self.suggestions = suggestions


class ModelError(ContextfoldError):
    """A model provider refused or failed a request (the SDK's or the function's error is
    the ``__cause__``); the message names transport and model. The request stays unanswered
    in the journal: running the agent again re-sends it byte for byte."""


class BackpressureError(ContextfoldError):
    """An event was refused because too many wait already (per destination, or in one
    turn); nothing was stored or dropped. Retry once the agent has worked some off."""

    def __init__(self, message: str, *, destination: str, limit: int) -> None:
        super().__init__(message)
        self.destination = destination
        self.limit = limit


class ProviderBlockedError(ContextfoldError, RuntimeError):
    """Under ``contextfold.testing``'s provider guard, a request was about to leave for a
    model provider (any host that is not loopback); nothing was sent. ``url`` is where it
    was going. Use ``FunctionModel`` or ``LocalModel``, or point the client at a loopback
    server."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class BusOverflowError(ContextfoldError):
    """A subscriber fell more than ``maxsize`` events (or ``max_bytes`` bytes) behind and
    was cut off.

    The events after the cut are lost to it: re-read the rows and subscribe again.
    """

    def __init__(self, message: str, *, session: str) -> None:
        super().__init__(message)
        self.session = session
