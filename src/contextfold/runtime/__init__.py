"""The agent runtime: the loop, its typed events, scheduling, model clients and tools."""

from .clients import (
    AnthropicModel,
    FunctionModel,
    ModelClient,
    OpenAIChatModel,
    OpenAIResponsesModel,
)
from .dispatch import DispatchedTurn, Receipt, TurnDispatcher
from .events import (
    LOOP_EVENT_TYPES,
    AgentObserver,
    CompactionFinished,
    CompactionStarted,
    DeltaReceived,
    LoopCancelled,
    LoopEvent,
    LoopHalted,
    Observers,
    RequestFailed,
    RequestInterrupted,
    RequestRetried,
    RequestSent,
    ResponseRecorded,
    ToolFinished,
    ToolStarted,
)
from .instance import RunReport, Status
from .local import LocalModel
from .loop import Agent, system_prompt
from .scheduling import AgentHalted, Decision, Scheduler, SchedulerState, TurnBudgets, decide
from .tool_runs import NOT_RERUN, InterruptedToolPolicy
from .tools import Tool, Toolbox, ToolContext, ToolOutcome, tool

__all__ = [
    "LOOP_EVENT_TYPES",
    "NOT_RERUN",
    "Agent",
    "AgentHalted",
    "AgentObserver",
    "AnthropicModel",
    "CompactionFinished",
    "CompactionStarted",
    "Decision",
    "DeltaReceived",
    "DispatchedTurn",
    "FunctionModel",
    "InterruptedToolPolicy",
    "LocalModel",
    "LoopCancelled",
    "LoopEvent",
    "LoopHalted",
    "ModelClient",
    "Observers",
    "OpenAIChatModel",
    "OpenAIResponsesModel",
    "Receipt",
    "RequestFailed",
    "RequestInterrupted",
    "RequestRetried",
    "RequestSent",
    "ResponseRecorded",
    "RunReport",
    "Scheduler",
    "SchedulerState",
    "Status",
    "Tool",
    "ToolContext",
    "ToolFinished",
    "ToolOutcome",
    "ToolStarted",
    "Toolbox",
    "TurnBudgets",
    "TurnDispatcher",
    "decide",
    "system_prompt",
    "tool",
]
