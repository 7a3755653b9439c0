"""What one run of the agent loop did."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["RunReport", "Status"]

Status = Literal["idle", "queued", "busy", "stopped"]


@dataclass(slots=True)
class RunReport:
    """What one ``run_until_idle`` did."""

    requests: list[int] = field(default_factory=list)
    interrupted: list[int] = field(default_factory=list)
    tool_calls: int = 0
    not_rerun: list[str] = field(default_factory=list)
    """Ids of calls that may already have run and were answered with an error, not run."""
    compactions: list[int] = field(default_factory=list)
    status: Status = "idle"
    reason: str = ""
