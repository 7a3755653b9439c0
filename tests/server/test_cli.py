"""``contextfold serve``: the real command in a child process, and the module surface."""

from __future__ import annotations

import importlib
import pkgutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

import contextfold.server
from contextfold.cli import app


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_serve_has_help() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"])
    assert result.exit_code == 0
    for option in ("--url", "--host", "--port", "--token", "--max-live-streams"):
        assert option in result.output


def test_serve_limits_default_to_the_servers_and_refuse_nonsense() -> None:
    import inspect

    from contextfold import cli
    from contextfold.server.runner import DEFAULT_EXTRA_CONNECTIONS
    from contextfold.server.sse import DEFAULT_MAX_LIVE_STREAMS

    params = inspect.signature(cli.serve).parameters
    assert params["max_live_streams"].default == DEFAULT_MAX_LIVE_STREAMS
    assert params["extra_connections"].default == DEFAULT_EXTRA_CONNECTIONS
    result = CliRunner().invoke(app, ["serve", "--max-live-streams", "0"], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    words = " ".join(result.output.replace("│", " ").split())  # the box may wrap lines
    assert "Invalid value for '--max-live-streams'" in words, result.output


class Served:
    """``contextfold serve`` in a child process, on a free loopback port, with its log."""

    def __init__(self, tmp_path: Path, env: dict[str, str], *, url: bool = True) -> None:
        """``url``: pass ``--url`` (else the command finds its journal by itself)."""
        self.port = _free_port()
        self.db = tmp_path / "served.db"
        self.log_path = tmp_path / "serve.log"
        self._log = self.log_path.open("wb")
        command = ["serve", "--port", str(self.port)]
        if url:
            command += ["--url", f"sqlite:///{self.db}", "--create"]
        self.child = subprocess.Popen(
            [sys.executable, "-m", "contextfold", *command],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin", **env},
            cwd=tmp_path,
        )
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)

    def wait_ready(self) -> None:
        for _ in range(600):  # up to 30 s: slow machines take a while to import and bind
            try:
                self.client.get("/")
                return
            except httpx.TransportError:
                assert self.child.poll() is None, self.log_path.read_text()
                time.sleep(0.05)
        raise AssertionError(f"serve never answered:\n{self.log_path.read_text()}")

    def interrupt(self) -> int:
        """Ctrl-C, and the exit status (uvicorn re-raises the SIGINT: 130 is usual)."""
        self.child.send_signal(signal.SIGINT)
        return self.child.wait(timeout=15)

    def close(self) -> str:
        """Stop whatever is left and return the log."""
        self.client.close()
        if self.child.poll() is None:
            self.child.kill()
            self.child.wait()
        self._log.close()
        return self.log_path.read_text()


def test_serve_runs_a_journal_until_interrupted(tmp_path: Path) -> None:
    served = Served(tmp_path, {"CONTEXTFOLD_TOKEN": "t0ken"})
    auth = {"Authorization": "Bearer t0ken"}
    try:
        served.wait_ready()
        client = served.client
        assert client.get("/v1/streams").status_code == 401  # the env var set the token
        body = {"events": [{"type": "note", "payload": {"text": "hi"}}]}
        assert client.post("/v1/streams/s/events", json=body, headers=auth).status_code == 201
        listed = client.get("/v1/streams", headers=auth).json()
        assert listed == {"streams": [{"stream": "s", "version": 1}], "next": None}
        # on loopback only loopback Host headers are served (DNS rebinding)
        rebound = client.get("/v1/streams", headers={**auth, "Host": "evil.example"})
        assert rebound.status_code == 400
        code = served.interrupt()
    finally:
        output = served.close()
    assert code in (0, 130), output
    assert "Finished server process" in output and "Traceback" not in output
    assert served.db.exists()


