"""The agent runtime: the loop, scheduling, model clients and tools."""

from .local import LocalModel
from .loop import Agent, AgentObserver, RunReport, Status, system_prompt
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
from .scheduling import AgentHalted, Decision, Scheduler, SchedulerState, TurnBudgets, decide
from .tools import Tool, Toolbox, ToolOutcome

__all__ = [
    "Agent",
    "AgentHalted",
    "AgentObserver",
    "AnthropicModel",
    "Decision",
    "FunctionModel",
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
    "ToolOutcome",
    "Toolbox",
    "TurnBudgets",
    "Usage",
    "decide",
    "system_prompt",
]
