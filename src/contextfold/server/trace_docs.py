"""The OpenAPI description of the trace routes (:mod:`.trace`), part of the document
:mod:`.openapi` builds: what each route answers, in the shapes the inspector reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

__all__ = ["Operations", "trace_paths"]

_JSON = "application/json"


class Operations(Protocol):
    """What builds an operation object for the app (``openapi._Operations``)."""

    def api(
        self,
        summary: str,
        responses: dict[str, Any],
        *,
        parameters: Sequence[dict[str, Any]] = (),
        errors: tuple[int, ...] = (),
        body: dict[str, Any] | None = None,
        live: bool = False,
    ) -> dict[str, Any]: ...


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": schema}}}


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, "description": description}


def _path(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema,
        "description": description,
    }


def trace_paths(ops: Operations, stream: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The paths of the trace routes: ``ops`` builds each operation (parameters and errors
    of the app), ``stream`` and ``after`` are the document's stream and cursor parameters."""
    offset = _path(
        "offset",
        "A position (@N) of the stream.",
        {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
    )
    count = {"type": "integer", "minimum": 0}
    share = {"type": ["number", "null"], "minimum": 0, "maximum": 1}
    obj = {"type": "object"}
    stats = {
        "type": "object",
        "required": ["stream", "requests", "tokens", "cache", "cost", "lanes", "verify"],
        "properties": {
            "stream": {"type": "string"},
            "requests": count,
            "tokens": obj,
            "cache": {
                "type": "object",
                "required": ["cached_share", "prefix_share"],
                "properties": {"cached_share": share, "prefix_share": share},
            },
            "cost": {"type": ["number", "null"]},
            "lanes": {"type": "array", "items": obj},
            "verify": obj,
        },
    }
    return {
        "/v1/streams/{stream}/trace": {
            "get": ops.api(
                "The stream's turns as nested spans (triggers, requests with latency, tokens, "
                "cost, verify status and prefix share, tool calls), a page of them, and the "
                "stream's stats.",
                {
                    "200": _json(
                        "A page of turns, oldest first.",
                        {
                            "type": "object",
                            "required": [
                                "stream",
                                "version",
                                "total_turns",
                                "start",
                                "turns",
                                "stats",
                            ],
                            "properties": {
                                "stream": {"type": "string"},
                                "version": count,
                                "total_turns": count,
                                "start": count,
                                "turns": {"type": "array", "items": obj},
                                "stats": stats,
                            },
                        },
                    )
                },
                parameters=[
                    stream,
                    _query(
                        "start",
                        "The first turn (0-based; default: the newest page).",
                        {"type": "integer", "minimum": 0, "maximum": 2**62},
                    ),
                    _query(
                        "limit", "Most turns.", {"type": "integer", "minimum": 1, "maximum": 200}
                    ),
                ],
                errors=(404,),
            )
        },
        "/v1/streams/{stream}/trace/{offset}": {
            "get": ops.api(
                "Request @offset in full: its exact body, SHA-256, header snapshot, session "
                "prefix, verify status and its diff against the previous request.",
                {
                    "200": _json(
                        "The request.",
                        {
                            "type": "object",
                            "required": [
                                "stream",
                                "offset",
                                "sha256",
                                "size",
                                "body",
                                "header",
                                "diff",
                            ],
                            "properties": {
                                "stream": {"type": "string"},
                                "offset": {"type": "integer"},
                                "sha256": {"type": "string"},
                                "size": count,
                                "body": {"type": "string"},
                                "header": _ref("RequestHeader"),
                                "diff": {"type": ["object", "null"]},
                            },
                        },
                    )
                },
                parameters=[stream, offset],
                errors=(404,),
            )
        },
        "/v1/streams/{stream}/context/{offset}": {
            "get": ops.api(
                "The agent context as it was at @offset (folded through it).",
                {"200": _json("The context.", _ref("Context"))},
                parameters=[stream, offset],
                errors=(404,),
            )
        },
        "/v1/streams/{stream}/search": {
            "get": ops.api(
                "Events after the cursor whose type, actor and text match (case-insensitive), "
                "oldest first; one call looks through at most 5000 events.",
                {
                    "200": _json(
                        "The matches and where to go on.",
                        {
                            "type": "object",
                            "required": ["stream", "events", "cursor", "more", "scanned"],
                            "properties": {
                                "stream": {"type": "string"},
                                "events": {"type": "array", "items": _ref("Event")},
                                "cursor": {"type": ["string", "null"]},
                                "more": {"type": "boolean"},
                                "scanned": count,
                            },
                        },
                    )
                },
                parameters=[
                    stream,
                    after,
                    _query("q", "Text the event's payload holds.", {"type": "string"}),
                    _query("type", "An event type, or its last part.", {"type": "string"}),
                    _query("actor", "A writer, actor type or type:id.", {"type": "string"}),
                    _query(
                        "limit", "Most matches.", {"type": "integer", "minimum": 1, "maximum": 1000}
                    ),
                ],
                errors=(404,),
            )
        },
        "/v1/streams/{stream}/stats": {
            "get": ops.api(
                "The stream's requests, tokens per lane and as reported, cache shares, "
                "compactions and cost (as contextfold stats --json).",
                {"200": _json("The stats.", stats)},
                parameters=[stream],
                errors=(404,),
            )
        },
        "/v1/sessions": {
            "get": ops.api(
                "The transcript's sessions, and whether this server has a transcript and a "
                "live bus.",
                {
                    "200": _json(
                        "The sessions.",
                        {
                            "type": "object",
                            "required": ["sessions", "transcript", "live"],
                            "properties": {
                                "sessions": {"type": "array", "items": obj},
                                "transcript": {"type": "boolean"},
                                "live": {"type": "boolean"},
                            },
                        },
                    )
                },
                parameters=[
                    _query("prefix", "Only sessions starting with this.", {"type": "string"})
                ],
            )
        },
    }