def test_serve_ends_open_streams_cleanly_when_interrupted(tmp_path: Path) -> None:
    """A live tail (an open inspector) does not hold up a Ctrl-C: the stream ends at once
    and cleanly, instead of being cut after the grace period with a traceback logged."""
    served = Served(tmp_path, {})
    try:
        served.wait_ready()
        with served.client.stream("GET", "/v1/streams/s/tail") as response:
            lines = response.iter_lines()
            assert next(lines) == ": stream open"
            served.child.send_signal(signal.SIGINT)
            rest = list(lines)  # an incomplete (cut) stream raises RemoteProtocolError
        assert all(line == "" or line.startswith(":") for line in rest), rest
        code = served.child.wait(timeout=15)
    finally:
        output = served.close()
    assert code in (0, 130), output
    assert "Traceback" not in output and "graceful shutdown exceeded" not in output, output


def test_server_modules_declare_all() -> None:
    assert contextfold.server.__all__ == sorted(contextfold.server.__all__)
    for name in contextfold.server.__all__:
        assert hasattr(contextfold.server, name)
    for info in pkgutil.walk_packages(contextfold.server.__path__, prefix="contextfold.server."):
        module = importlib.import_module(info.name)
        exported = getattr(module, "__all__", None)
        assert exported is not None, f"{info.name} has no __all__"
        for item in exported:
            assert hasattr(module, item), f"{info.name}.__all__ names {item!r}"


@pytest.mark.parametrize(
    ("arguments", "option"),
    [
        (["--token", ""], "--token"),
        (["--port", "99999"], "--port"),
        (["--port", "-1"], "--port"),
        (["--trusted-token", ""], "--trusted-token"),
        (["--token", "same", "--trusted-token", "same"], "--trusted-token"),
        (["--header-timeout", "0"], "--header-timeout"),
        (["--pool-timeout", "0"], "--pool-timeout"),
        (["--pool-timeout", "inf"], "--pool-timeout"),
        (["--pool-timeout", "2"], "--pool-timeout"),  # SQLite has no connection pool
    ],
)
def test_serve_refuses_bad_options_in_one_line(
    tmp_path: Path, arguments: list[str], option: str
) -> None:
    db = tmp_path / "never.db"
    done = subprocess.run(
        [sys.executable, "-m", "contextfold", "serve", "--url", f"sqlite:///{db}", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "60"},
    )
    output = (done.stdout + done.stderr).strip()
    assert done.returncode in (1, 2), output
    assert "\n" not in output and option in output, output
    assert "Traceback" not in output
    assert not db.exists()  # refused before anything was opened


def _serve_refused(url: str, *arguments: str, cwd: Path | None = None) -> str:
    """The one line ``contextfold serve --url url`` fails with (exit status 1)."""
    done = subprocess.run(
        [sys.executable, "-m", "contextfold", "serve", "--port", "0", "--url", url, *arguments],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "60"},
        cwd=cwd,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in done.stderr
    return lines[0]


def test_serve_refuses_an_sqlite_file_that_does_not_exist_unless_told_to_create_it(
    tmp_path: Path,
) -> None:
    """A typo would serve (and create) an empty journal; the library still creates files."""
    import asyncio

    import contextfold as cf
    from contextfold.errors import StoreUnavailableError
    from contextfold.server import serve_async

    typo = tmp_path / "typo.db"
    line = _serve_refused(f"sqlite:///{typo}")
    assert f"the file {typo} does not exist" in line and "pass --create" in line, line
    assert not typo.exists()
    with pytest.raises(StoreUnavailableError, match="create=True"):
        asyncio.run(serve_async(f"sqlite:///{typo}", port=0))
    assert not typo.exists()
    # a relative path (sqlite:///data/x.db) that was meant as an absolute one says so
    (tmp_path / "data").mkdir()
    (tmp_path / "work").mkdir()
    relative = str(tmp_path / "data" / "x.db").lstrip("/")
    line = _serve_refused(f"sqlite:///{relative}", cwd=tmp_path / "work")
    assert f"for the absolute path /{relative} write sqlite:////{relative}" in line, line
    assert not (tmp_path / "work" / relative).exists()
    with cf.open_journal_sync(f"sqlite:///{typo}") as journal:  # the library creates it
        journal.append("s", cf.RawEvent("note", {}))
    assert typo.is_file()


