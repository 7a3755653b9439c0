"""The CLI: every documented command on a real SQLite journal, on success and on each
mistake a user makes (a missing file, a typo in a stream name, an offset that is no
request, a cursor that names nothing), each a one-line error with exit status 1 and
nothing created or changed."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import os
import socket
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

import contextfold as cf
from contextfold import cli
from contextfold.cli import DEFAULT_URL, URL_ENV, app

runner = CliRunner()

READ_COMMANDS = (
    ["streams"],
    ["events", "chat"],
    ["rebuild", "chat", "3"],
    ["verify", "chat"],
)


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(app, list(args), env={URL_ENV: "", **(env or {})})


def one_error_line(result: Result) -> str:
    """The single stderr line of a failed command (and no traceback)."""
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def test_every_command_has_help_text() -> None:
    for command in app.registered_commands:
        assert command.callback is not None and command.callback.__doc__, command.name
        name = command.name or command.callback.__name__
        result = runner.invoke(app, [name, "--help"])
        assert result.exit_code == 0, result.output
        assert command.callback.__doc__.splitlines()[0][:30] in " ".join(result.output.split())


def test_version_prints_the_installed_version_and_opens_no_journal(tmp_path: Path) -> None:
    journal = tmp_path / "j.db"
    result = invoke("--version", env={URL_ENV: f"sqlite:///{journal}"})
    assert result.exit_code == 0, result.output
    assert result.stdout == f"contextfold {cf.__version__}\n"
    assert not journal.exists()
    assert "--version" in invoke("--help").stdout


def test_every_command_has_one_default_url_and_the_read_commands_json() -> None:
    for command in app.registered_commands:
        assert command.callback is not None
        params = inspect.signature(command.callback).parameters
        assert params["url"].default == DEFAULT_URL, command.callback.__name__
    for name in ("streams", "events", "rebuild", "verify"):
        assert "as_json" in inspect.signature(getattr(cli, name)).parameters, name


@pytest.fixture
def session(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    with cf.open_journal_sync(url) as journal:
        journal.append("chat", cf.system_prompt("Be brief."))
        journal.append("chat", cf.ContextAdded(role="user", content="hello?"))
    return url


def _recorded_session(url: str, stream: str = "chat") -> int:
    """Run the agent once on the stream: returns the offset of its recorded request."""

    async def run() -> int:
        async with cf.open_journal(url) as journal:
            if not await journal.version(stream):
                await journal.append(stream, cf.system_prompt("Be brief."))
                await journal.append(stream, cf.ContextAdded(role="user", content="hello?"))
            agent = cf.Agent(journal, stream, cf.FunctionModel(lambda request: "hi"))
            return (await agent.run_until_idle()).requests[0]

    return asyncio.run(run())


def _lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_streams_events_rebuild_and_verify(session: str) -> None:
    offset = _recorded_session(session)
    listed = invoke("streams", "--url", session)
    assert listed.exit_code == 0 and listed.stdout.startswith("chat\t")
    as_json = json.loads(invoke("streams", "--url", session, "--json").stdout)
    with cf.open_journal_sync(session) as journal:
        version = journal.version("chat")
        stored = journal.read("chat").events
        body = journal.run(cf.rebuild_request, "chat", offset)
    assert as_json == {"streams": [{"stream": "chat", "version": version}], "next": None}

    printed = invoke("events", "chat", "--url", session)
    assert printed.exit_code == 0 and printed.stderr == ""
    lines = _lines(printed)
    assert [line["position"] for line in lines] == [e.position for e in stored]
    assert [line["cursor"] for line in lines] == [e.cursor for e in stored]
    assert [line["type"] for line in lines] == [e.type for e in stored]
    assert lines[1]["payload"]["content"] == "hello?"
    assert {"position", "cursor", "type", "payload", "meta"} <= set(lines[0])

    rebuilt = invoke("rebuild", "chat", str(offset), "--url", session)
    assert rebuilt.exit_code == 0
    assert rebuilt.stdout.strip().encode() == body.body
    as_json_body = invoke("rebuild", "chat", str(offset), "--url", session, "--json")
    described = json.loads(as_json_body.stdout)
    assert described["sha256"] == body.sha256 == hashlib.sha256(body.body).hexdigest()
    assert described["body"] == json.loads(body.body)

    verified = invoke("verify", "chat", "--url", session)
    assert verified.exit_code == 0
    assert verified.stdout == "all 1 recorded request(s) of 'chat' rebuild byte for byte\n"
    report = json.loads(invoke("verify", "chat", "--url", session, "--json").stdout)
    assert report == {
        "stream": "chat",
        "ok": True,
        "requests": 1,
        "drift_count": 0,
        "drifts": [],
        "corrupt": [],
    }


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: c[0])
def test_a_missing_journal_is_an_error_and_nothing_is_created(
    tmp_path: Path, command: list[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'typo' / 'jounral.db'}"
    line = one_error_line(invoke(*command, "--url", url))
    assert "jounral.db does not exist" in line and "nothing was created" in line
    assert list(tmp_path.iterdir()) == []
    # the environment variable and the default are read the same way
    env_line = one_error_line(invoke(*command, env={URL_ENV: url}))
    assert env_line == line


def test_read_commands_change_nothing_in_the_journal(session: str, tmp_path: Path) -> None:
    _recorded_session(session)
    before = sorted(p.name for p in tmp_path.iterdir())
    digest = hashlib.sha256(Path(session.removeprefix("sqlite:///")).read_bytes()).hexdigest()
    for command in (*READ_COMMANDS, ["events", "chat", "--json"], ["verify", "chat", "--json"]):
        result = invoke(*command, "--url", session)
        assert result.exit_code in (0, 1), result.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == before, command
    after = hashlib.sha256(Path(session.removeprefix("sqlite:///")).read_bytes()).hexdigest()
    assert after == digest


def test_an_sqlite_file_that_is_no_journal_is_an_error_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE notes (text TEXT)")
    db.close()
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    line = one_error_line(invoke("streams", "--url", f"sqlite:///{path}"))
    assert "other.db is not the journal (it has no cf_events table)" in line
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest


@pytest.mark.parametrize("command", READ_COMMANDS[1:], ids=lambda c: c[0])
def test_an_unknown_stream_names_the_closest_ones(session: str, command: list[str]) -> None:
    _recorded_session(session, "demo/coding-session")
    typo = [command[0], "demo/coding-sesion", *command[2:]]
    line = one_error_line(invoke(*typo, "--url", session))
    assert "no stream 'demo/coding-sesion' in sqlite:///" in line
    assert "did you mean 'demo/coding-session'?" in line
    far = one_error_line(invoke(command[0], "zzz", *command[2:], "--url", session))
    assert "no stream has a close name" in far


def test_rebuild_of_an_offset_that_is_no_request_is_an_error(session: str) -> None:
    offset = _recorded_session(session)
    line = one_error_line(invoke("rebuild", "chat", "1", "--url", session))
    assert "stream 'chat' position 1 is not a model request" in line
    with cf.open_journal_sync(session) as journal:
        version = journal.version("chat")
    beyond = one_error_line(invoke("rebuild", "chat", str(version + 5), "--url", session))
    assert f"has positions 1 to {version}: @{version + 5} is none of them" in beyond
    assert offset < version


def test_main_prints_contextfold_errors_as_one_line(session: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "contextfold", "rebuild", "chat", "1", "--url", session],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, URL_ENV: ""},
    )
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and "not a model request" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def _interleaved(url: str, events: int) -> None:
    """Two streams appended in turn, so stream positions and cursors differ."""
    with cf.open_journal_sync(url) as journal:
        for i in range(events):
            journal.append("a", cf.RawEvent("note", {"i": i}))
            journal.append("b", cf.RawEvent("note", {"i": i}))


def test_a_bad_or_foreign_cursor_is_an_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    _interleaved(url, 3)
    other = _lines(invoke("events", "b", "--url", url))[0]["cursor"]
    line = one_error_line(invoke("events", "a", "--after", other, "--url", url))
    assert f"cursor '{other}' names no event of stream 'a'" in line
    bad = one_error_line(invoke("events", "a", "--after", "3x", "--url", url))
    assert "cursor '3x' is not a cursor" in bad
    far = one_error_line(invoke("events", "a", "--after", "99999", "--url", url))
    assert "names no event of stream 'a'" in far


def test_a_page_cut_by_limit_says_so_with_the_cursor_to_continue(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    _interleaved(url, 3)
    first = invoke("events", "a", "--limit", "2", "--url", url)
    assert first.exit_code == 0
    printed = _lines(first)
    assert [line["payload"]["i"] for line in printed] == [0, 1]
    assert first.stderr == (
        f"-- 2 events shown, more follow: continue with --after {printed[-1]['cursor']}\n"
    )
    rest = invoke("events", "a", "--after", printed[-1]["cursor"], "--url", url)
    assert [line["payload"]["i"] for line in _lines(rest)] == [2] and rest.stderr == ""
    page = json.loads(invoke("events", "a", "--limit", "2", "--json", "--url", url).stdout)
    assert page["more"] is True and page["cursor"] == printed[-1]["cursor"]
    assert [e["payload"]["i"] for e in page["events"]] == [0, 1]


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    order=st.lists(st.sampled_from("ab"), min_size=1, max_size=12),
    limit=st.integers(min_value=1, max_value=5),
)
def test_paging_with_the_printed_cursor_gives_every_event_once(
    order: list[str], limit: int
) -> None:
    """However two streams interleave, the pages of one stream chained by the cursor each
    page ends with are its whole history, in order, without repeat or gap."""
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'j.db'}"
        with cf.open_journal_sync(url) as journal:
            for i, stream in enumerate(order):
                journal.append(stream, cf.RawEvent("note", {"i": i}))
        stream = order[0]
        seen: list[int] = []
        after: list[str] = []
        while True:
            result = invoke("events", stream, "--limit", str(limit), *after, "--url", url)
            assert result.exit_code == 0, result.stderr
            lines = _lines(result)
            seen += [line["payload"]["i"] for line in lines]
            if not result.stderr:
                break
            assert result.stderr.endswith(f"--after {lines[-1]['cursor']}\n")
            after = ["--after", lines[-1]["cursor"]]
        assert seen == [i for i, name in enumerate(order) if name == stream]


def test_events_reports_corrupt_rows_and_prints_the_others(session: str) -> None:
    """Not JSON (as bytes or as text) and no longer valid for its class: each reported with
    stream and position on stderr, every sound row printed, exit status 1."""
    _recorded_session(session)
    with cf.open_journal_sync(session) as journal:
        total = journal.version("chat")
    _corrupt(session, 1, b"{{{")
    _corrupt(session, 2, '{"role": 5, "content": "hello?"}')  # TEXT, valid JSON, bad field
    _corrupt(session, 3, "not json")  # stored as TEXT, not as a blob
    result = invoke("events", "chat", "--url", session)
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert [line["position"] for line in _lines(result)] == list(range(4, total + 1))
    errors = result.stderr.splitlines()
    assert errors[0].startswith("corrupt row: stream 'chat' position 1 (type ")
    assert "not valid JSON" in errors[0]
    assert errors[1].startswith("corrupt row: stream 'chat' position 2 (type ")
    assert "no longer decodes it" in errors[1] and "role" in errors[1]
    assert errors[2].startswith("corrupt row: stream 'chat' position 3") and "JSON" in errors[2]
    assert errors[3] == "3 corrupt row(s) in stream 'chat', not printed"


def test_verify_of_a_stream_without_requests_says_there_is_nothing_to_verify(
    session: str,
) -> None:
    result = invoke("verify", "chat", "--url", session)
    line = one_error_line(result)
    assert "stream 'chat' has no recorded requests: nothing to verify" in line
    assert "byte for byte" not in result.stdout
    as_json = invoke("verify", "chat", "--url", session, "--json")
    assert as_json.exit_code == 1
    assert json.loads(as_json.stdout) == {
        "stream": "chat",
        "ok": False,
        "requests": 0,
        "drift_count": 0,
        "drifts": [],
        "corrupt": [],
    }


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


def test_verify_reports_a_corrupt_request_record_as_a_drift(session: str) -> None:
    _recorded_session(session)
    record = _position_of(session, "contextfold.agent/request-recorded")
    _corrupt(session, record, b"\xff\xfe not even utf-8")
    result = invoke("verify", "chat", "--url", session)
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
    result = invoke("verify", "chat", "--url", session)
    assert result.exit_code == 1, result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"@2: corrupt row, stream 'chat' position 2 (type {kind!r})")
    assert "no longer decodes it" in lines[0]
    assert f"@{offset}: bytes differ" in lines[1:]


def _run(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "contextfold", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        env={**os.environ, URL_ENV: "", "COLUMNS": "80", **env},
    )


def test_output_to_a_pipe_is_never_wrapped(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    stream = "agents/" + "a-rather-long-stream-name-" * 6
    _recorded_session(url, stream)
    verified = _run("verify", stream, "--url", url)
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout == f"all 1 recorded request(s) of {stream!r} rebuild byte for byte\n"
    missing = _run("verify", stream + "x", "--url", url)
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1, missing.stderr
    assert len(missing.stderr) > 80


def test_the_default_journal_is_the_demos_and_contextfold_url_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``contextfold demo`` then ``contextfold events demo/coding-session``, no --url: the
    commands read the journal the demo wrote; CONTEXTFOLD_URL moves every command."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert invoke("demo").exit_code == 0
    assert (tmp_path / DEFAULT_URL.removeprefix("sqlite:///")).is_file()
    printed = invoke("events", "demo/coding-session", "--limit", "3")
    assert printed.exit_code == 0 and len(_lines(printed)) == 3
    assert invoke("verify", "demo/coding-session").exit_code == 0
    elsewhere = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    moved = invoke("demo", env={URL_ENV: elsewhere})
    assert moved.exit_code == 0 and (tmp_path / "elsewhere.db").is_file()
    listed = invoke("streams", env={URL_ENV: elsewhere})
    assert listed.stdout.startswith("demo/coding-session\t")
    for url in ("memory://", "postgresql://user@127.0.0.1:1/journal"):
        refused = invoke("demo", "--url", url)
        assert refused.exit_code == 2 and "--url must name an SQLite file" in refused.stderr


def test_the_demos_help_offers_only_the_urls_it_takes() -> None:
    """The demo runs on an embedded SQLite journal: its --url help names no PostgreSQL URL,
    which the other commands take."""
    shown = " ".join(invoke("demo", "--help").stdout.split())
    assert "sqlite:///" in shown and "postgresql" not in shown
    assert "postgresql://" in " ".join(invoke("streams", "--help").stdout.split())


def test_an_unreachable_postgresql_fails_fast_in_one_line() -> None:
    with socket.socket() as sock:  # a loopback port nobody listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"postgresql://user:secret@127.0.0.1:{port}/journal"
    # The old behaviour (the pool's 30 s, five warnings) would outlast this bound.
    done = subprocess.run(
        [sys.executable, "-m", "contextfold", "streams", "--url", url],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, URL_ENV: ""},
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: "), done.stderr
    assert f"after {cli.CONNECT_TIMEOUT} sec" in done.stderr and "secret" not in done.stderr
    assert "last attempt:" in done.stderr and "refused" in done.stderr.lower()
    assert cli.CONNECT_TIMEOUT < 5


def test_verify_shows_progress_only_on_a_terminal(tmp_path: Path) -> None:
    import pty

    url = f"sqlite:///{tmp_path / 'j.db'}"
    _recorded_session(url)
    piped = _run("verify", "chat", "--url", url)
    assert piped.returncode == 0 and piped.stderr == ""
    leader, follower = pty.openpty()
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "contextfold", "verify", "chat", "--url", url],
            stdout=subprocess.PIPE,
            stderr=follower,
            env={**os.environ, URL_ENV: "", "TERM": "xterm", "COLUMNS": "100"},
        )
        out, _ = child.communicate(timeout=60)
        os.close(follower)
        follower = -1
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end is closed: all was read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(leader)
        if follower >= 0:
            os.close(follower)
    assert child.returncode == 0 and b"rebuild byte for byte" in out
    assert b"rebuilding requests" in drawn or b"reading request records" in drawn


@contextlib.contextmanager
def _following(*args: str) -> Iterator[subprocess.Popen[str]]:
    """``contextfold events ... --follow`` in a child process, interrupted when the block
    ends: it exits with 130 (SIGINT) and no traceback."""
    import signal

    command = [sys.executable, "-m", "contextfold", "events", *args, "--follow"]
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, URL_ENV: ""},
    ) as child:
        assert child.stdout is not None and child.stderr is not None
        try:
            yield child
            child.send_signal(signal.SIGINT)
            code = child.wait(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
        logged = child.stderr.read()
    assert code == 130 and "Traceback" not in logged, logged


def test_events_follow_prints_what_lands_until_interrupted(session: str) -> None:
    with _following("chat", "--url", session) as child:
        assert child.stdout is not None
        history = [json.loads(child.stdout.readline()) for _ in range(2)]
        assert [line["position"] for line in history] == [1, 2]
        with cf.open_journal_sync(session) as journal:
            journal.append("chat", cf.ContextAdded(role="user", content="live!"))
        live = json.loads(child.stdout.readline())
        assert live["position"] == 3 and live["payload"]["content"] == "live!"
    refused = invoke("events", "chat", "--follow", "--limit", "2", "--url", session)
    assert refused.exit_code == 2 and "--follow cannot be combined" in refused.stderr


def test_streams_lists_every_stream_past_a_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Page after page (here of 2): the listing never stops at the store's page size."""
    from contextfold.store import base

    url = f"sqlite:///{tmp_path / 'j.db'}"
    names = [f"s/{n}" for n in range(5)]
    with cf.open_journal_sync(url) as journal:
        for name in names:
            journal.append(name, cf.RawEvent("note", {}))
    monkeypatch.setattr(base, "MAX_LIMIT", 2)
    listed = invoke("streams", "--url", url)
    assert listed.exit_code == 0 and listed.stderr == ""
    assert listed.stdout.splitlines() == [f"{name}\t1" for name in names]
    as_json = json.loads(invoke("streams", "--url", url, "--json", "--prefix", "s/").stdout)
    assert [info["stream"] for info in as_json["streams"]] == names
    assert as_json["next"] is None


