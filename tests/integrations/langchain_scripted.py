"""A scripted LangChain chat model for create_agent tests: per user message it makes
``steps`` read_file calls, one per model call, then answers; a summary prompt (contextfold's
or LangChain's SummarizationMiddleware's) gets a numbered summary. It keeps every request."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from pydantic import Field

SUMMARY_PROMPTS = ("Write a dense summary", "<role>\nContext Extraction Assistant")


@tool
def read_file(path: str) -> str:
    """Read a file of the workspace."""
    return f"{path}: " + "x" * 800


def is_summary_prompt(messages: Sequence[BaseMessage]) -> bool:
    return (
        len(messages) == 1
        and isinstance(messages[0], HumanMessage)
        and str(messages[0].content).startswith(SUMMARY_PROMPTS)
    )


class Scripted(BaseChatModel):
    """See the module."""

    steps: int = 3
    seen: list[list[BaseMessage]] = Field(default_factory=list)
    """Every request of the agent (summary prompts excluded), as the model got it."""
    prompts: list[str] = Field(default_factory=list)
    """Every summary prompt."""
    remaining: int = 0
    made: int = 0

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Scripted:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        if is_summary_prompt(messages):
            self.prompts.append(str(messages[0].content))
            message = AIMessage(f"summary {len(self.prompts)}")
        else:
            self.seen.append(list(messages))
            if isinstance(messages[-1], HumanMessage):
                self.remaining = self.steps
            if self.remaining > 0:
                self.remaining -= 1
                self.made += 1
                call = {"name": "read_file", "args": {"path": f"f{self.made}.py"}}
                message = AIMessage("", tool_calls=[{**call, "id": f"c{self.made}"}])
            else:
                last = messages[-1]
                done = len(str(last.content)) if isinstance(last, ToolMessage) else 0
                message = AIMessage(f"read {done} characters")
        size = sum(len(str(m.content)) for m in messages) // 4
        message.usage_metadata = {
            "input_tokens": size,
            "output_tokens": 3,
            "total_tokens": size + 3,
            "input_token_details": {"cache_read": size // 2},
        }
        return ChatResult(generations=[ChatGeneration(message=message)])


def split_pairs(messages: Sequence[BaseMessage]) -> int:
    """Tool results before or without their call, and calls without a result."""
    made: set[str] = set()
    answered: set[str] = set()
    orphans = 0
    for message in messages:
        if isinstance(message, ToolMessage):
            if message.tool_call_id in made:
                answered.add(message.tool_call_id)
            else:
                orphans += 1
        if isinstance(message, AIMessage):
            made.update(str(call["id"]) for call in message.tool_calls)
    return orphans + len(made - answered)
