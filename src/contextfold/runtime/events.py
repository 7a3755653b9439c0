"""What the agent loop tells its observers (printing, a transcript, metrics)."""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["AgentObserver", "Observers"]


class AgentObserver(Protocol):
    """Hooks for what the loop does (printing, a transcript, metrics). All optional."""

    async def on_event(self, name: str, **data: Any) -> None: ...


class Observers:
    """Several observers as one, called in order."""

    def __init__(self, *observers: AgentObserver) -> None:
        self.observers = observers

    async def on_event(self, name: str, **data: Any) -> None:
        for observer in self.observers:
            await observer.on_event(name, **data)
