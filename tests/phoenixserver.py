"""Arize Phoenix on loopback for the telemetry tests (no pytest dependency).

Usage::

    with PhoenixServer() as phoenix:
        exporter = OTLPSpanExporter(endpoint=phoenix.traces_url)
        Client(base_url=phoenix.url).spans.get_spans(project_identifier=...)

Phoenix's server is installed once into an environment of its own in the cache
(``$CONTEXTFOLD_CACHE``, else ``$XDG_CACHE_HOME/contextfold``, else
``~/.cache/contextfold``), exactly as ``tests/phoenix-requirements.txt`` pins it, with the
project's uv (``make install`` puts it in ``.tools``) or else pip: about 15 seconds with uv.
It cannot share the project's environment (see that file). Each server keeps its embedded
SQLite database in a temporary working directory and listens on free loopback ports only;
its usage telemetry and its download at start (a sandbox's interpreter) are off. Its first
start after an install takes about a minute (its modules compile), later ones about half.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

HOST = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = Path(__file__).resolve().with_name("phoenix-requirements.txt")


class PhoenixNotAvailableError(RuntimeError):
    """Phoenix's server could not be installed (no registry to install it from)."""


def cache_root() -> Path:
    if explicit := os.environ.get("CONTEXTFOLD_CACHE"):
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "contextfold"


def _environment() -> Path:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:12]
    return cache_root() / f"phoenix-{digest}"


def _run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PhoenixNotAvailableError(
            f"installing Phoenix's server failed ({' '.join(command[:3])} ...):\n"
            f"{done.stderr[-3000:]}"
        )


def install() -> Path:
    """The ``phoenix`` executable, installed first when it is not there yet (one process
    at a time: another waits for the lock, then finds it installed)."""
    home = _environment()
    phoenix = home / "bin" / "phoenix"
    home.parent.mkdir(parents=True, exist_ok=True)
    with (home.parent / "phoenix.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (home / ".installed").is_file() and phoenix.is_file():
            return phoenix
        shutil.rmtree(home, ignore_errors=True)  # what an interrupted install left
        uv = ROOT / ".tools" / "bin" / "uv"
        uv_path = str(uv) if uv.is_file() else shutil.which("uv")
        python = str(home / "bin" / "python")
        if uv_path:
            _run([uv_path, "venv", "--quiet", "--python", sys.executable, str(home)])
            _run(
                [uv_path, "pip", "install", "--quiet", "--python", python, "-r", str(REQUIREMENTS)]
            )
        else:
            _run([sys.executable, "-m", "venv", str(home)])
            _run([python, "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)])
        (home / ".installed").touch()
    return phoenix


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class PhoenixServer:
    """A Phoenix server process on free loopback ports, stopped (and its data removed) on
    exit. Raises PhoenixNotAvailableError when it cannot be installed."""

    def __init__(self, *, start_timeout: float = 240) -> None:
        self.executable = install()
        self.start_timeout = start_timeout
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._home: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def traces_url(self) -> str:
        """Where OTLP over HTTP takes spans."""
        return f"{self.url}/v1/traces"

    def __enter__(self) -> PhoenixServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> None:
        self._home = tempfile.TemporaryDirectory(prefix="phoenix-")
        self.port = _free_port()
        environment = {
            **os.environ,
            "PHOENIX_WORKING_DIR": self._home.name,
            "PHOENIX_HOST": HOST,
            "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(_free_port()),
            "PHOENIX_TELEMETRY_ENABLED": "false",
            "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
        }
        log = Path(self._home.name) / "server.log"
        with log.open("wb") as out:
            self._process = subprocess.Popen(
                [str(self.executable), "serve"],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=environment,
            )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code, printed = self._process.returncode, self.log()
                self.stop()
                raise RuntimeError(f"phoenix serve exited with {code}:\n{printed}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        printed = self.log()
        self.stop()
        raise RuntimeError(f"phoenix serve was not up in {self.start_timeout} s:\n{printed}")

    def log(self) -> str:
        """The end of what the server printed (for a failure's message)."""
        if self._home is None:
            return ""
        path = Path(self._home.name) / "server.log"
        return path.read_text(errors="replace")[-4000:] if path.is_file() else ""

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._home is not None:
            self._home.cleanup()
            self._home = None
