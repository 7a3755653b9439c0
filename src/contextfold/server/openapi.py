"""The OpenAPI 3.1 description of the server, served at ``/openapi.json``.

Built once per app from its configuration, so every status it documents is one that app
can answer: 401 only with a token, 403 only with a namespace allow-list, the body limit
the app enforces. The shapes of the library's own values (context items, request
headers, transcript rows) are the JSON schemas of their pydantic models; the rest is
written here, next to the routes it describes (:mod:`.streams`, :mod:`.sessions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ..context.events import RequestHeader
from ..context.manifest import Manifest
from ..context.state import ContextItem
from ..events import TYPE_NAME
from ..journal.encode import MAX_NAME_LENGTH
from ..transcript.parts import PART_TYPES, Message
from ..transcript.store.base import MAX_PAGE_SIZE
from .body import MAX_META_CHARS, NAMESPACE_HEADER
from .streams import MANIFEST_HEADER, MAX_PAGE, SHA256_HEADER, TRANSPORT_HEADER
from .trace_docs import trace_paths

__all__ = ["OPENAPI_PATH", "openapi_schema"]

OPENAPI_PATH = "/openapi.json"

_JSON = "application/json"
_REF = "#/components/schemas/{model}"
_CONTROL = "\\u0000-\\u001f\\u007f"
_NO_CONTROL = f"^[^{_CONTROL}]*$"
_EDGE = f"[^\\s{_CONTROL}]"  # a name neither starts nor ends with whitespace


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": _ref("Error")}}}


_ERRORS = {
    400: "Bad input: a malformed name, query value, cursor or body, a path or query that "
    "is not UTF-8, or a Host header the server does not serve (against DNS rebinding).",
    401: "No bearer token was sent, or the wrong one.",
    403: "A namespace this server does not serve.",
    404: "No such stream (the message names the closest ones), request or surface.",
    408: "The request body did not arrive in time; nothing was written.",
    409: "A wrong expected_version, or an idempotency key reused with another body.",
    413: "The body is over the server's size limit.",
    415: "The body was not sent as application/json.",
    429: "This client address has its share of requests in flight: retry later.",
    503: "The server is busy (requests in flight or live streams at their limit), or the "
    "journal is unavailable.",
}

_SCALAR_OR_NULL = {"type": ["string", "null"]}


def _static_schemas(max_body_bytes: int) -> dict[str, Any]:
    meta_string = {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_META_CHARS,
        "pattern": "^[^\\u0000]+$",
    }
    int64 = {"type": "integer", "minimum": 0, "maximum": 2**63 - 1}
    position = {"type": "integer", "minimum": 1}
    return {
        "JsonValue": {
            "description": "A JSON value whose integers fit in 64 bits (others are refused, "
            "not rounded).",
            "anyOf": [
                {"type": ["null", "boolean", "string"]},
                {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1},
                {"type": "number", "not": {"type": "integer"}},
                {"type": "array", "items": _ref("JsonValue")},
                {"type": "object", "additionalProperties": _ref("JsonValue")},
            ],
        },
        "Error": {
            "type": "object",
            "required": ["error"],
            "additionalProperties": False,
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["type", "message"],
                    "additionalProperties": False,
                    "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
                }
            },
        },
        "NewEvent": {
            "type": "object",
            "required": ["type", "payload"],
            "additionalProperties": False,
            "properties": {
                "type": {
                    "type": "string",
                    "pattern": TYPE_NAME.pattern,
                    "description": "The event type. Types of the agent runtime's namespace "
                    "(contextfold.agent/) other than context-added need a trusted writer; "
                    "a type this server knows must validate against its class, without "
                    "unknown fields.",
                },
                "payload": {
                    **_ref("JsonValue"),
                    "description": "Any JSON value (an object for known types).",
                },
            },
        },
        "AppendRequest": {
            "type": "object",
            "required": ["events"],
            "additionalProperties": False,
            "description": f"At most {max_body_bytes} bytes of JSON, without repeated keys "
            "or integers beyond 64 bits. Every event is stored, or none.",
            "properties": {
                "events": {"type": "array", "minItems": 1, "items": _ref("NewEvent")},
                "expected_version": {
                    **int64,
                    "description": "Append only when the stream is at this version (409 "
                    "otherwise); 0 for a new stream.",
                },
                "idempotency_key": {
                    **meta_string,
                    "description": "A retry with the same key and body returns the first "
                    "append's positions (200) and writes nothing.",
                },
                "run_id": meta_string,
                "actor": {
                    **meta_string,
                    "description": "The writer's actor, stored in each event's meta.",
                },
            },
        },
        "AppendResult": {
            "type": "object",
            "required": [
                "stream",
                "first_position",
                "last_position",
                "positions",
                "version",
                "cursor",
                "deduplicated",
            ],
            "properties": {
                "stream": {"type": "string"},
                "first_position": position,
                "last_position": position,
                "positions": {"type": "array", "items": position},
                "version": position,
                "cursor": {"type": "string"},
                "deduplicated": {"type": "boolean"},
            },
        },
        "Event": {
            "type": "object",
            "required": ["position", "global_position", "cursor", "type", "payload", "meta"],
            "properties": {
                "position": position,
                "global_position": position,
                "cursor": {"type": "string", "description": "Pass it as after= to continue."},
                "type": {"type": "string"},
                "payload": {
                    "description": "The payload as stored; null when it no longer "
                    "decodes (payload_error says why)."
                },
                "payload_error": {"type": "string"},
                "meta": {
                    "type": "object",
                    "required": ["event_id", "time", "channels"],
                    "properties": {
                        "event_id": {"type": "string"},
                        "time": {"type": "string"},
                        "run_id": _SCALAR_OR_NULL,
                        "actor": _SCALAR_OR_NULL,
                        "idempotency_key": _SCALAR_OR_NULL,
                        "channels": {"type": "array", "items": {"type": "string"}},
                    },
                },
            },
        },
        "Page": {
            "type": "object",
            "required": ["stream", "events", "cursor", "reset", "more"],
            "properties": {
                "stream": {"type": "string"},
                "events": {"type": "array", "items": _ref("Event")},
                "cursor": {"type": ["string", "null"]},
                "reset": {"type": "boolean"},
                "more": {"type": "boolean", "description": "limit cut the page short."},
            },
        },
        "Streams": {
            "type": "object",
            "required": ["streams"],
            "properties": {
                "streams": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["stream", "version"],
                        "properties": {"stream": {"type": "string"}, "version": position},
                    },
                }
            },
        },
        "ContextEntry": {
            "allOf": [
                _ref("ContextItem"),
                {
                    "type": "object",
                    "required": ["header", "wire_role", "external", "published"],
                    "properties": {
                        "header": {"type": "string", "description": "The @N header line."},
                        "wire_role": {"type": "string"},
                        "external": {"type": "boolean"},
                        "published": {"type": "boolean"},
                    },
                },
            ]
        },
        "Context": {
            "type": "object",
            "required": [
                "stream",
                "version",
                "published_through",
                "request_offsets",
                "header",
                "system",
                "history",
            ],
            "properties": {
                "stream": {"type": "string"},
                "version": {"type": "integer", "minimum": 0},
                "published_through": {"type": "integer", "minimum": 0},
                "request_offset": {"type": ["integer", "null"]},
                "request_offsets": {"type": "array", "items": position},
                "request_time": _SCALAR_OR_NULL,
                "compacted_through": {"type": ["integer", "null"]},
                "header": {"anyOf": [_ref("RequestHeader"), {"type": "null"}]},
                "system": {"type": "array", "items": _ref("ContextEntry")},
                "history": {"type": "array", "items": _ref("ContextEntry")},
            },
        },
        "Verification": {
            "type": "object",
            "required": ["stream", "ok", "requests", "drifts", "corrupt"],
            "properties": {
                "stream": {"type": "string"},
                "ok": {
                    "type": "boolean",
                    "description": "True only when requests were checked and none drifted.",
                },
                "requests": {"type": "integer", "minimum": 0},
                "drifts": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["request_offset", "recorded", "rebuilt", "error"],
                        "properties": {
                            "request_offset": position,
                            "recorded": {"type": "string"},
                            "rebuilt": _SCALAR_OR_NULL,
                            "error": _SCALAR_OR_NULL,
                        },
                    },
                },
                "corrupt": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["position", "type", "reason"],
                        "properties": {
                            "position": position,
                            "type": {"type": "string"},
                            "reason": {"type": "string"},
                        },
                    },
                },
            },
        },
        "Transcript": {
            "type": "object",
            "required": ["session", "messages", "cursor", "more"],
            "properties": {
                "session": {"type": "string"},
                "messages": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["message", "parts"],
                        "properties": {
                            "message": _ref("Message"),
                            "parts": {"type": "array", "items": _ref("Part")},
                        },
                    },
                },
                "cursor": _SCALAR_OR_NULL,
                "more": {"type": "boolean"},
            },
        },
    }


def _model_schemas() -> dict[str, Any]:
    """The JSON schemas of the library's models the API returns, refs into components."""
    models: list[type[BaseModel]] = [ContextItem, RequestHeader, Manifest, Message, *PART_TYPES]
    top, defs = models_json_schema(
        [(model, "serialization") for model in models], ref_template=_REF
    )
    schemas: dict[str, Any] = dict(defs.get("$defs", {}))
    for (model, _), schema in top.items():
        if "$ref" in schema:  # the model itself is in $defs already, under its name
            continue
        schemas[model.__name__] = schema
    refs = {
        str(part.model_fields["kind"].default): top[(part, "serialization")]["$ref"]
        for part in PART_TYPES
    }
    schemas["Part"] = {
        "oneOf": [{"$ref": ref} for ref in refs.values()],
        "discriminator": {"propertyName": "kind", "mapping": refs},
    }
    return schemas


