"""A small real LangGraph agent for the integration tests: messages state, a model node that
is a plain function (no provider, no key) and a tool loop through LangGraph's ToolNode."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

__all__ = ["build_agent", "fake_model", "turn"]

_ADD = re.compile(r"^add (\d+) (\d+)")


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def fake_model(messages: Sequence[BaseMessage]) -> AIMessage:
    """Answers ``add A B`` with a tool call, a tool result with the sum, anything else with
    an echo: deterministic, like a recorded model."""
    last = messages[-1]
    if isinstance(last, ToolMessage):
        return AIMessage(content=f"The sum is {last.content}.")
    text = str(last.content)
    found = _ADD.match(text)
    if found is not None:
        call = {
            "name": "add",
            "args": {"a": int(found[1]), "b": int(found[2])},
            "id": f"call-{len(messages)}",
        }
        return AIMessage(content="", tool_calls=[call])
    return AIMessage(content=f"echo: {text}")


def _model(state: MessagesState) -> dict[str, Any]:
    return {"messages": [fake_model(state["messages"])]}


def build_agent(checkpointer: BaseCheckpointSaver[Any]) -> CompiledStateGraph[Any, Any, Any, Any]:
    """model -> (tools -> model)* -> end, compiled with ``checkpointer``."""
    builder = StateGraph(MessagesState)
    builder.add_node("model", _model)
    builder.add_node("tools", ToolNode([add]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


def turn(i: int) -> dict[str, Any]:
    """The input of turn ``i``: every third turn asks for the tool."""
    text = f"add {i} {i + 1}" if i % 3 == 0 else f"question {i}: how is the weather today?"
    return {"messages": [HumanMessage(content=text)]}