def test_serve_uses_the_pool_timeout_it_is_given_for_postgresql() -> None:
    """--pool-timeout reaches the connection pool: an unreachable database is reported
    after its seconds, not the default's."""
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    line = _serve_refused(f"postgresql://nobody@127.0.0.1:{port}/journal", "--pool-timeout", "1")
    assert "incomplete after 1.0 sec" in line and f"127.0.0.1:{port}" in line, line
    by_url = _serve_refused(f"postgresql://nobody@127.0.0.1:{port}/journal?pool_timeout=1.5")
    assert "incomplete after 1.5 sec" in by_url, by_url


def test_serve_has_the_trusted_token_option() -> None:
    import inspect

    from contextfold import cli
    from contextfold.server.protocol import DEFAULT_HEADER_TIMEOUT

    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert "--trusted-token" in result.output and "--header-timeout" in result.output
    params = inspect.signature(cli.serve).parameters
    assert params["header_timeout"].default == DEFAULT_HEADER_TIMEOUT


def _seed_session(url: str) -> None:
    """A stream and a transcript message with a part, in the one database at ``url``."""
    import asyncio

    import contextfold as cf
    from contextfold.transcript.parts import Message, TextPart
    from contextfold.transcript.store.factory import open_transcript_store

    async def run() -> None:
        async with cf.open_journal(url) as journal:
            await journal.append("chat", cf.ContextAdded(role="user", content="hello?"))
        async with open_transcript_store(url) as store:
            message = Message(id="m1", session="chat", role="user", created="2025-01-01")
            part = TextPart(id="p1", session="chat", message_id="m1", text="hello?")
            await store.write(messages=[message], parts=[part])

    asyncio.run(run())


@pytest.mark.parametrize("where", ["default", "environment"])
def test_serve_finds_the_journal_every_command_uses_with_its_transcript(
    tmp_path: Path, where: str
) -> None:
    """No --url: the default journal (where the demo writes) or CONTEXTFOLD_URL, as for
    every command; the transcript kept in the same database is served with it."""
    from contextfold.cli import DEFAULT_URL, URL_ENV

    if where == "default":
        env: dict[str, str] = {}
        (tmp_path / ".contextfold").mkdir()
        url = f"sqlite:///{tmp_path / DEFAULT_URL.removeprefix('sqlite:///')}"
    else:
        url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
        env = {URL_ENV: url}
    _seed_session(url)
    served = Served(tmp_path, env, url=False)
    try:
        served.wait_ready()
        listed = served.client.get("/v1/streams").json()
        assert listed == {"streams": [{"stream": "chat", "version": 1}], "next": None}
        rows = served.client.get("/v1/sessions/chat/transcript").json()
        assert [entry["message"]["id"] for entry in rows["messages"]] == ["m1"]
        assert rows["messages"][0]["parts"][0]["text"] == "hello?"
        served.interrupt()
    finally:
        output = served.close()
    assert "Traceback" not in output, output
    assert not served.db.exists()


def test_serve_gives_up_on_an_unreachable_database_with_one_line() -> None:
    """Its pool would wait 30 s behind warnings; serve says what is wrong after its startup
    deadline (the subprocess timeout only keeps a hang from stalling the suite)."""
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "contextfold",
            "serve",
            "--port",
            "0",
            "--url",
            f"postgresql://nobody@127.0.0.1:{port}/journal",
        ],
        capture_output=True,
        text=True,
        timeout=25,
        check=False,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "did not open within 5 s" in lines[0] and f"127.0.0.1:{port}" in lines[0]
    assert "Traceback" not in done.stderr
