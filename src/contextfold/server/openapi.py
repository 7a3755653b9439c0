"""The OpenAPI 3.1 description of the server, served at ``/openapi.json``.

Built once per app from its configuration, so every status it documents is one that app
can answer: 401 only with a token, 403 only with a namespace allow-list, the body limit
the app enforces. The paths are written here, next to the routes they describe
(:mod:`.streams`, :mod:`.sessions`; the trace routes' in :mod:`.trace_docs`); the bodies
they reference are in :mod:`.openapi_schemas`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from ..journal.encode import MAX_NAME_LENGTH, is_hidden_character
from ..transcript.store.base import MAX_PAGE_SIZE
from .body import NAMESPACE_HEADER, NAMESPACE_HEADER_PATTERN
from .openapi_schemas import component_schemas, schema_ref
from .streams import MANIFEST_HEADER, MAX_PAGE, SHA256_HEADER, TRANSPORT_HEADER
from .trace_docs import trace_paths

__all__ = ["OPENAPI_PATH", "openapi_schema"]

OPENAPI_PATH = "/openapi.json"

_JSON = "application/json"


@functools.cache
def _refused() -> str:
    """What names may not hold, as the body of a regex class: every character of the Basic
    Multilingual Plane that ``journal.encode.check_name_characters`` refuses (control, bidi,
    format and zero-width characters, separators, fillers, the byte order mark), so the
    document and the server agree. A pattern without the ``u`` flag cannot name those beyond
    it (tag characters, supplementary selectors); the server still refuses them."""
    refused = [code for code in range(0x10000) if is_hidden_character(chr(code))]
    ranges: list[str] = []
    start = previous = refused[0]
    for code in [*refused[1:], -1]:
        if code != previous + 1:
            ranges.append(f"\\u{start:04x}" + ("" if start == previous else f"-\\u{previous:04x}"))
            start = code
        previous = code
    return "".join(ranges)


def _no_control() -> str:
    return f"^[^{_refused()}]*$"


def _stream_name_pattern() -> str:
    edge = f"[^\\s{_refused()}]"  # a name neither starts nor ends with whitespace
    return f"^{edge}(?:[^{_refused()}]*{edge})?$"


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {_JSON: {"schema": schema_ref("Error")}}}


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
    507: "The journal's disk is full or its file reached a size quota; nothing was written.",
}


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
                "schema": {**name, "pattern": NAMESPACE_HEADER_PATTERN},
                "description": "The namespace to work in (default: the journal's).",
            }
        ]
        if query:
            params.append(
                {
                    "name": "namespace",
                    "in": "query",
                    "schema": {**name, "pattern": _no_control().replace("*", "+")},
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
        "pattern": _stream_name_pattern(),
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
            "A page of the namespace's streams with their versions, by name (code point "
            "order). next is the after of the following page, null on the last; a query "
            "parameter not listed here gets 400.",
            {"200": _json("The page of streams.", schema_ref("Streams"))},
            parameters=[
                _query("prefix", "Only streams whose name starts with this.", {"type": "string"}),
                _query(
                    "after",
                    "Only streams named after this one (the next of the previous page); it "
                    "need not name a stream any more. 400 for a value that is no stream name.",
                    name,
                ),
                _query(
                    "limit",
                    "Most streams in the page.",
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
            {"200": _json("The page and the cursor to continue from.", schema_ref("Page"))},
            parameters=[stream, after, limit],
            errors=(404,),
        ),
        "post": ops.api(
            "Append events atomically: all of them get consecutive positions, or none is "
            "written. An external writer may not append the runtime's events; its "
            "actorless context items are stamped with an http actor.",
            {
                "201": _json("Appended.", schema_ref("AppendResult")),
                "200": _json(
                    "An idempotent retry: nothing was written.", schema_ref("AppendResult")
                ),
            },
            parameters=[stream],
            errors=(408, 409, 413, 415, 507),
            body={"required": True, "content": {_JSON: {"schema": schema_ref("AppendRequest")}}},
        ),
    }
    paths["/v1/streams/{stream}/context"] = {
        "get": ops.api(
            "The agent context of the stream: both lanes, each item with its header line, "
            "wire role and trust.",
            {"200": _json("The context.", schema_ref("Context"))},
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
            "Rebuild every recorded request and report those whose bytes drifted, the "
            "first limit of them (drift_count counts all).",
            {"200": _json("The verification.", schema_ref("Verification"))},
            parameters=[
                stream,
                _query(
                    "limit",
                    "Most drifts listed.",
                    {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100},
                ),
            ],
            errors=(400, 404),
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
            {"200": _json("The rows.", schema_ref("Transcript"))},
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
    components: dict[str, Any] = {"schemas": component_schemas(max_body_bytes)}
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
