"""The JSON shapes the server returns: stored events, the agent context, transcript rows.

Pure functions from library values to JSON-ready dicts; the routes only serialize them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..context.request import item_header
from ..context.state import AgentContextState, ContextItem
from ..context.trust import is_external, wire_role
from ..inspection import event_json
from ..store.base import AppendResult, ReadResult, StreamInfo
from ..transcript.parts import MessageWithParts

__all__ = [
    "append_json",
    "context_json",
    "event_json",
    "page_json",
    "streams_json",
    "transcript_json",
]


def page_json(stream: str, page: ReadResult) -> dict[str, Any]:
    """A page of a stream, with where to continue."""
    return {
        "stream": stream,
        "events": [event_json(event) for event in page.events],
        "cursor": page.cursor,
        "reset": page.reset,
        "more": page.more,
    }


def append_json(result: AppendResult) -> dict[str, Any]:
    """Where an append landed."""
    return {
        "stream": result.stream,
        "first_position": result.first_position,
        "last_position": result.last_position,
        "positions": list(range(result.first_position, result.last_position + 1)),
        "version": result.version,
        "cursor": result.cursor,
        "deduplicated": result.deduplicated,
    }


def streams_json(streams: Sequence[StreamInfo], next_after: str | None) -> dict[str, Any]:
    """A page of streams, and ``next``: the ``after`` of the page that follows (None when
    this page is the last)."""
    return {
        "streams": [{"stream": info.stream, "version": info.version} for info in streams],
        "next": next_after,
    }


def _item_json(item: ContextItem, state: AgentContextState, developer_role: bool) -> dict[str, Any]:
    body = item.model_dump(mode="json")
    body["header"] = item_header(item)
    # The trust the request header recorded, so the page shows what went on the wire.
    trusted = state.header.trusted_actor_types if state.header is not None else ()
    body["wire_role"] = wire_role(item, developer_role, trusted)
    body["external"] = is_external(item.actor, trusted)
    body["published"] = item.offset <= state.published_through
    return body


def context_json(stream: str, version: int, state: AgentContextState) -> dict[str, Any]:
    """The agent context of a stream: both lanes, each item with its rendered ``@N`` header
    line, its wire role on the latest request's transport (developer role assumed before
    any request) and whether it comes from an external (untrusted) actor."""
    developer_role = state.header.has_developer_role if state.header is not None else True
    return {
        "stream": stream,
        "version": version,
        "published_through": state.published_through,
        "request_offset": state.request_offset,
        "request_offsets": list(state.request_offsets),
        "request_time": state.request_time,
        "compacted_through": state.compacted_through,
        "header": state.header.model_dump(mode="json") if state.header is not None else None,
        "system": [_item_json(item, state, developer_role) for item in state.system],
        "history": [_item_json(item, state, developer_role) for item in state.history],
    }


def transcript_json(
    session: str,
    entries: Sequence[MessageWithParts],
    *,
    cursor: str | None,
    more: bool,
) -> dict[str, Any]:
    """Transcript rows: each message with its parts, oldest first."""
    return {
        "session": session,
        "messages": [
            {
                "message": entry.message.model_dump(mode="json"),
                "parts": [part.model_dump(mode="json") for part in entry.parts],
            }
            for entry in entries
        ],
        "cursor": cursor,
        "more": more,
    }
