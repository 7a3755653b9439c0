"""Tools: Python callables with pydantic-typed arguments, offered to the model.

``Tool.from_function(fn)`` (or the :func:`tool` decorator) reads the signature: each
parameter becomes a field of an arguments model, so the JSON schema the model sees and the
validation of its arguments come from the same place. A parameter annotated
:class:`ToolContext` is not an argument: it receives the call's id and stream (a stable
idempotency key for side effects). A tool never raises into the loop: bad arguments and
exceptions become an error result the model can read.

``idempotent`` says whether a call that may already have run (the agent stopped after
starting it and before recording its result) may run again: see ``Agent``'s
``on_interrupted_tool``.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, get_type_hints, overload

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from .._aio import CancelWatch
from ..canonical import canonical_json
from ..errors import ConfigurationError, UsageError
from ..wire import ToolCall, ToolDefinition

__all__ = ["Tool", "ToolContext", "ToolOutcome", "Toolbox", "tool"]


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """The result of one call: its output text and whether it failed."""

    call_id: str
    name: str
    output: str
    is_error: bool = False


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a running tool knows about its call. A tool parameter annotated ``ToolContext``
    receives it; it is not part of the arguments schema the model sees."""

    call_id: str
    """The tool call's id as the journal records it: unique within the stream's context."""
    name: str
    """The tool's name."""
    stream: str | None = None
    """The agent's stream (None when the tool is called outside an agent)."""
    resumed: bool = False
    """An earlier run of this call was started and recorded no result: this is a rerun
    (only tools that may run again, see ``Tool.idempotent``, are run again)."""

    @property
    def idempotency_key(self) -> str:
        """A key naming this call of this stream, the same on every run of it (a rerun after
        a crash included): pass it to an API that deduplicates side effects (a payment).
        64 hex characters."""
        return hashlib.sha256(canonical_json([self.stream, self.call_id])).hexdigest()


@dataclass(frozen=True, slots=True)
class Tool:
    """A callable the model can call: name, description, arguments model and function.

    ``idempotent``: True, a call that may already have run is run again; False, it never is;
    None (the default), the agent's ``on_interrupted_tool`` policy decides.
    ``context_parameter`` names the function's :class:`ToolContext` parameter, if any.
    Calling a Tool calls its function.
    """

    name: str
    description: str
    arguments: type[BaseModel]
    fn: Callable[..., Any]
    idempotent: bool | None = None
    context_parameter: str | None = None

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        idempotent: bool | None = None,
    ) -> Tool:
        """A tool from a function with type-annotated parameters; the docstring describes it.
        Raises TypeError for ``*args``/``**kwargs`` or two ``ToolContext`` parameters."""
        hints = get_type_hints(fn)
        fields: dict[str, Any] = {}
        context_parameter: str | None = None
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise UsageError(
                    f"tool {fn.__name__}: *args/**kwargs cannot be described to a model"
                )
            annotation = hints.get(param.name, Any)
            if annotation is ToolContext:
                if context_parameter is not None:
                    raise UsageError(
                        f"tool {fn.__name__}: parameters {context_parameter!r} and "
                        f"{param.name!r} both ask for the ToolContext; keep one"
                    )
                context_parameter = param.name
                continue
            default = ... if param.default is param.empty else param.default
            fields[param.name] = (annotation, default)
        model = create_model(
            f"{fn.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields
        )
        doc = inspect.getdoc(fn) or ""
        return cls(
            name or fn.__name__,
            description or doc.split("\n\n")[0],
            model,
            fn,
            idempotent,
            context_parameter,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def definition(self) -> ToolDefinition:
        """The tool as the model is offered it (its arguments' JSON schema, title left out)."""
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        return ToolDefinition.from_schema(
            name=self.name, description=self.description, parameters=schema
        )

    def refusal(self, call: ToolCall) -> ToolOutcome | None:
        """The error outcome of ``call`` when its arguments do not validate (the function
        would not run), else None."""
        args = self._validated(call)
        return args if isinstance(args, ToolOutcome) else None

    def _validated(self, call: ToolCall) -> BaseModel | ToolOutcome:
        try:
            raw = json.loads(call.arguments) if call.arguments.strip() else {}
            return self.arguments.model_validate(raw)
        except (ValueError, ValidationError) as exc:
            return ToolOutcome(
                call.id, self.name, f"invalid arguments for {self.name}: {exc}", True
            )

    async def call(
        self,
        call: ToolCall,
        context: ToolContext | None = None,
        *,
        on_start: Callable[[], Awaitable[None]] | None = None,
    ) -> ToolOutcome:
        """Validate the model's arguments and run the function; errors become error outcomes.

        ``on_start`` is awaited once the arguments are valid, right before the function
        runs (the agent records that the call started); what it raises propagates and the
        function does not run. ``context`` defaults to one without a stream.
        """
        args = self._validated(call)
        if isinstance(args, ToolOutcome):
            return args
        kwargs = {k: getattr(args, k) for k in type(args).model_fields}
        if self.context_parameter is not None:
            kwargs[self.context_parameter] = context or ToolContext(call.id, self.name)
        if on_start is not None:
            await on_start()
        cancel = CancelWatch()
        try:
            result = self.fn(**kwargs)
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


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None, idempotent: bool | None = None
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    idempotent: bool | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Decorator form of :meth:`Tool.from_function`: ``@tool`` or ``@tool(idempotent=True)``.
    The decorated name is a :class:`Tool`, still callable as the function."""
    if fn is not None:
        return Tool.from_function(fn)

    def decorate(function: Callable[..., Any]) -> Tool:
        return Tool.from_function(
            function, name=name, description=description, idempotent=idempotent
        )

    return decorate


class Toolbox:
    """The tools of an agent, by name."""

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        self._definitions: tuple[ToolDefinition, ...] | None = None
        for item in tools:
            made = item if isinstance(item, Tool) else Tool.from_function(item)
            if made.name in self._tools:
                raise ConfigurationError(f"two tools are named {made.name!r}")
            self._tools[made.name] = made

    @property
    def definitions(self) -> tuple[ToolDefinition, ...]:
        """Each tool as the model is offered it (built once: a toolbox's tools never change)."""
        if self._definitions is None:
            self._definitions = tuple(tool.definition for tool in self._tools.values())
        return self._definitions

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def starts(self, call: ToolCall) -> bool:
        """Whether :meth:`call` would run the call's function (its ``on_start`` awaited
        first): its tool is known and its arguments are valid."""
        found = self._tools.get(call.name)
        return found is not None and found.refusal(call) is None

    async def call(
        self,
        call: ToolCall,
        context: ToolContext | None = None,
        *,
        on_start: Callable[[], Awaitable[None]] | None = None,
    ) -> ToolOutcome:
        """Run the named tool (see :meth:`Tool.call`); an unknown name is an error outcome
        (nothing runs, ``on_start`` is not awaited)."""
        found = self._tools.get(call.name)
        if found is None:
            known = ", ".join(sorted(self._tools)) or "none"
            return ToolOutcome(
                call.id, call.name, f"unknown tool {call.name!r}; available: {known}", True
            )
        return await found.call(call, context, on_start=on_start)
