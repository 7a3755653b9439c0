"""Structured output through JournalModel: an agent's ``output_type`` goes out as the
request's output schema, recorded in its header, and the Runner parses the answer."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from agents import Agent, AgentOutputSchema, ModelSettings, Runner
from openai import AsyncOpenAI
from pydantic import BaseModel

import contextfold as cf
from contextfold.integrations.openai_agents import JournalModel
from tests.integrations.helpers import decoded, response_json, responses_server


class Weather(BaseModel):
    city: str
    degrees: int


@pytest.fixture
async def journal() -> AsyncIterator[cf.Journal]:
    async with cf.open_journal("memory://") as opened:
        yield opened


async def test_an_output_type_is_the_requests_output_schema(journal: cf.Journal) -> None:
    requests: list[cf.NeutralRequest] = []

    def forecast(request: cf.NeutralRequest) -> str:
        requests.append(request)
        return json.dumps({"city": "Paris", "degrees": 21})

    client = cf.FunctionModel(forecast, transport="openai-responses", model="gpt-test")
    agent = Agent(
        name="forecaster",
        model=JournalModel(client, journal, "forecast"),
        output_type=Weather,
    )
    result = await Runner.run(agent, "Weather in Paris?")
    assert result.final_output == Weather(city="Paris", degrees=21)
    schema = requests[0].output_schema
    assert schema is not None
    expected = AgentOutputSchema(Weather)
    assert (schema.name, schema.strict) == ("final_output", expected.is_strict_json_schema())
    assert schema.answer_schema() == expected.json_schema()
    state = await journal.fold(cf.AgentContext, "forecast")
    assert state.header is not None and state.header.output_schema == schema
    assert await cf.verify_requests(journal, "forecast") == ()


async def test_a_text_agent_sends_no_output_schema(journal: cf.Journal) -> None:
    requests: list[cf.NeutralRequest] = []

    def hello(request: cf.NeutralRequest) -> str:
        requests.append(request)
        return "Hello."

    client = cf.FunctionModel(hello, transport="anthropic", model="claude-test")
    model = JournalModel(client, journal, "plain")
    agent = Agent(name="plain", model=model, model_settings=ModelSettings(max_tokens=64))
    await Runner.run(agent, "Hi!")
    assert requests[0].output_schema is None


async def test_the_schema_reaches_the_wire_and_the_answer_is_parsed(journal: cf.Journal) -> None:
    answer = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": '{"city":"Oslo","degrees":4}', "annotations": []}
        ],
    }
    with responses_server([response_json(answer)]) as server:
        openai = AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0)
        model = JournalModel(cf.OpenAIResponsesModel("gpt-4.1", client=openai), journal, "wire")
        agent = Agent(name="w", instructions="Forecast.", model=model, output_type=Weather)
        result = await Runner.run(agent, "Weather in Oslo?")
        await openai.close()
    assert result.final_output == Weather(city="Oslo", degrees=4)
    [received] = server.received
    sent: dict[str, Any] = json.loads(received.body)
    assert sent["text"]["format"]["type"] == "json_schema"
    assert sent["text"]["format"]["schema"] == AgentOutputSchema(Weather).json_schema()
    [record] = [
        decoded(event, cf.RequestRecorded)
        async for event in journal.read_all("wire", types=[cf.RequestRecorded])
    ]
    assert record.sha256 == cf.canonical.sha256_hex(received.body)
    assert await cf.verify_requests(journal, "wire") == ()
