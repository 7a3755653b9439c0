"""pydantic-ai's capability parts (2.78 and later), built for the part-kind helpers: empty on
an older pydantic-ai, where the kind does not exist and nothing needs to cover it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

__all__ = ["capability_parts", "more_capability_parts"]

_T0 = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)

try:
    from pydantic_ai.messages import (
        DataCapabilityPart,
        InstructionCapabilityPart,
        OperatorSource,
        StructuredContent,
        UserSource,
    )
except ImportError:  # pydantic-ai before 2.78
    _AVAILABLE = False
else:
    _AVAILABLE = True

    @dataclass(kw_only=True)
    class ProgressPart(
        DataCapabilityPart[StructuredContent | str],
        namespace="tests",
        tag="progress_report",
        attributes=("task_id",),
    ):
        """A capability part of the data voice, with a typed field of its own."""

        task_id: str

    @dataclass(kw_only=True)
    class RequestsLeftPart(InstructionCapabilityPart, namespace="tests"):
        """A capability part of the instruction voice, scoped to one request."""


def capability_parts(text: str) -> dict[str, Callable[[], Any]]:
    """The builder of the ``capability`` request part kind, when pydantic-ai defines it."""
    if not _AVAILABLE:
        return {}
    return {
        "capability": lambda: ProgressPart(
            content=StructuredContent({"done": 3, "of": [text, None]}),
            source=UserSource(),
            task_id=text,
            capability_id="cap-1",
            metadata={"seen": [1.5]},
            timestamp=_T0,
            record_id="rec-1",
        )
    }


def more_capability_parts(text: str) -> list[Any]:
    """A capability part of the other voice, as an application enqueues it for one request."""
    if not _AVAILABLE:
        return []
    return [
        RequestsLeftPart(
            content=text, source=OperatorSource(), scope="request", timestamp=_T0, record_id="rec-2"
        )
    ]
