"""The CLI: every command has help, and each one does what it says on a real journal."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

import contextfold as cf
from contextfold.cli import app

runner = CliRunner()


def test_every_command_has_help_text() -> None:
    for command in app.registered_commands:
        assert command.callback is not None and command.callback.__doc__, command.name
        name = command.name or command.callback.__name__
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, result.output
        assert command.callback.__doc__.splitlines()[0][:30] in " ".join(result.output.split())


@pytest.fixture
def session(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    with cf.open_journal_sync(url) as journal:
        journal.append("chat", cf.system_prompt("Be brief."))
        journal.append("chat", cf.ContextAdded(role="user", content="hello?"))
    return url


def test_streams_events_rebuild_and_verify(session: str) -> None:
    import asyncio

    async def run() -> int:
        async with cf.open_journal(session) as journal:
            agent = cf.Agent(journal, "chat", cf.FunctionModel(lambda request: "hi"))
            report = await agent.run_until_idle()
            return report.requests[0]

    offset = asyncio.run(run())
    listed = runner.invoke(app, ["streams", "--url", session])
    assert listed.exit_code == 0 and "chat" in listed.output
    printed = runner.invoke(app, ["events", "chat", "--url", session])
    assert printed.exit_code == 0 and "hello?" in printed.output
    rebuilt = runner.invoke(app, ["rebuild", "chat", str(offset), "--url", session])
    assert rebuilt.exit_code == 0

    async def body() -> bytes:
        async with cf.open_journal(session) as journal:
            body = (await journal.rebuild_request("chat", offset)).body
            return body

    assert rebuilt.stdout.strip().encode() == asyncio.run(body())
    verified = runner.invoke(app, ["verify", "chat", "--url", session])
    assert verified.exit_code == 0 and "byte for byte" in verified.output


def test_rebuild_of_a_non_request_fails_with_a_clear_error(session: str) -> None:
    result = runner.invoke(app, ["rebuild", "chat", "1", "--url", session])
    assert result.exit_code != 0
    assert "not a model request" in str(result.exception)


def test_main_prints_contextfold_errors_as_one_line(session: str) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "contextfold", "rebuild", "chat", "1", "--url", session],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and "not a model request" in done.stderr
    assert "Traceback" not in done.stderr


def test_demo_with_an_unreachable_provider_says_so_and_keeps_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key set, the provider down: exit 1 with the provider's error and what to do, and
    the request that failed is in the journal (recorded, unanswered, retryable)."""
    import socket

    with socket.socket() as sock:  # a loopback port nobody listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("COLUMNS", "200")
    db = tmp_path / "demo.db"
    result = runner.invoke(app, ["demo", "--db", str(db)])
    assert result.exit_code == 1, result.output
    assert "openai-chat request to model" in result.output
    assert "Unset OPENAI_API_KEY and ANTHROPIC_API_KEY" in result.output
    with cf.open_journal_sync(f"sqlite:///{db}") as journal:
        types = [e.type for e in journal.read("demo/coding-session").events]
    assert cf.LlmRequestRequested.event_type in types
    assert cf.LlmResponse.event_type not in types


def _recorded_session(url: str) -> int:
    """Run the agent once on the session: returns the offset of its recorded request."""
    import asyncio

    async def run() -> int:
        async with cf.open_journal(url) as journal:
            agent = cf.Agent(journal, "chat", cf.FunctionModel(lambda request: "hi"))
            return (await agent.run_until_idle()).requests[0]

    return asyncio.run(run())


def _corrupt(url: str, position: int, data: bytes | str) -> str:
    """Overwrite the payload of row ``position`` of stream chat, as a foreign writer could;
    returns its type."""
    path = url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        (kind,) = db.execute(
            "SELECT type FROM cf_events WHERE stream = 'chat' AND position = ?", (position,)
        ).fetchone()
        db.execute(
            "UPDATE cf_events SET data = ? WHERE stream = 'chat' AND position = ?",
            (data, position),
        )
    db.close()
    return str(kind)


def _position_of(url: str, event_type: str) -> int:
    with cf.open_journal_sync(url) as journal:
        (found,) = journal.latest("chat", [event_type])
        return found.position


def test_events_reports_corrupt_rows_and_prints_the_others(session: str) -> None:
    """Not JSON (as bytes or as text) and no longer valid for its class: each reported with
    stream and position on stderr, every sound row printed, exit status 1."""
    _recorded_session(session)
    with cf.open_journal_sync(session) as journal:
        total = journal.version("chat")
    _corrupt(session, 1, b"{{{")
    _corrupt(session, 2, '{"role": 5, "content": "hello?"}')  # TEXT, valid JSON, bad field
    _corrupt(session, 3, "not json")  # stored as TEXT, not as a blob
    result = runner.invoke(app, ["events", "chat", "--url", session])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    printed = [line.split("\t")[0] for line in result.stdout.splitlines()]
    assert printed == [str(p) for p in range(4, total + 1)]
    errors = result.stderr.splitlines()
    assert errors[0].startswith("corrupt row: stream 'chat' position 1 (type ")
    assert "not valid JSON" in errors[0]
    assert errors[1].startswith("corrupt row: stream 'chat' position 2 (type ")
    assert "no longer decodes it" in errors[1] and "role" in errors[1]
    assert errors[2].startswith("corrupt row: stream 'chat' position 3") and "JSON" in errors[2]
    assert errors[3] == "3 corrupt row(s) in stream 'chat', not printed"


def test_events_of_a_sound_stream_exits_0(session: str) -> None:
    result = runner.invoke(app, ["events", "chat", "--url", session])
    assert result.exit_code == 0 and result.stderr == ""
    assert [line.split("\t")[0] for line in result.stdout.splitlines()] == ["1", "2"]


def test_verify_reports_a_corrupt_request_record_as_a_drift(session: str) -> None:
    _recorded_session(session)
    record = _position_of(session, "contextfold.agent/request-recorded")
    _corrupt(session, record, b"\xff\xfe not even utf-8")
    result = runner.invoke(app, ["verify", "chat", "--url", session])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert f"@{record}: corrupt row, stream 'chat' position {record} (type " in result.stdout
    assert "byte for byte" not in result.stdout


def test_verify_reports_a_context_row_its_class_rejects_and_the_drift_it_causes(
    session: str,
) -> None:
    """The rebuild leaves the corrupt row out (as the folds do), so the request that held
    it no longer rebuilds to its recorded bytes: both are reported."""
    offset = _recorded_session(session)
    kind = _corrupt(session, 2, b'{"role": ["not", "a", "role"], "content": 7}')
    assert kind == cf.ContextAdded.event_type
    result = runner.invoke(app, ["verify", "chat", "--url", session])
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"@2: corrupt row, stream 'chat' position 2 (type {kind!r})")
    assert "no longer decodes it" in lines[0]
    assert f"@{offset}: bytes differ" in lines[1:]
