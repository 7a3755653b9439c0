"""A scripted tool-heavy model for JournalModel's tests: it reads files with a tool for a few
steps per task, answers, and writes a deterministic summary when asked for one."""

from __future__ import annotations

from agents import function_tool

import contextfold as cf
from contextfold.context.compaction import COMPACTION_INSTRUCTION

__all__ = ["STEPS", "Worker", "read_file", "split_pairs"]

STEPS = 2
"""Tool calls per task, then the answer."""


@function_tool
def read_file(path: str) -> str:
    """Read a file of the workspace."""
    return f"{path}: " + "x" * 1_200


class Worker:
    """Calls ``read_file`` STEPS times per task, then answers; summarizes when asked."""

    def __init__(self) -> None:
        self.requests: list[cf.NeutralRequest] = []
        self.summaries: list[cf.NeutralRequest] = []

    def __call__(self, request: cf.NeutralRequest) -> cf.ModelOutput | str:
        if request.messages[-1].content == COMPACTION_INSTRUCTION:
            self.summaries.append(request)
            return f"summary {len(self.summaries)}: the files read so far"
        self.requests.append(request)
        n = len(self.requests)
        if n % (STEPS + 1) == 0:
            return f"done {n}"
        call = cf.ToolCall(id=f"call_{n}", name="read_file", arguments=f'{{"path": "f{n}.py"}}')
        return cf.ModelOutput(tool_calls=(call,))


def split_pairs(request: cf.NeutralRequest) -> int:
    """Tool calls without their result and results without their call."""
    made: set[str] = set()
    answered: set[str] = set()
    orphans = 0
    for message in request.messages:
        if message.tool_call_id is not None:
            if message.tool_call_id in made:
                answered.add(message.tool_call_id)
            else:
                orphans += 1
        made.update(call.id for call in message.tool_calls)
    return orphans + len(made - answered)
