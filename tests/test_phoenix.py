"""A cf.Agent session's spans in a real Arize Phoenix: the suite starts Phoenix on loopback
(its embedded SQLite, see ``tests/phoenixserver.py``), a child process sets up OpenTelemetry
as a user would (a tracer provider, a batch processor, the official OTLP/HTTP exporter
pointed at Phoenix, content capture by the conventions' environment variable) and runs a
session, and the spans are read back through Phoenix's own client: the trace tree (agent →
chat and tool), the token counts Phoenix itself derives from them and, with capture on,
the messages the requests carried, as rebuilt from the journal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from phoenix.client import Client

from contextfold import telemetry as tm
from tests.phoenixserver import PhoenixNotAvailableError, PhoenixServer

_SESSION = textwrap.dedent(
    """
    import asyncio, json, sys
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    import contextfold as cf
    from contextfold.runtime.span_content import request_content

    endpoint, project = sys.argv[1], sys.argv[2]
    provider = TracerProvider(resource=Resource.create({"openinference.project.name": project}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    trace.set_tracer_provider(provider)

    def add(a: int, b: int) -> int:
        "Add two integers."
        return a + b

    def model(request):
        if any(message.role == "tool" for message in request.messages):
            usage = cf.Usage(input_tokens=400, output_tokens=9, cached_input_tokens=256)
            return cf.ModelOutput(text="The sum is 5.", usage=usage)
        call = cf.ToolCall(id="c1", name="add", arguments='{"a": 2, "b": 3}')
        usage = cf.Usage(input_tokens=300, output_tokens=12)
        return cf.ModelOutput(tool_calls=(call,), usage=usage, finish_reason="tool_calls")

    async def main():
        async with cf.open_journal("memory://") as journal:
            await journal.append("phoenix/s", cf.system_prompt("You add numbers."))
            await journal.append("phoenix/s", cf.ContextAdded(role="user", content="2 + 3?"))
            agent = cf.Agent(
                journal, "phoenix/s", cf.FunctionModel(model, model="gpt-4.1"),
                tools=[add], name="adder",
            )
            report = await agent.run_until_idle()
            bodies = [await cf.rebuild_request(journal, "phoenix/s", n) for n in report.requests]
        return [request_content(body)["gen_ai.input.messages"] for body in bodies]

    inputs = asyncio.run(main())
    provider.force_flush()
    provider.shutdown()
    print(json.dumps({"inputs": inputs}))
    """
)


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


@pytest.fixture(scope="module")
def phoenix() -> Iterator[PhoenixServer]:
    try:
        server = PhoenixServer()
    except PhoenixNotAvailableError as exc:
        if _in_ci():
            pytest.fail(f"{exc} (CI is set, so this is an error, not a skip)", pytrace=False)
        pytest.skip(str(exc))
    with server:
        yield server


def _session(phoenix: PhoenixServer, project: str, capture: str, tmp_path: Path) -> list[str]:
    environment = {**os.environ, tm.CAPTURE_CONTENT_ENV: capture}
    done = subprocess.run(
        [sys.executable, "-c", _SESSION, phoenix.traces_url, project],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=environment,
    )
    assert done.returncode == 0, done.stderr
    inputs: list[str] = json.loads(done.stdout)["inputs"]
    return inputs


def _spans(phoenix: PhoenixServer, project: str, count: int) -> list[dict[str, Any]]:
    """The project's spans once Phoenix holds ``count`` of them (it ingests in the
    background), by start time."""
    client = Client(base_url=phoenix.url)
    found: list[Any] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            found = list(client.spans.get_spans(project_identifier=project, limit=100))
        except Exception:  # the project appears with its first span
            found = []
        if len(found) >= count:
            break
        time.sleep(0.5)
    assert len(found) == count, (found, phoenix.log())
    return sorted((dict(span) for span in found), key=lambda span: span["start_time"])


def _tree(spans: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    [agent] = [s for s in spans if s["parent_id"] is None]
    children = [s for s in spans if s is not agent]
    assert {s["context"]["trace_id"] for s in spans} == {agent["context"]["trace_id"]}
    assert all(s["parent_id"] == agent["context"]["span_id"] for s in children)
    return agent, children


def test_a_session_reads_back_from_phoenix_as_a_trace_with_its_tokens(
    phoenix: PhoenixServer, tmp_path: Path
) -> None:
    _session(phoenix, "contextfold-plain", "NO_CONTENT", tmp_path)
    agent, children = _tree(_spans(phoenix, "contextfold-plain", 4))
    assert agent["name"] == "invoke_agent adder" and agent["span_kind"] == "AGENT"
    assert [s["name"] for s in children] == ["chat gpt-4.1", "execute_tool add", "chat gpt-4.1"]
    first, tool, second = children
    assert first["span_kind"] == second["span_kind"] == "LLM"
    assert tool["attributes"][tm.TOOL_NAME] == "add"
    # The GenAI attributes as sent, and the token counts Phoenix derives from them.
    assert first["attributes"][tm.USAGE_INPUT_TOKENS] == 300
    assert second["attributes"][tm.USAGE_CACHE_READ_TOKENS] == 256
    assert second["attributes"]["llm.token_count.prompt"] == 400
    assert second["attributes"]["llm.token_count.completion"] == 9
    assert second["attributes"][tm.USAGE_COST] > 0
    for span in children:
        assert not any(
            key.startswith(("gen_ai.input", "llm.input_messages")) for key in span["attributes"]
        )


def test_with_capture_on_phoenix_holds_the_messages_each_request_carried(
    phoenix: PhoenixServer, tmp_path: Path
) -> None:
    inputs = _session(phoenix, "contextfold-content", "SPAN_ONLY", tmp_path)
    _, children = _tree(_spans(phoenix, "contextfold-content", 4))
    chats = [s for s in children if s["name"].startswith("chat ")]
    assert [s["attributes"][tm.INPUT_MESSAGES] for s in chats] == inputs
    first, second = (s["attributes"] for s in chats)
    # Phoenix read the conventions' messages into its own message attributes.
    read = {
        (
            first[f"llm.input_messages.{n}.message.role"],
            first[f"llm.input_messages.{n}.message.content"],
        )
        for n in range(len(json.loads(inputs[0])))
    }
    # Chat Completions carries the system prompts as messages: they are recorded so.
    assert any(role == "system" and "You add numbers." in text for role, text in read)
    assert any(role == "user" and "2 + 3?" in text for role, text in read)
    assert json.loads(second[tm.OUTPUT_MESSAGES])[0]["parts"][0]["content"] == "The sum is 5."