def test_events_follow_waits_for_the_first_events_of_a_stream_without_any(
    tmp_path: Path,
) -> None:
    """As the HTTP tail does: a stream with no events yet is followed from its start, with
    a line on stderr saying so (the closest names included, for a typo)."""
    url = f"sqlite:///{tmp_path / 'j.db'}"
    with cf.open_journal_sync(url) as journal:
        journal.append("chats", cf.ContextAdded(role="user", content="elsewhere"))
    with _following("chat", "--url", url) as child:
        assert child.stdout is not None and child.stderr is not None
        note = child.stderr.readline()
        assert note.startswith("-- no stream 'chat'") and "waiting for its first" in note
        assert "did you mean 'chats'?" in note, note
        with cf.open_journal_sync(url) as journal:
            journal.append("chat", cf.ContextAdded(role="user", content="first!"))
        first = json.loads(child.stdout.readline())
        assert first["position"] == 1 and first["payload"]["content"] == "first!"
    # without --follow, or with a cursor (which no event of it can carry), still a mistake
    for args in (("events", "nope"), ("events", "nope", "--follow", "--after", "1")):
        assert "no stream 'nope'" in one_error_line(invoke(*args, "--url", url))


def test_demo_with_an_unreachable_provider_says_so_and_keeps_the_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key set, the provider down: exit 1 with the provider's error and what to do, and
    the request that failed is in the journal (recorded, unanswered, retryable)."""
    with socket.socket() as sock:  # a loopback port nobody listens on: connection refused
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("OPENAI_BASE_URL", f"http://127.0.0.1:{port}/v1")
    monkeypatch.setenv("COLUMNS", "200")
    db = tmp_path / "demo.db"
    result = invoke("demo", "--db", str(db))
    assert result.exit_code == 1, result.output
    assert "openai-chat request to model" in result.output
    assert "Unset OPENAI_API_KEY, OPENAI_BASE_URL and ANTHROPIC_API_KEY" in result.output
    with cf.open_journal_sync(f"sqlite:///{db}") as journal:
        types = [e.type for e in journal.read("demo/coding-session").events]
    assert cf.LlmRequestRequested.event_type in types
    assert cf.LlmResponse.event_type not in types
