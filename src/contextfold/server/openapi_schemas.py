"""The component schemas of the server's OpenAPI description: the bodies it reads and
writes (written here) and the JSON schemas of the library's own models it returns (context
items, request headers, manifests, transcript rows), referenced from the paths
(:mod:`.openapi`)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ..context.events import RequestHeader
from ..context.manifest import Manifest
from ..context.state import ContextItem
from ..events import RUNTIME_TYPE_PREFIXES, TYPE_NAME
from ..transcript.parts import PART_TYPES, Message
from .body import MAX_META_CHARS

__all__ = ["component_schemas", "schema_ref"]

_REF = "#/components/schemas/{model}"


def schema_ref(name: str) -> dict[str, str]:
    """A reference to the component schema ``name``."""
    return {"$ref": _REF.format(model=name)}


def component_schemas(max_body_bytes: int) -> dict[str, Any]:
    """Every schema of ``components``; ``max_body_bytes`` bounds the append body."""
    return {**_model_schemas(), **_static_schemas(max_body_bytes)}


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
                {"type": "array", "items": schema_ref("JsonValue")},
                {"type": "object", "additionalProperties": schema_ref("JsonValue")},
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
                    "description": "The event type. Types only the runtime or an "
                    f"integration writes ({', '.join(RUNTIME_TYPE_PREFIXES)}; of them, "
                    "context-added is open to all) need a trusted writer; a type this server "
                    "knows must validate against its class, without unknown fields.",
                },
                "payload": {
                    **schema_ref("JsonValue"),
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
                "events": {"type": "array", "minItems": 1, "items": schema_ref("NewEvent")},
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
                "readable": {
                    "description": "A LangGraph checkpoint record's payload with its "
                    "serialized values decoded, for reading (payload_view says how much)."
                },
                "payload_view": {
                    "type": "string",
                    "enum": ["decoded", "partly decoded", "as stored"],
                },
                "payload_note": {
                    "type": "string",
                    "description": "Why a serialized value stayed as stored.",
                },
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
                "events": {"type": "array", "items": schema_ref("Event")},
                "cursor": {"type": ["string", "null"]},
                "reset": {"type": "boolean"},
                "more": {"type": "boolean", "description": "limit cut the page short."},
            },
        },
        "Streams": {
            "type": "object",
            "required": ["streams", "next"],
            "properties": {
                "streams": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["stream", "version"],
                        "properties": {"stream": {"type": "string"}, "version": position},
                    },
                },
                "next": {
                    "type": ["string", "null"],
                    "description": "Pass it as after= for the following page; null: this "
                    "page is the last.",
                },
            },
        },
        "ContextEntry": {
            "allOf": [
                schema_ref("ContextItem"),
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
                "header": {"anyOf": [schema_ref("RequestHeader"), {"type": "null"}]},
                "system": {"type": "array", "items": schema_ref("ContextEntry")},
                "history": {"type": "array", "items": schema_ref("ContextEntry")},
            },
        },
        "Verification": {
            "type": "object",
            "required": ["stream", "ok", "requests", "drift_count", "drifts", "corrupt"],
            "properties": {
                "stream": {"type": "string"},
                "ok": {
                    "type": "boolean",
                    "description": "True only when requests were checked and none drifted.",
                },
                "requests": {"type": "integer", "minimum": 0},
                "drift_count": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Every drift found; drifts lists the first limit of them.",
                },
                "drifts": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": [
                            "request_offset",
                            "recorded",
                            "rebuilt",
                            "error",
                            "recorded_at",
                        ],
                        "properties": {
                            "request_offset": position,
                            "recorded": {"type": "string"},
                            "rebuilt": _SCALAR_OR_NULL,
                            "error": _SCALAR_OR_NULL,
                            "recorded_at": position,
                        },
                    },
                },
                "framework_requests": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Requests a framework's integration recorded (present "
                    "when the stream holds call records).",
                },
                "framework_views": {"type": "integer", "minimum": 0},
                "frameworks": {"type": "array", "items": {"type": "string"}},
                "framework_problem_count": {"type": "integer", "minimum": 0},
                "framework_problems": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["position", "problem"],
                        "properties": {"position": position, "problem": {"type": "string"}},
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
                            "message": schema_ref("Message"),
                            "parts": {"type": "array", "items": schema_ref("Part")},
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
