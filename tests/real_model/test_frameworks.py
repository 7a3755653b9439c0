"""Each framework integration against a real model: llama.cpp's server with SmolLM2-135M-Instruct
on loopback, reached through the framework's OWN model client, with contextfold's adapter
storing the conversation.

- OpenAI Agents SDK: ``Runner.run`` with ``OpenAIChatCompletionsModel`` and a JournalSession.
- LangGraph: ``ChatOpenAI`` in a one-node ``StateGraph(MessagesState)`` on a JournalSaver.
- pydantic-ai: ``OpenAIChatModel`` with the history loaded from and saved to a JournalHistory.
- Google ADK: ``AnthropicLlm`` (Anthropic Messages) run by ``Runner`` on a JournalSessionService.

Each test holds a short conversation (three user turns) and asserts structure only, never the
answers' text: every turn answers; the adapter holds each turn's user and model messages in
order; what it stored reads back the same through a new adapter on the same journal; and the
usage the server reported comes through where the framework exposes it. The model makes no tool
calls, so no agent is given tools.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from agents import Agent as AgentsAgent
from agents import ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from google.adk.agents import LlmAgent
from google.adk.models.anthropic_llm import AnthropicLlm
from google.adk.runners import Runner as AdkRunner
from google.genai import types
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_openai import ChatOpenAI
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from openai import AsyncOpenAI
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import contextfold as cf
from contextfold.integrations.adk import JournalSessionService
from contextfold.integrations.langgraph import JournalSaver
from contextfold.integrations.openai_agents import JournalSession
from contextfold.integrations.pydantic_ai import JournalHistory
from tests.llamaserver import LlamaServer

QUESTIONS = ("What is 2 + 3?", "Name a colour of the sky.", "Say hello in one word.")
INSTRUCTIONS = "You are a helpful assistant. Answer briefly."
MAX_TOKENS = 48

# The Agents SDK traces runs to OpenAI by default: these tests send nothing there.
set_tracing_disabled(True)


@pytest.fixture
async def journal(tmp_path: Path) -> AsyncIterator[cf.Journal]:
    async with cf.open_journal(f"sqlite:///{tmp_path / 'journal.db'}") as opened:
        yield opened


# --- the OpenAI Agents SDK --------------------------------------------------------------------


def _role(item: Any) -> Any:
    return item.get("role") if isinstance(item, dict) else None


async def test_openai_agents_runner_stores_the_conversation_in_a_journal_session(
    llama_server: LlamaServer, journal: cf.Journal
) -> None:
    client = AsyncOpenAI(base_url=llama_server.openai_url, api_key="no-key")
    agent = AgentsAgent(
        name="assistant",
        instructions=INSTRUCTIONS,
        model=OpenAIChatCompletionsModel(model=llama_server.model, openai_client=client),
        model_settings=ModelSettings(temperature=0.0, max_tokens=MAX_TOKENS),
    )
    session = JournalSession(journal, "chat")
    try:
        for turn, question in enumerate(QUESTIONS, 1):
            result = await Runner.run(agent, question, session=session)
            assert isinstance(result.final_output, str)
            usage = result.context_wrapper.usage
            assert usage.requests == 1 and usage.input_tokens > 0 and usage.output_tokens > 0
            items = await session.get_items()
            assert len(items) == 2 * turn, items
            assert [_role(item) for item in items] == ["user", "assistant"] * turn
            assert items[-2]["content"] == question  # type: ignore[typeddict-item]
    finally:
        await client.close()

    items = await session.get_items()
    users = [item["content"] for item in items[::2]]  # type: ignore[typeddict-item]
    assert users == list(QUESTIONS)
    # A new session on the same journal and stream reads the same items back.
    assert await JournalSession(journal, "chat").get_items() == items
    stored = [event async for event in journal.read_all(session.stream)]
    assert len(stored) == len(items)
    assert {event.type for event in stored} == {"openai-agents/item-added"}


# --- LangGraph / LangChain --------------------------------------------------------------------


def _chat_graph(model: ChatOpenAI, saver: JournalSaver) -> CompiledStateGraph[Any, Any, Any, Any]:
    async def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("model", call_model)
    builder.add_edge(START, "model")
    return builder.compile(checkpointer=saver)


async def test_langgraph_chat_openai_graph_checkpoints_on_a_journal_saver(
    llama_server: LlamaServer, journal: cf.Journal
) -> None:
    model = ChatOpenAI(
        model=llama_server.model,
        base_url=llama_server.openai_url,
        api_key="no-key",
        temperature=0,
        max_tokens=MAX_TOKENS,
    )
    graph = _chat_graph(model, JournalSaver(journal))
    config: RunnableConfig = {"configurable": {"thread_id": "chat"}}
    try:
        for turn, question in enumerate(QUESTIONS, 1):
            await graph.ainvoke({"messages": [HumanMessage(question)]}, config)
            messages = (await graph.aget_state(config)).values["messages"]
            assert len(messages) == 2 * turn
            assert [type(m) for m in messages] == [HumanMessage, AIMessage] * turn
            human, answer = messages[-2:]
            assert human.content == question
            assert isinstance(answer.content, str) and answer.content.strip()
            assert answer.usage_metadata is not None
            assert answer.usage_metadata["input_tokens"] > 0
            assert answer.usage_metadata["output_tokens"] > 0
    finally:
        await model.root_async_client.close()

    before = await graph.aget_state(config)
    # A graph compiled on a new saver over the same journal sees the same thread.
    fresh = _chat_graph(model, JournalSaver(journal))
    after = await fresh.aget_state(config)
    assert after.values["messages"] == before.values["messages"]
    assert after.config == before.config
    assert [m.content for m in after.values["messages"][::2]] == list(QUESTIONS)


# --- pydantic-ai ------------------------------------------------------------------------------


async def test_pydantic_ai_agent_runs_on_a_journal_history(
    llama_server: LlamaServer, journal: cf.Journal
) -> None:
    provider = OpenAIProvider(base_url=llama_server.openai_url, api_key="no-key")
    agent: PydanticAgent[None, str] = PydanticAgent(
        OpenAIChatModel(llama_server.model, provider=provider),
        instructions=INSTRUCTIONS,
        model_settings={"temperature": 0.0, "max_tokens": MAX_TOKENS},
    )
    history = JournalHistory(journal, "pydantic-ai/chat")
    try:
        for turn, question in enumerate(QUESTIONS):
            loaded = await history.load()
            assert len(loaded) == 2 * turn
            result = await agent.run(question, message_history=loaded)
            assert isinstance(result.output, str)
            assert result.usage.requests == 1
            assert result.usage.input_tokens > 0 and result.usage.output_tokens > 0
            assert await history.save(result) is not None
    finally:
        await provider.client.close()

    stored = await history.load()
    assert len(stored) == 2 * len(QUESTIONS)
    assert [type(m) for m in stored] == [ModelRequest, ModelResponse] * len(QUESTIONS)
    prompts = [
        part.content
        for message in stored[::2]
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]
    assert prompts == list(QUESTIONS)
    for response in stored[1::2]:
        assert isinstance(response, ModelResponse)
        assert any(isinstance(part, TextPart) for part in response.parts)
        assert response.usage.input_tokens > 0
    # A new history on the same journal and stream loads the same messages.
    assert await JournalHistory(journal, "pydantic-ai/chat").load() == stored


# --- Google ADK -------------------------------------------------------------------------------

APP = "real_app"
USER = "ada"


def _text(content: types.Content | None) -> str:
    if content is None or not content.parts:
        return ""
    return "".join(part.text or "" for part in content.parts)


async def test_adk_runner_with_anthropic_llm_keeps_its_session_on_the_journal(
    llama_server: LlamaServer, journal: cf.Journal
) -> None:
    client = anthropic.AsyncAnthropic(base_url=llama_server.url, api_key="no-key")
    agent = LlmAgent(
        name="assistant",
        model=AnthropicLlm(model=llama_server.model, client=client, max_tokens=MAX_TOKENS),
        instruction=INSTRUCTIONS,
        # No temperature: the installed anthropic SDK's messages.create takes none, and ADK
        # passes the config's temperature to it (a TypeError).
        generate_content_config=types.GenerateContentConfig(max_output_tokens=MAX_TOKENS),
    )
    service = JournalSessionService(journal)
    runner = AdkRunner(app_name=APP, agent=agent, session_service=service)
    session = await service.create_session(app_name=APP, user_id=USER)
    try:
        for question in QUESTIONS:
            message = types.Content(role="user", parts=[types.Part(text=question)])
            finals = [
                event
                async for event in runner.run_async(
                    user_id=USER, session_id=session.id, new_message=message
                )
                if event.is_final_response()
            ]
            assert len(finals) == 1
            assert finals[0].author == "assistant"
            assert _text(finals[0].content).strip()
            assert finals[0].usage_metadata is not None
            assert (finals[0].usage_metadata.prompt_token_count or 0) > 0
    finally:
        await runner.close()
        await client.close()

    # A new service on the same journal reads the session back: every turn, in order.
    stored = await JournalSessionService(journal).get_session(
        app_name=APP, user_id=USER, session_id=session.id
    )
    assert stored is not None
    assert [event.author for event in stored.events] == ["user", "assistant"] * len(QUESTIONS)
    assert [_text(event.content) for event in stored.events[::2]] == list(QUESTIONS)
    assert all(_text(event.content).strip() for event in stored.events[1::2])
    live = await service.get_session(app_name=APP, user_id=USER, session_id=session.id)
    assert live is not None and stored.events == live.events
