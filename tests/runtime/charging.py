"""A side-effecting tool for the at-most-once tests: ``charge`` appends a line to a marker
file (the side effect a payment API would make), then answers or blocks until killed."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import contextfold as cf

__all__ = ["CALL", "Charges", "charge_tool", "model"]

CALL = cf.ToolCall(id="call-1", name="charge", arguments='{"amount": 100}')


def model(request: cf.NeutralRequest) -> cf.ModelOutput | str:
    """Call ``charge`` once, then say what the tool answered."""
    last = request.messages[-2]  # the last message is the request's timestamp tail
    if last.role == "tool":
        return f"tool said: {last.content.splitlines()[-1]}"
    return cf.ModelOutput(tool_calls=(CALL,))


class Charges:
    """The marker file: one line per side effect, ``call_id key resumed amount``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[list[str]]:
        if not self.path.exists():
            return []
        return [line.split() for line in self.path.read_text().splitlines()]


def charge_tool(
    marker: Path,
    *,
    idempotent: bool | None = None,
    block: threading.Event | None = None,
    printed: bool = False,
) -> cf.Tool:
    """The ``charge`` tool writing to ``marker``; with ``block`` it waits on it after the
    side effect (forever, when nothing sets it: the process is killed there)."""

    def charge(amount: int, ctx: cf.ToolContext) -> str:
        """Charge the customer's card."""
        with marker.open("a") as out:
            out.write(f"{ctx.call_id} {ctx.idempotency_key} {ctx.resumed} {amount}\n")
            out.flush()
            os.fsync(out.fileno())
        if printed:
            print("charged", flush=True)
        if block is not None:
            block.wait()
        return f"charged {amount}"

    return cf.Tool.from_function(charge, idempotent=idempotent)
