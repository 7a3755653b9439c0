"""Execution evidence stays in the journal by reference: a tool output over the agent's
limit reaches the model cut, with a ref to the whole output, read back byte for byte
through the library, the CLI and the HTTP API; an output over the journal's payload limit
is stored in chunks, never fails the run nor makes ``serve`` run the tool again. Webhook
bodies arriving as context items follow the same rule."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

import contextfold as cf
from contextfold.cli import URL_ENV, app
from contextfold.context.events import Actor, ContextAdded, ToolCallResult
from contextfold.context.evidence import MIN_CONTENT_LIMIT, OutputChunk, read_ref
from contextfold.errors import InvalidInputError
from contextfold.journal import Journal
from contextfold.journal.encode import DEFAULT_MAX_PAYLOAD_BYTES
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.events import LoopEvent, ToolFinished
from contextfold.runtime.loop import Agent, system_prompt
from contextfold.runtime.tool_runs import run_calls
from contextfold.runtime.tools import Toolbox
from contextfold.server import create_app
from contextfold.server.runner import uvicorn_config
from contextfold.wire import ModelOutput, NeutralRequest, ToolCall
from tests.runtime.helpers import STREAM, Observer, events_of, user

MB = 1_000_000
LINE = "0000000 log line ✓ é\n"  # 24 bytes as UTF-8, 21 characters


def five_megabytes() -> str:
    lines = 5 * MB // len(LINE.encode()) + 1
    return "".join(f"{i:07d}{LINE[7:]}" for i in range(lines))


OUTPUT = five_megabytes()


class Dump:
    """A tool returning ``output``; counts its runs."""

    def __init__(self, output: str) -> None:
        self.output = output
        self.runs = 0

    def tool(self) -> cf.Tool:
        def dump() -> str:
            """Dump the whole build log."""
            self.runs += 1
            return self.output

        return cf.Tool.from_function(dump)


def dumping_model(seen: list[NeutralRequest]) -> FunctionModel:
    """Calls ``dump`` once, then answers with the length of what it read."""

    def answer(request: NeutralRequest) -> ModelOutput | str:
        seen.append(request)
        last = request.messages[-2]  # the last is the request's time tail
        if last.role == "tool":
            return f"read {len(last.content.split(chr(10), 1)[1])} characters"  # past the header
        return ModelOutput(tool_calls=(ToolCall(id="call_dump", name="dump", arguments="{}"),))

    return FunctionModel(answer)


class Bodies(Observer):
    """Records the size of every body sent and the outcomes observers get."""

    def __init__(self) -> None:
        super().__init__()
        self.outcomes: list[Any] = []

    async def on_event(self, event: LoopEvent) -> None:
        await super().on_event(event)
        if isinstance(event, ToolFinished):
            self.outcomes.append(event.outcome)

    @property
    def largest(self) -> int:
        return max(len(r.body) for sent in self.sent.values() for r in sent)


async def tool_item(journal: Journal, stream: str = STREAM) -> ContextAdded:
    [item] = [e for _, e in await events_of(journal, stream, ContextAdded) if e.tool_call_id]
    assert isinstance(item, ContextAdded)
    return item


@contextlib.asynccontextmanager
async def served(journal: Journal) -> AsyncIterator[httpx.AsyncClient]:
    """The journal's HTTP API on a free loopback port, in this loop, with a client for it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn_config(create_app(journal), log_config=None, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                await task
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            yield client
    finally:
        server.should_exit = True
        await task
        sock.close()


@pytest.fixture
def db_url(tmp_path: Path) -> Iterator[str]:
    yield f"sqlite:///{tmp_path / 'journal.db'}"


