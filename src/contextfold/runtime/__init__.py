"""The agent runtime: the loop, scheduling, model clients and tools."""

from .events import AgentObserver
from .local import LocalModel
from .loop import Agent, system_prompt
from .models import (
    AnthropicModel,
    FunctionModel,
    ModelClient,
    ModelError,
    ModelOutput,
    OpenAIChatModel,
    OpenAIResponsesModel,
    Usage,
)
from .report import RunReport, Status
from .scheduling import AgentHalted, Decision, Scheduler, SchedulerState, TurnBudgets, decide
from .tool_runs import NOT_RERUN, InterruptedToolPolicy
from .tools import Tool, Toolbox, ToolContext, ToolOutcome, tool

__all__ = [
    "NOT_RERUN",
    "Agent",
    "AgentHalted",
    "AgentObserver",
    "AnthropicModel",
    "Decision",
    "FunctionModel",
    "InterruptedToolPolicy",
    "LocalModel",
    "ModelClient",
    "ModelError",
    "ModelOutput",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "RunReport",
    "Scheduler",
    "SchedulerState",
    "Status",
    "Tool",
    "ToolContext",
    "ToolOutcome",
    "Toolbox",
    "TurnBudgets",
    "Usage",
    "decide",
    "system_prompt",
    "tool",
]
