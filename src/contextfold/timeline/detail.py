"""One request, in full: its exact body rebuilt from the journal, the header snapshot it
was rendered with, and how it differs from the previous request's body, byte for byte.

A provider's prompt cache reuses an exact prefix of the previous request. The diff
says how long that prefix is, and which bytes the previous body had after it
(``removed``) and this body has instead (``added``), up to the end both share.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Protocol

from ..context.events import RequestHeader
from ..context.projection import AgentContext
from ..context.request import Built, build
from ..context.state import AgentContextState
from ..errors import RebuildError
from ..events import Event, StoredEvent
from ..telemetry import shared_prefix
from ..wire import RenderedRequest, render_request

__all__ = ["BodyDiff", "RequestBodies", "body_diff", "request_bodies"]


@dataclass(frozen=True, slots=True)
class BodyDiff:
    """``body`` against ``previous``: ``prefix`` bytes equal at the start, ``suffix`` bytes
    equal at the end (not overlapping the prefix), and what lies between in each."""

    prefix: int
    suffix: int
    removed: bytes
    added: bytes
    size: int

    @property
    def share(self) -> float:
        """The share of the body that is an exact prefix of the previous body (0 to 1)."""
        return self.prefix / self.size if self.size else 0.0


def body_diff(previous: bytes, body: bytes) -> BodyDiff:
    """The diff of ``body`` against ``previous`` (see :class:`BodyDiff`)."""
    prefix = shared_prefix(previous, body)
    room = min(len(previous), len(body)) - prefix
    suffix = shared_prefix(previous[::-1][:room], body[::-1][:room])
    return BodyDiff(
        prefix=prefix,
        suffix=suffix,
        removed=previous[prefix : len(previous) - suffix],
        added=body[prefix : len(body) - suffix],
        size=len(body),
    )


@dataclass(frozen=True, slots=True)
class RequestBodies:
    """Request @offset as rebuilt, with its header snapshot, and the request before it."""

    offset: int
    rendered: RenderedRequest
    header: RequestHeader
    state: AgentContextState
    previous_offset: int | None
    previous: RenderedRequest | None

    @property
    def diff(self) -> BodyDiff | None:
        return None if self.previous is None else body_diff(self.previous.body, self.rendered.body)


class _Reader(Protocol):
    def read_all(
        self,
        stream: str,
        *,
        after: str | None = None,
        types: Sequence[str | type[Event]] | None = None,
        page_size: int = 1000,
    ) -> AsyncIterator[StoredEvent]: ...


def _render(state: AgentContextState) -> tuple[Built, RenderedRequest] | None:
    if state.header is None:
        return None
    try:
        built = build(state)
        return built, render_request(built.request, state.header.transport)
    except Exception:  # the previous request may not render: it is then not compared
        return None


async def request_bodies(journal: _Reader, stream: str, offset: int) -> RequestBodies:
    """Request @offset and the request before it, rebuilt in one pass over the stream's
    context events. Raises RebuildError when @offset is no request with a header or
    cannot be rendered (as ``rebuild_request`` does)."""
    state = AgentContext.initial_state()
    before: AgentContextState | None = None  # folded through the request before @offset
    events = journal.read_all(stream, types=AgentContext.event_types)
    async with aclosing(events):  # type: ignore[type-var]
        async for stored in events:
            if stored.position > offset:
                break
            try:
                envelope = AgentContext.decode(stored)
            except ValueError:
                continue  # the fold skips what does not decode; so does the rebuild
            if envelope is None:
                continue
            state = AgentContext.apply(state, envelope)
            at = state.request_offset
            if at == stored.position and at < offset:
                before = state  # rebuilt once the pass is over: only the last one is shown
    if state.request_offset != offset or state.header is None:
        raise RebuildError(
            f"stream {stream!r} position {offset} is not a model request with a header "
            "(an LlmRequestRequested); pass the offset of a request event"
        )
    previous = _render(before) if before is not None else None
    try:
        # The request before reused: this one costs what it adds to it.
        built = build(state, previous=previous[0] if previous else None)
        rendered = render_request(
            built.request, state.header.transport, previous=previous[1] if previous else None
        )
    except Exception as exc:
        raise RebuildError(
            f"request @{offset} of stream {stream!r} cannot be rebuilt: {exc}"
        ) from exc
    return RequestBodies(
        offset=offset,
        rendered=rendered,
        header=state.header,
        state=state,
        previous_offset=before.request_offset if before is not None else None,
        previous=previous[1] if previous else None,
    )