async def test_a_5_mb_output_runs_once_reaches_the_model_cut_and_reads_back_whole(
    db_url: str,
) -> None:
    assert len(OUTPUT.encode()) > 5 * MB > DEFAULT_MAX_PAYLOAD_BYTES
    dump, seen, bodies = Dump(OUTPUT), list[NeutralRequest](), Bodies()
    async with cf.open_journal(db_url) as journal:
        await journal.append(STREAM, system_prompt("You read build logs."))
        await journal.append(STREAM, user("why did the build fail?"))
        agent = Agent(journal, STREAM, dumping_model(seen), tools=[dump.tool()], observer=bodies)
        report = await agent.run_until_idle()

        assert dump.runs == 1
        assert report.status == "idle" and report.tool_calls == 1 and len(report.requests) == 2
        assert bodies.largest <= MB
        [(_, answer)] = [(p, e) for p, e in await events_of(journal, STREAM, cf.LlmResponse)][1:]
        assert answer.text.startswith("read ") and int(answer.text.split()[1]) <= 30_000
        assert await cf.verify_requests(journal, STREAM) == ()

        item = await tool_item(journal)
        [ref] = item.refs
        assert ref.path == STREAM and ref.offset is not None
        assert len(item.content) <= 30_000 and f"is {ref.render()} in the journal" in item.content
        tool_message = seen[1].messages[-2]
        assert tool_message.content.endswith(item.content)  # the model read the cut
        assert f'refs=["{ref.render()}"]' in tool_message.content.split("\n", 1)[0]
        chunks = await events_of(journal, STREAM, OutputChunk)
        assert len(chunks) >= 2  # over the payload limit: stored in pieces
        [(result_at, result)] = await events_of(journal, STREAM, ToolCallResult)
        assert result_at == ref.offset and result.content == ""
        assert bodies.outcomes[0].output == item.content  # observers get the cut too

        # Byte for byte through the library, the HTTP API and the CLI.
        assert (await read_ref(journal, STREAM, ref.offset)).encode() == OUTPUT.encode()
        async with served(journal) as client:
            response = await client.get(f"/v1/streams/{STREAM}/refs/{ref.offset}")
            assert response.status_code == 200, response.text
            assert response.headers["content-type"] == "text/plain; charset=utf-8"
            assert response.content == OUTPUT.encode()
    result_cli = await asyncio.to_thread(
        CliRunner().invoke, app, ["ref", ref.render(), "--url", db_url], env={URL_ENV: ""}
    )
    assert result_cli.exit_code == 0, result_cli.stderr
    assert result_cli.stdout_bytes == OUTPUT.encode()


async def test_serve_answers_a_5_mb_output_without_running_the_tool_again(
    journal: Journal,
) -> None:
    dump, seen = Dump(OUTPUT), list[NeutralRequest]()
    await journal.append(STREAM, system_prompt("You read build logs."))
    head = await journal.head(STREAM)
    await journal.append(STREAM, user("why did the build fail?"))
    agent = Agent(journal, STREAM, dumping_model(seen), tools=[dump.tool()])
    serving = asyncio.create_task(agent.serve(poll_interval=0.01))
    try:
        tail = journal.subscribe(STREAM, after=head, poll_interval=0.01)
        async with contextlib.aclosing(tail) as events:  # type: ignore[type-var]
            async for stored in events:
                if stored.type == cf.LlmResponse.event_type:
                    response = stored.decode(cf.LlmResponse)
                    assert isinstance(response, cf.LlmResponse)
                    if not response.tool_calls:
                        break
        assert not serving.done()  # the output ended nothing
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
    assert dump.runs == 1 and len(seen) == 2
    assert await cf.verify_requests(journal, STREAM) == ()


async def test_an_output_over_the_limit_within_the_payload_is_kept_whole_in_its_result(
    journal: Journal,
) -> None:
    output = "x" * 40_000 + "THE END"
    dump, seen = Dump(output), list[NeutralRequest]()
    await journal.append(STREAM, [system_prompt("s"), user("go")])
    agent = Agent(journal, STREAM, dumping_model(seen), tools=[dump.tool()])
    await agent.run_until_idle()
    [(position, result)] = await events_of(journal, STREAM, ToolCallResult)
    assert result.content == output and await events_of(journal, STREAM, OutputChunk) == []
    item = await tool_item(journal)
    assert [ref.offset for ref in item.refs] == [position]
    assert item.content.endswith("THE END") and len(item.content) <= 30_000
    assert await read_ref(journal, STREAM, position) == output


async def test_an_output_within_the_limit_is_recorded_as_before(journal: Journal) -> None:
    dump, seen = Dump("short"), list[NeutralRequest]()
    await journal.append(STREAM, [system_prompt("s"), user("go")])
    await Agent(journal, STREAM, dumping_model(seen), tools=[dump.tool()]).run_until_idle()
    item = await tool_item(journal)
    assert (item.content, item.refs) == ("short", ())


async def test_the_limit_is_the_agents(journal: Journal) -> None:
    dump, seen = Dump("y" * 3_000), list[NeutralRequest]()
    await journal.append(STREAM, [system_prompt("s"), user("go")])
    agent = Agent(
        journal, STREAM, dumping_model(seen), tools=[dump.tool()], content_limit=MIN_CONTENT_LIMIT
    )
    await agent.run_until_idle()
    item = await tool_item(journal)
    assert len(item.content) <= MIN_CONTENT_LIMIT and item.refs
    with pytest.raises(InvalidInputError, match="content_limit"):
        Agent(journal, STREAM, dumping_model(seen), content_limit=10)