class _Operations:
    """Builds operation objects with the parameters and errors one app can answer."""

    def __init__(self, *, authenticated: bool, namespaced: bool) -> None:
        self.authenticated = authenticated
        self.namespaced = namespaced

    def errors(self, *statuses: int) -> dict[str, Any]:
        always = (400, 429, 503)
        chosen = set(statuses) | set(always)
        if self.authenticated:
            chosen.add(401)
        return {str(code): _error(_ERRORS[code]) for code in sorted(chosen)}

    @staticmethod
    def namespace_params(query: bool) -> list[dict[str, Any]]:
        """The namespace header, and for a live stream (an EventSource sends no headers)
        its query parameter too, which must then agree with the header."""
        name = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_LENGTH}
        params = [
            {
                "name": NAMESPACE_HEADER,
                "in": "header",
                # what survives as a header value: printable ASCII, no edge spaces
                "schema": {**name, "pattern": "^[!-~](?:[ -~]*[!-~])?$"},
                "description": "The namespace to work in (default: the journal's).",
            }
        ]
        if query:
            params.append(
                {
                    "name": "namespace",
                    "in": "query",
                    "schema": {**name, "pattern": _NO_CONTROL.replace("*", "+")},
                    "description": "The namespace, for EventSource clients (which cannot "
                    "send headers); it must agree with the header when both are sent.",
                }
            )
        return params

    def api(
        self,
        summary: str,
        responses: dict[str, Any],
        *,
        parameters: Sequence[dict[str, Any]] = (),
        errors: tuple[int, ...] = (),
        body: dict[str, Any] | None = None,
        live: bool = False,
    ) -> dict[str, Any]:
        statuses = set(errors)
        if self.namespaced:
            statuses.add(403)
        operation: dict[str, Any] = {
            "summary": summary,
            "parameters": [*parameters, *self.namespace_params(query=live)],
            "responses": {**responses, **self.errors(*statuses)},
        }
        if body is not None:
            operation["requestBody"] = body
        if self.authenticated:
            operation["security"] = [{"bearer": []}]
        return operation


