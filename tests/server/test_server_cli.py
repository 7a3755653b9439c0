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


def test_serve_runs_a_journal_until_interrupted(tmp_path: Path) -> None:
    port = _free_port()
    url = f"sqlite:///{tmp_path / 'served.db'}"
    log = (tmp_path / "serve.log").open("wb")
    child = subprocess.Popen(
        [sys.executable, "-m", "contextfold", "serve", "--url", url, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={"PATH": "/usr/bin:/bin", "CONTEXTFOLD_TOKEN": "t0ken"},
    )
    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Bearer t0ken"}
    try:
        with httpx.Client(base_url=base, timeout=5) as client:
            for _ in range(200):
                try:
                    client.get("/")
                    break
                except httpx.TransportError:
                    assert child.poll() is None, (tmp_path / "serve.log").read_text()
                    time.sleep(0.05)
            assert client.get("/v1/streams").status_code == 401  # the env var set the token
            body = {"events": [{"type": "note", "payload": {"text": "hi"}}]}
            assert client.post("/v1/streams/s/events", json=body, headers=auth).status_code == 201
            listed = client.get("/v1/streams", headers=auth).json()
            assert listed == {"streams": [{"stream": "s", "version": 1}]}
            # on loopback only loopback Host headers are served (DNS rebinding)
            rebound = client.get("/v1/streams", headers={**auth, "Host": "evil.example"})
            assert rebound.status_code == 400
    finally:
        child.send_signal(signal.SIGINT)
        try:
            code = child.wait(timeout=15)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            log.close()
    output = (tmp_path / "serve.log").read_text()
    # uvicorn re-raises the SIGINT it caught once shut down: 130 is the usual exit status
    assert code in (0, 130), output
    assert "Finished server process" in output and "Traceback" not in output
    assert (tmp_path / "served.db").exists()


def test_serve_ends_open_streams_cleanly_when_interrupted(tmp_path: Path) -> None:
    """A live tail (an open inspector) does not hold up a Ctrl-C: the stream ends at once
    and cleanly, instead of being cut after the grace period with a traceback logged."""
    port = _free_port()
    url = f"sqlite:///{tmp_path / 'served.db'}"
    log = (tmp_path / "serve.log").open("wb")
    child = subprocess.Popen(
        [sys.executable, "-m", "contextfold", "serve", "--url", url, "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={"PATH": "/usr/bin:/bin"},
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            for _ in range(600):
                try:
                    client.get("/")
                    break
                except httpx.TransportError:
                    assert child.poll() is None, (tmp_path / "serve.log").read_text()
                    time.sleep(0.05)
            with client.stream("GET", "/v1/streams/s/tail") as response:
                lines = response.iter_lines()
                assert next(lines) == ": stream open"
                child.send_signal(signal.SIGINT)
                rest = list(lines)  # an incomplete (cut) stream raises RemoteProtocolError
        assert all(line == "" or line.startswith(":") for line in rest), rest
        code = child.wait(timeout=15)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        log.close()
    output = (tmp_path / "serve.log").read_text()
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