async def test_the_ref_names_the_result_when_another_writer_appends_meanwhile(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    races: list[int] = []
    version = journal.version

    async def racing_version(stream: str) -> int:
        # Another writer appends right after the agent read the version, twice.
        found = await version(stream)
        if len(races) < 2:
            quiet = cf.LlmRequestPolicy(behaviour="none")
            races.append(found)
            await journal.append(
                stream, ContextAdded(role="user", content="meanwhile", llm_request_policy=quiet)
            )
        return found

    await journal.append(STREAM, [system_prompt("s"), user("go")])
    dump, seen = Dump("z" * 50_000), list[NeutralRequest]()
    agent = Agent(journal, STREAM, dumping_model(seen), tools=[dump.tool()])
    monkeypatch.setattr(journal, "version", racing_version)
    await agent.run_until_idle()
    assert len(races) == 2
    [(position, _)] = await events_of(journal, STREAM, ToolCallResult)
    assert position == races[-1] + 2  # after both appends of the other writer
    item = await tool_item(journal)
    assert [ref.offset for ref in item.refs] == [position]
    assert await read_ref(journal, STREAM, position) == "z" * 50_000


async def test_an_output_too_large_to_store_is_an_error_result_the_model_reads(
    journal: Journal,
) -> None:
    call = ToolCall(id="call_big", name="dump", arguments="{}")
    finished: list[LoopEvent] = []

    async def emit(event: LoopEvent) -> None:
        finished.append(event)

    await journal.append(STREAM, user("go"))
    runs = await run_calls(
        journal,
        STREAM,
        Toolbox([Dump("w" * 200_000).tool()]),
        [call],
        started=(),
        policy="report",
        emit=emit,
        max_output_bytes=100_000,
    )
    assert runs.answered == 1
    [(_, result)] = await events_of(journal, STREAM, ToolCallResult)
    assert result.is_error and "over the 100000 bytes one tool output may store" in result.content
    item = await tool_item(journal)
    assert item.content == f"error: {result.content}"
    outcome = finished[-1]
    assert isinstance(outcome, ToolFinished) and outcome.outcome.is_error


async def test_a_long_webhook_item_reaches_the_model_cut_with_its_own_offset_as_ref(
    db_url: str,
) -> None:
    body = "".join(f'{{"event": {i}, "payload": "…"}}\n' for i in range(8_000))
    seen: list[NeutralRequest] = []
    async with cf.open_journal(db_url) as journal:
        await journal.append(STREAM, system_prompt("You triage webhooks."))
        library = await journal.append(
            STREAM, ContextAdded(role="user", actor=Actor(type="github"), content=body)
        )
        async with served(journal) as client:
            posted = await client.post(
                f"/v1/streams/{STREAM}/events",
                json={
                    "events": [
                        {
                            "type": ContextAdded.event_type,
                            "payload": {"role": "user", "content": body},
                        }
                    ]
                },
            )
            assert posted.status_code == 201, posted.text
            http_at = posted.json()["first_position"]
            fetched = await client.get(f"/v1/streams/{STREAM}/refs/{http_at}")
            assert fetched.content == body.encode()
        agent = Agent(journal, STREAM, FunctionModel(lambda request: _record(seen, request)))
        await agent.run_until_idle()
        assert await read_ref(journal, STREAM, library.first_position) == body
        assert await cf.verify_requests(journal, STREAM) == ()
    texts = [m.content for m in seen[0].messages]
    for offset in (library.first_position, http_at):
        [text] = [t for t in texts if t.startswith(f"@{offset} ")]
        assert len(text.split("\n", 1)[1]) <= 30_000
        assert f"({len(body)} characters) is @{offset} in the journal" in text


def _record(seen: list[NeutralRequest], request: NeutralRequest) -> str:
    seen.append(request)
    return "triaged"


async def test_a_ref_to_nothing_readable_is_a_404_and_a_one_line_cli_error(db_url: str) -> None:
    async with cf.open_journal(db_url) as journal:
        await journal.append(STREAM, [system_prompt("s"), user("go")])
        async with served(journal) as client:
            for offset in (1, 3):  # the system prompt is an item: readable; 3 is no position
                response = await client.get(f"/v1/streams/{STREAM}/refs/{offset}")
                assert response.status_code == (200 if offset == 1 else 404), response.text
            assert response.json()["error"]["type"] == "RefError"
            assert f"{STREAM}@3" in response.json()["error"]["message"]
            missing = await client.get("/v1/streams/agents/none/refs/1")
            assert missing.status_code == 404
            assert missing.json()["error"]["type"] == "UnknownStreamError"
    runner = CliRunner()
    for ref, message in ((f"{STREAM}@3", "has positions 1 to 2"), (STREAM, "is not stream@offset")):
        result = await asyncio.to_thread(
            runner.invoke, app, ["ref", ref, "--url", db_url], env={URL_ENV: ""}
        )
        assert result.exit_code == 1 and result.stdout == ""
        [line] = result.stderr.splitlines()
        assert line.startswith("error: ") and message in line