def _json(description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": schema}}}


def _sse(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"text/event-stream": {"schema": {}}}}


def _path_param(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": schema,
        "description": description,
    }


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "schema": schema, "description": description}


def openapi_schema(
    *, max_body_bytes: int, authenticated: bool, namespaced: bool, version: str = "0"
) -> dict[str, Any]:
    """The OpenAPI 3.1 document of an app whose bodies are limited to ``max_body_bytes``,
    which requires a bearer token when ``authenticated`` and serves only some namespaces
    (403 for others) when ``namespaced``."""
    ops = _Operations(authenticated=authenticated, namespaced=namespaced)
    name = {
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_NAME_LENGTH,
        "pattern": f"^{_EDGE}(?:[^{_CONTROL}]*{_EDGE})?$",
    }
    stream = _path_param("stream", "The stream name (it may hold slashes).", name)
    session = _path_param("session", "The transcript session.", name)
    after = _query(
        "after",
        "A cursor: start after this event (404 when it names no event of the stream).",
        {"type": "string", "pattern": "^([0-9]{1,18})?$"},
    )
    limit = _query(
        "limit",
        "Most events in the page.",
        {
            "type": "integer",
            "minimum": 1,
            "maximum": MAX_PAGE,
            "default": 100,
        },
    )
    sse_token = (
        [_query("access_token", "The bearer token, for EventSource clients.", {"type": "string"})]
        if authenticated
        else []
    )
    static = {
        "/": ("the web inspector", "text/html"),
        "/inspector.js": ("the inspector's script", "text/javascript"),
        "/inspector.css": ("the inspector's style sheet", "text/css"),
        "/favicon.svg": ("the inspector's icon", "image/svg+xml"),
    }
    paths: dict[str, Any] = {
        path: {
            "get": {
                "summary": f"The static file of {what} (no data in it; no token needed).",
                "responses": {
                    "200": {
                        "description": what,
                        "content": {media: {"schema": {"type": "string"}}},
                    },
                    **{str(code): _error(_ERRORS[code]) for code in (400, 429, 503)},
                },
            }
        }
        for path, (what, media) in static.items()
    }
    paths[OPENAPI_PATH] = {
        "get": {
            "summary": "This document.",
            "responses": {
                "200": _json("The OpenAPI document.", {"type": "object"}),
                **ops.errors(),
            },
            **({"security": [{"bearer": []}]} if authenticated else {}),
        }
    }
    paths["/v1/streams"] = {
        "get": ops.api(
            "The streams of the namespace with their versions, by name.",
            {"200": _json("The streams.", _ref("Streams"))},
            parameters=[
                _query("prefix", "Only streams whose name starts with this.", {"type": "string"}),
                _query(
                    "limit",
                    "Most streams listed.",
                    {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_PAGE,
                        "default": MAX_PAGE,
                    },
                ),
            ],
        )
    }
    paths["/v1/streams/{stream}/events"] = {
        "get": ops.api(
            "A page of the stream's events, oldest first.",
            {"200": _json("The page and the cursor to continue from.", _ref("Page"))},
            parameters=[stream, after, limit],
            errors=(404,),
        ),
        "post": ops.api(
            "Append events atomically: all of them get consecutive positions, or none is "
            "written. An external writer may not append the runtime's events; its "
            "actorless context items are stamped with an http actor.",
            {
                "201": _json("Appended.", _ref("AppendResult")),
                "200": _json("An idempotent retry: nothing was written.", _ref("AppendResult")),
            },
            parameters=[stream],
            errors=(408, 409, 413, 415),
            body={"required": True, "content": {_JSON: {"schema": _ref("AppendRequest")}}},
        ),
    }
    paths["/v1/streams/{stream}/context"] = {
        "get": ops.api(
            "The agent context of the stream: both lanes, each item with its header line, "
            "wire role and trust.",
            {"200": _json("The context.", _ref("Context"))},
            parameters=[stream],
            errors=(404,),
        )
    }
    paths["/v1/streams/{stream}/requests/{offset}"] = {
        "get": ops.api(
            "The exact body of the request recorded at offset, rebuilt from the journal; "
            "view=manifest gives its manifest instead (Buzz's: schemaVersion, hash, layers), "
            "recomputed from the turn records, null for a request outside an event-driven turn.",
            {
                "200": {
                    "description": "The body, byte for byte as it was sent (view=body), or "
                    "{stream, offset, manifest} (view=manifest).",
                    "headers": {
                        SHA256_HEADER: {"schema": {"type": "string"}, "required": True},
                        TRANSPORT_HEADER: {"schema": {"type": "string"}, "required": True},
                        MANIFEST_HEADER: {
                            "schema": {"type": "string"},
                            "description": "The request's manifest hash, when it has one.",
                        },
                    },
                    "content": {_JSON: {"schema": {"type": "object"}}},
                }
            },
            parameters=[
                stream,
                _path_param(
                    "offset",
                    "The request's position (@N).",
                    {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 2**63 - 1,
                    },
                ),
                _query(
                    "view",
                    "body: the request body; manifest: its manifest.",
                    {"type": "string", "enum": ["body", "manifest"], "default": "body"},
                ),
            ],
            errors=(400, 404),
        )
    }
    paths["/v1/streams/{stream}/refs/{offset}"] = {
        "get": ops.api(
            "The whole text the ref stream@offset names: a tool output (its chunks joined) "
            "or a context item's content, where the model saw it cut.",
            {
                "200": {
                    "description": "The text as UTF-8, byte for byte as it was recorded.",
                    "content": {"text/plain; charset=utf-8": {"schema": {"type": "string"}}},
                }
            },
            parameters=[
                stream,
                _path_param(
                    "offset",
                    "The position (@N) of a tool result or a context item.",
                    {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
                ),
            ],
            errors=(404,),
        )
    }
    paths["/v1/streams/{stream}/verify"] = {
        "get": ops.api(
            "Rebuild every recorded request and report those whose bytes drifted.",
            {"200": _json("The verification.", _ref("Verification"))},
            parameters=[stream],
            errors=(404,),
        )
    }
    paths["/v1/streams/{stream}/tail"] = {
        "get": ops.api(
            "Server-sent events: the stream's events from after= on, live. Each event's id "
            "is its cursor (Last-Event-ID resumes); an event: reset frame says the cursor "
            "names no event any more and the stream follows from its start.",
            {"200": _sse("The live tail.")},
            parameters=[
                stream,
                after,
                {"name": "Last-Event-ID", "in": "header", "schema": {"type": "string"}},
                *sse_token,
            ],
            live=True,
        )
    }
    paths["/v1/sessions/{session}/transcript"] = {
        "get": ops.api(
            "The session's transcript rows: messages with their parts, oldest first.",
            {"200": _json("The rows.", _ref("Transcript"))},
            parameters=[
                session,
                _query(
                    "after",
                    "A message cursor from a previous page.",
                    {"type": "string", "pattern": "^(m[0-9]{1,19})?$"},
                ),
                _query(
                    "limit",
                    "Most messages in the page.",
                    {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": MAX_PAGE_SIZE,
                    },
                ),
                _query(
                    "view",
                    "full pages through every message; compacted is the "
                    "model-facing view in one response.",
                    {
                        "type": "string",
                        "enum": ["full", "compacted"],
                        "default": "full",
                    },
                ),
            ],
            errors=(404,),
        )
    }
    paths["/v1/sessions/{session}/live"] = {
        "get": ops.api(
            "Server-sent events of the session's transcript bus (rows written, deltas).",
            {"200": _sse("The live bus.")},
            parameters=[session, *sse_token],
            errors=(404,),
            live=True,
        )
    }
    paths.update(trace_paths(ops, stream, after))
    components: dict[str, Any] = {
        "schemas": {**_model_schemas(), **_static_schemas(max_body_bytes)}
    }
    if authenticated:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "contextfold",
            "version": version,
            "description": "An append-only event journal for the context of LLM agents. "
            'Every error is {"error": {"type", "message"}}; no failed request writes '
            "anything.",
        },
        "paths": paths,
        "components": components,
    }
