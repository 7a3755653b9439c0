"""Transitional: the old home of the neutral request, now `contextfold.wire`.

Removed once every importer uses `contextfold.wire` (and the toolbox's definitions are
`wire.ToolDefinition`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..canonical import canonical_json, check_json_value, loads
from ..errors import RenderError
from ..wire import (
    TRANSPORTS,
    NeutralMessage,
    NeutralRequest,
    RenderedRequest,
    Role,
    ToolCall,
    Transport,
    render_body,
    render_request,
)
from .pairing import order_tool_results

__all__ = [
    "TRANSPORTS",
    "NeutralMessage",
    "NeutralRequest",
    "RenderedRequest",
    "Role",
    "ToolCall",
    "ToolSpec",
    "Transport",
    "order_tool_results",
    "render_body",
    "render_request",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class ToolSpec:
    """A tool offered to the model; immutable and hashable.

    Build it with `ToolSpec.from_schema` from a JSON-schema mapping; the schema is kept
    as canonical JSON bytes so equal schemas compare and hash equal.
    """

    name: str
    """Tool name as the model calls it."""
    description: str
    """What the tool does, shown to the model."""
    parameters_json: bytes
    """Canonical JSON bytes of the JSON schema of the tool's arguments (an object schema)."""
    strict: bool = False
    """OpenAI strict schema adherence; sent explicitly on OpenAI, not sent to Anthropic."""

    def __post_init__(self) -> None:
        if not self.name:
            raise RenderError("ToolSpec.name is empty")
        try:
            schema = loads(self.parameters_json)
        except ValueError as exc:
            raise RenderError(f"ToolSpec {self.name!r}: parameters_json is not JSON") from exc
        if not isinstance(schema, dict) or schema.get("type", "object") != "object":
            raise RenderError(
                f"ToolSpec {self.name!r}: parameters must be a JSON object schema "
                '("type": "object" or no type); every provider requires an object schema'
            )
        if canonical_json(schema) != self.parameters_json:
            raise RenderError(
                f"ToolSpec {self.name!r}: parameters_json is not canonical JSON; "
                "build the spec with ToolSpec.from_schema"
            )

    @classmethod
    def from_schema(
        cls,
        *,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        strict: bool = False,
    ) -> ToolSpec:
        """A spec from a JSON-schema mapping. Raises RenderError if it is not plain JSON."""
        try:
            check_json_value(dict(parameters), where=f"tool {name!r} parameters")
            data = canonical_json(dict(parameters))
        except ValueError as exc:
            raise RenderError(str(exc)) from exc
        return cls(name=name, description=description, parameters_json=data, strict=strict)

    def parameters(self) -> dict[str, Any]:
        """A fresh dict of the schema as sent; a missing ``"type"`` is sent as ``"object"``.

        Tool arguments are always an object, so the default changes no meaning, and it
        makes an empty schema (a tool without arguments) acceptable to every provider.
        """
        schema: dict[str, Any] = loads(self.parameters_json)
        schema.setdefault("type", "object")
        return schema
