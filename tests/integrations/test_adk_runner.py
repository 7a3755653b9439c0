"""A real ADK Runner on JournalSessionService: an agent with a tool and an offline model, a
restart on the same SQLite file, and the same model requests as on ADK's own in-memory
sessions."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions.base_session_service import BaseSessionService
from google.adk.sessions.in_memory_session_service import InMemorySessionService
from google.adk.tools.tool_context import ToolContext
from google.genai import types
from pydantic import Field

from contextfold.integrations.adk import JournalSessionService
from contextfold.journal import open_journal

APP = "keeper_app"
Seen = tuple[tuple[str | None, str | None, str | None, Any], ...]


class ScriptedModel(BaseLlm):
    """Offline: calls ``remember`` with the user's words, then reports the tool's answer.
    Records what each request carried (ids left out: ADK makes new ones every run)."""

    model: str = "scripted"
    requests: list[Seen] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncGenerator[LlmResponse, None]:
        self.requests.append(tuple(_shape(content) for content in llm_request.contents))
        last = llm_request.contents[-1].parts or []
        answer = next((p.function_response for p in last if p.function_response), None)
        if answer is not None:
            part = types.Part(text=f"noted: {(answer.response or {}).get('result')}")
        else:
            words = "".join(p.text or "" for p in last)
            part = types.Part(
                function_call=types.FunctionCall(name="remember", args={"fact": words})
            )
        yield LlmResponse(content=types.Content(role="model", parts=[part]))


def _shape(content: types.Content) -> tuple[str | None, str | None, str | None, Any]:
    part = (content.parts or [types.Part()])[0]
    call, answer = part.function_call, part.function_response
    return (
        content.role,
        part.text,
        call.name if call else answer.name if answer else None,
        call.args if call else answer.response if answer else None,
    )


def remember(fact: str, tool_context: ToolContext) -> str:
    """Remember a fact about the user."""
    facts = [*tool_context.state.get("user:facts", []), fact]
    tool_context.state["user:facts"] = facts
    tool_context.state["app:calls"] = tool_context.state.get("app:calls", 0) + 1
    tool_context.state["temp:scratch"] = fact
    return f"{len(facts)} facts"


def _runner(service: BaseSessionService, model: ScriptedModel) -> Runner:
    agent = LlmAgent(
        name="keeper",
        model=model,
        instruction="Remember what the user tells you.",
        tools=[remember],
        output_key="last_answer",
    )
    return Runner(app_name=APP, agent=agent, session_service=service)


async def _turn(runner: Runner, session_id: str, text: str) -> list[str]:
    message = types.Content(role="user", parts=[types.Part(text=text)])
    answers = []
    async for event in runner.run_async(user_id="ada", session_id=session_id, new_message=message):
        if event.content and event.content.parts and event.content.parts[0].text:
            answers.append(event.content.parts[0].text)
    return answers


TURNS = ("I like tea", "I live in Lyon", "I have a cat")


async def test_a_runner_continues_its_session_after_a_restart(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'adk.db'}"
    model = ScriptedModel()
    async with open_journal(url) as journal:
        service = JournalSessionService(journal)
        session = await service.create_session(app_name=APP, user_id="ada", state={"mood": "ok"})
        runner = _runner(service, model)
        assert await _turn(runner, session.id, TURNS[0]) == ["noted: 1 facts"]
        assert await _turn(runner, session.id, TURNS[1]) == ["noted: 2 facts"]
        before = await service.get_session(app_name=APP, user_id="ada", session_id=session.id)
        await runner.close()
    assert before is not None

    async with open_journal(url) as journal:  # another process: nothing but the file
        service = JournalSessionService(journal)
        runner = _runner(service, model)
        assert await _turn(runner, session.id, TURNS[2]) == ["noted: 3 facts"]
        after = await service.get_session(app_name=APP, user_id="ada", session_id=session.id)
        await runner.close()
    assert after is not None

    assert after.events[: len(before.events)] == before.events  # stored and read back exactly
    assert len(after.events) == len(before.events) + 4  # the user, the call, its result, the answer
    assert after.state == {
        "mood": "ok",
        "last_answer": "noted: 3 facts",
        "app:calls": 3,
        "user:facts": list(TURNS),
    }
    # The third turn's first request carried the whole history of the first two.
    third = model.requests[4]
    assert [shape[1] for shape in third if shape[0] == "user" and shape[1]] == list(TURNS)


async def test_the_model_sees_what_it_sees_on_adk_in_memory_sessions(tmp_path: Path) -> None:
    async def play(service: BaseSessionService) -> tuple[list[Seen], dict[str, Any]]:
        model = ScriptedModel()
        runner = _runner(service, model)
        session = await service.create_session(app_name=APP, user_id="ada", session_id="s")
        for text in TURNS:
            await _turn(runner, session.id, text)
        final = await service.get_session(app_name=APP, user_id="ada", session_id="s")
        await runner.close()
        assert final is not None
        return model.requests, final.state

    reference = await play(InMemorySessionService())
    async with open_journal(f"sqlite:///{tmp_path / 'adk.db'}") as journal:
        ours = await play(JournalSessionService(journal))
    assert ours == reference
    assert len(ours[0]) == 2 * len(TURNS)
