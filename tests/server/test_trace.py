"""The trace routes over real HTTP: a stream's turns and stats (costs from a price table),
a request page with its body and diff, the context as of an offset, event search with
paging, the transcript's sessions; mistakes answer 404 or 400 and write nothing."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import schemathesis

import contextfold as cf
from contextfold.prices import CataloguePrices
from contextfold.server import create_app
from contextfold.server.body import DEFAULT_MAX_BODY_BYTES
from contextfold.server.openapi import openapi_schema
from contextfold.telemetry import shared_prefix
from contextfold.timeline import Price, PriceTable
from contextfold.transcript.parts import Message
from contextfold.transcript.store.factory import open_transcript_store
from contextfold.wire import ModelOutput, NeutralRequest, ToolCall, Usage
from tests.server.helpers import Running, running

STREAM = "agents/trace"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _model(request: NeutralRequest) -> ModelOutput:
    if request.messages[-2].role == "tool":
        usage = Usage(input_tokens=500, output_tokens=10, cached_input_tokens=400)
        return ModelOutput(text="It is 5.", usage=usage)
    call = ToolCall(id=f"t{len(request.messages)}", name="add", arguments='{"a": 2, "b": 3}')
    return ModelOutput(tool_calls=(call,), usage=Usage(input_tokens=300, output_tokens=8))


async def _session(journal: cf.Journal, questions: int = 2) -> list[int]:
    agent = cf.Agent(journal, STREAM, cf.FunctionModel(_model, model="gpt-4.1"), tools=[add])
    await journal.append(STREAM, cf.system_prompt("You add numbers."))
    offsets: list[int] = []
    for n in range(questions):
        await journal.append(STREAM, cf.ContextAdded(role="user", content=f"question {n}"))
        offsets += (await agent.run_until_idle()).requests
    return offsets


async def test_the_trace_holds_turns_with_requests_tools_and_stats(
    server: Running, journal: cf.Journal
) -> None:
    offsets = await _session(journal)
    response = await server.client.get(f"/v1/streams/{STREAM}/trace")
    assert response.status_code == 200
    body = response.json()
    assert body["total_turns"] == 2 and body["start"] == 0 and body["priced"] is True
    requests = [r for turn in body["turns"] for r in turn["requests"]]
    assert [r["offset"] for r in requests] == offsets
    # No price table: genai-prices' catalogue prices gpt-4.1.
    catalogue = CataloguePrices()
    assert all(
        r["verify"] == "ok" and r["cost"] == catalogue.cost("gpt-4.1", cf.Usage(**r["usage"]))
        for r in requests
    )
    assert requests[0]["tool_calls"][0]["output"] == "5"
    assert requests[1]["usage"]["cached_input_tokens"] == 400
    assert body["stats"]["requests"] == 4 and body["stats"]["tokens"]["cached_input"] == 800
    assert body["turns"][0]["items"][-1] == {
        **body["turns"][0]["items"][-1],
        "kind": "trigger",
        "text": "question 0",
    }

    # a page: one turn from the start; then the newest page by default after an append
    page = (await server.client.get(f"/v1/streams/{STREAM}/trace?start=0&limit=1")).json()
    assert [t["index"] for t in page["turns"]] == [0]
    await journal.append(STREAM, cf.ContextAdded(role="user", content="pending question"))
    latest = (await server.client.get(f"/v1/streams/{STREAM}/trace?limit=1")).json()
    assert latest["total_turns"] == 3 and latest["start"] == 2
    assert latest["turns"][0]["requests"] == []  # a trigger the agent has not answered yet
    assert latest["turns"][0]["items"][0]["text"] == "pending question"


async def test_costs_come_from_the_app_price_table(journal: cf.Journal) -> None:
    offsets = await _session(journal, questions=1)
    app = create_app(journal)
    app.state.prices = PriceTable(prices={"gpt-4": Price(input=2, output=8, cached_input=0.5)})
    async with running(app) as served:
        body = (await served.client.get(f"/v1/streams/{STREAM}/trace")).json()
        stats = (await served.client.get(f"/v1/streams/{STREAM}/stats")).json()
    first, second = body["turns"][0]["requests"]
    assert first["cost"] == pytest.approx((300 * 2 + 8 * 8) / 1e6)
    assert second["cost"] == pytest.approx((100 * 2 + 400 * 0.5 + 10 * 8) / 1e6)
    assert stats["cost"] == pytest.approx(first["cost"] + second["cost"])
    assert body["priced"] is True and len(offsets) == 2


async def test_a_price_file_named_by_the_environment_prices_the_trace(
    journal: cf.Journal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _session(journal, questions=1)
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"gpt-4.1": {"input": 1, "output": 1}}))
    monkeypatch.setenv("CONTEXTFOLD_PRICES", str(prices))
    async with running(create_app(journal)) as served:
        stats = (await served.client.get(f"/v1/streams/{STREAM}/stats")).json()
    assert stats["cost"] == pytest.approx((300 + 8 + 500 + 10) / 1e6)


async def test_a_request_page_has_the_exact_body_and_its_diff(
    server: Running, journal: cf.Journal
) -> None:
    offsets = await _session(journal, questions=1)
    page = (await server.client.get(f"/v1/streams/{STREAM}/trace/{offsets[1]}")).json()
    raw = await server.client.get(f"/v1/streams/{STREAM}/requests/{offsets[1]}")
    previous = await server.client.get(f"/v1/streams/{STREAM}/requests/{offsets[0]}")
    assert page["body"].encode() == raw.content
    assert page["sha256"] == raw.headers["x-contextfold-sha256"]
    assert page["previous_body"].encode() == previous.content
    assert page["header"]["model"] == "gpt-4.1" and page["session_prefix"] == []
    diff = page["diff"]
    assert diff["previous_offset"] == offsets[0]
    assert diff["prefix_bytes"] == shared_prefix(previous.content, raw.content)
    assert diff["share"] == pytest.approx(diff["prefix_bytes"] / len(raw.content))
    assert page["trace"]["verify"] == "ok" and page["trace"]["offset"] == offsets[1]
    first = (await server.client.get(f"/v1/streams/{STREAM}/trace/{offsets[0]}")).json()
    assert first["diff"] is None and first["previous_body"] is None

    for offset in (1, 999):  # a system item, and no position at all
        missing = await server.client.get(f"/v1/streams/{STREAM}/trace/{offset}")
        assert missing.status_code == 404, missing.text
        assert missing.json()["error"]["message"]


async def test_the_context_as_of_an_offset(server: Running, journal: cf.Journal) -> None:
    offsets = await _session(journal, questions=2)
    then = (await server.client.get(f"/v1/streams/{STREAM}/context/{offsets[0]}")).json()
    now = (await server.client.get(f"/v1/streams/{STREAM}/context")).json()
    assert then["version"] == offsets[0] and then["request_offset"] == offsets[0]
    assert [i["content"] for i in then["history"]] == ["question 0"]
    assert len(now["history"]) > len(then["history"])
    gone = await server.client.get(f"/v1/streams/{STREAM}/context/{now['version'] + 1}")
    assert gone.status_code == 404


async def test_search_filters_by_type_actor_and_text_and_pages(
    server: Running, journal: cf.Journal
) -> None:
    await _session(journal, questions=2)
    webhook = cf.Actor(type="webhook")
    hook = cf.ContextAdded(role="developer", content="Deploy FAILED", actor=webhook)
    await journal.append(STREAM, hook, actor="ci")
    search = f"/v1/streams/{STREAM}/search"
    found = (await server.client.get(search, params={"q": "failed"})).json()
    assert [e["payload"]["content"] for e in found["events"]] == ["Deploy FAILED"]
    assert found["more"] is False
    by_actor = (await server.client.get(search, params={"actor": "webhook"})).json()
    assert [e["payload"]["content"] for e in by_actor["events"]] == ["Deploy FAILED"]
    assert (await server.client.get(search, params={"actor": "ci"})).json()["events"]
    typed = (await server.client.get(search, params={"type": "tool-call-result"})).json()
    assert [e["payload"]["content"] for e in typed["events"]] == ["5", "5"]

    # paging: one match at a time, each page going on from the previous cursor
    seen: list[int] = []
    cursor = None
    while True:
        params = {"type": "context-added", "limit": "1", **({"after": cursor} if cursor else {})}
        page = (await server.client.get(search, params=params)).json()
        seen += [e["position"] for e in page["events"]]
        cursor = page["cursor"]
        if not page["more"]:
            break
    everything = (await server.client.get(f"/v1/streams/{STREAM}/events")).json()["events"]
    assert seen == [e["position"] for e in everything if e["type"].endswith("/context-added")]

    bad = await server.client.get(search, params={"after": "x"})
    assert bad.status_code == 400
    foreign = await server.client.get(search, params={"after": "99999"})
    assert foreign.status_code == 404


async def test_unknown_streams_answer_404_with_the_closest_names(
    server: Running, journal: cf.Journal
) -> None:
    await _session(journal, questions=1)
    for path in ("trace", "trace/3", "context/3", "search", "stats"):
        response = await server.client.get(f"/v1/streams/agents/trac/{path}")
        assert response.status_code == 404, path
        assert "agents/trace" in response.json()["error"]["message"]
    assert await journal.version("agents/trac") == 0  # nothing was created


async def test_sessions_list_the_transcript_and_say_what_is_live(
    journal: cf.Journal, tmp_path: Path
) -> None:
    async with running(create_app(journal)) as served:
        bare = (await served.client.get("/v1/sessions")).json()
    assert bare == {"sessions": [], "transcript": False, "live": False}
    store = open_transcript_store(f"sqlite:///{tmp_path / 'rows.db'}")
    async with store:
        for session in ("agents/trace/run-1", "other"):
            message = Message(id="m1", session=session, role="user", created="2026-01-01")
            await store.write(messages=[message])
        async with running(create_app(journal, transcript=store)) as served:
            every = (await served.client.get("/v1/sessions")).json()
            mine = (await served.client.get("/v1/sessions", params={"prefix": "agents/"})).json()
    assert [s["id"] for s in every["sessions"]] == ["agents/trace/run-1", "other"]
    assert [s["id"] for s in mine["sessions"]] == ["agents/trace/run-1"]
    assert every["transcript"] is True and every["live"] is False


async def test_real_answers_match_the_openapi_document(
    server: Running, journal: cf.Journal
) -> None:
    """Each trace route on a real session answers 200 in the shape its schema documents."""
    offsets = await _session(journal, questions=1)
    document = openapi_schema(
        max_body_bytes=DEFAULT_MAX_BODY_BYTES, authenticated=False, namespaced=False
    )
    schema = schemathesis.openapi.from_dict(document)
    reads: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
        ("/v1/streams/{stream}/trace", {"stream": STREAM}, {"limit": 5}),
        ("/v1/streams/{stream}/trace/{offset}", {"stream": STREAM, "offset": offsets[1]}, {}),
        ("/v1/streams/{stream}/context/{offset}", {"stream": STREAM, "offset": offsets[0]}, {}),
        ("/v1/streams/{stream}/search", {"stream": STREAM}, {"q": "question"}),
        ("/v1/streams/{stream}/stats", {"stream": STREAM}, {}),
        ("/v1/sessions", {}, {}),
    ]
    checks = [
        schemathesis.checks.not_a_server_error,
        schemathesis.checks.status_code_conformance,
        schemathesis.checks.content_type_conformance,
        schemathesis.checks.response_schema_conformance,
    ]
    for path, parameters, query in reads:
        case = schema[path]["GET"].Case(path_parameters=parameters, query=query)
        response = await asyncio.to_thread(
            case.call_and_validate, base_url=server.url, timeout=10, checks=checks
        )
        assert response.status_code == 200, (path, response.text)
