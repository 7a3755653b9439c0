"""Tools: Python callables with pydantic-typed arguments, offered to the model.

``Tool.from_function(fn)`` reads the signature: each parameter becomes a field of an
arguments model, so the JSON schema the model sees and the validation of its arguments
come from the same place. A tool never raises into the loop: bad arguments and
exceptions become an error result the model can read.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from .._aio import CancelWatch
from ..render.neutral import ToolCall, ToolSpec

__all__ = ["Tool", "ToolOutcome", "Toolbox"]


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """The result of one call: its output text and whether it failed."""

    call_id: str
    name: str
    output: str
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class Tool:
    """A callable the model can call: name, description, arguments model and function."""

    name: str
    description: str
    arguments: type[BaseModel]
    fn: Callable[..., Any]

    @classmethod
    def from_function(
        cls, fn: Callable[..., Any], *, name: str | None = None, description: str | None = None
    ) -> Tool:
        """A tool from a function with type-annotated parameters; the docstring describes it."""
        hints = get_type_hints(fn)
        fields: dict[str, Any] = {}
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(
                    f"tool {fn.__name__}: *args/**kwargs cannot be described to a model"
                )
            annotation = hints.get(param.name, Any)
            default = ... if param.default is param.empty else param.default
            fields[param.name] = (annotation, default)
        model = create_model(
            f"{fn.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        doc = inspect.getdoc(fn) or ""
        return cls(name or fn.__name__, description or doc.split("\n\n")[0], model, fn)

    @property
    def spec(self) -> ToolSpec:
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        return ToolSpec.from_schema(name=self.name, description=self.description, parameters=schema)

    async def call(self, call: ToolCall) -> ToolOutcome:
        """Validate the model's arguments and run the function; errors become error outcomes."""
        try:
            raw = json.loads(call.arguments) if call.arguments.strip() else {}
            args = self.arguments.model_validate(raw)
        except (ValueError, ValidationError) as exc:
            return ToolOutcome(
                call.id, self.name, f"invalid arguments for {self.name}: {exc}", True
            )
        cancel = CancelWatch()
        try:
            result = self.fn(**{k: getattr(args, k) for k in type(args).model_fields})
            if inspect.isawaitable(result):
                result = await result
        except Exception as exc:  # the model reads the failure; the loop goes on
            return ToolOutcome(call.id, self.name, f"{type(exc).__name__}: {exc}", True)
        except asyncio.CancelledError as exc:
            if cancel.requested():
                raise  # the agent itself is cancelled (a shutdown)
            # Something the tool awaited was cancelled, not the agent: the tool failed.
            why = str(exc) or f"something {self.name} awaited was cancelled"
            return ToolOutcome(call.id, self.name, f"CancelledError: {why}", True)
        if isinstance(result, BaseModel):
            output = result.model_dump_json()
        elif isinstance(result, str):
            output = result
        else:
            output = json.dumps(result, sort_keys=True, default=str)
        return ToolOutcome(call.id, self.name, output)


class Toolbox:
    """The tools of an agent, by name."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            tool = item if isinstance(item, Tool) else Tool.from_function(item)
            if tool.name in self._tools:
                raise ValueError(f"two tools are named {tool.name!r}")
            self._tools[tool.name] = tool

    @property
    def specs(self) -> tuple[ToolSpec, ...]:
        return tuple(tool.spec for tool in self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    async def call(self, call: ToolCall) -> ToolOutcome:
        tool = self._tools.get(call.name)
        if tool is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return ToolOutcome(
                call.id, call.name, f"unknown tool {call.name!r}; available: {known}", True
            )
        return await tool.call(call)
