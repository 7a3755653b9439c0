"""``contextfold worker`` (a real child process, stopped by SIGTERM) and ``worker status``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from contextfold.cli import app
from contextfold.journal import open_journal
from contextfold.runtime.lease import claim_lease, lease_table
from tests.runtime.helpers import answered, eventually, new_agent_stream

APP = """
import contextfold as cf

model = cf.FunctionModel(lambda request: "answered by the worker")


def build(journal, stream):
    return cf.Agent(journal, stream, model)
"""

COMMAND = ["--namespace", "tenant", "--app", "agents_app:build", "--concurrency", "2"]


def test_worker_commands_have_help() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["worker", "--help"])
    assert result.exit_code == 0
    for option in ("--url", "--namespace", "--app", "--concurrency", "--ttl", "status"):
        assert option in result.output
    status = runner.invoke(app, ["worker", "status", "--help"])
    assert status.exit_code == 0 and "--json" in status.output


def test_worker_needs_an_app(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["worker", "--url", f"sqlite:///{tmp_path / 'j.db'}"])
    assert result.exit_code == 2
    assert "--app is required" in result.output


@pytest.mark.parametrize(
    ("spec", "says"),
    [("nocolon", "module:factory"), ("no_such_module_here:build", "cannot import")],
)
def test_a_bad_app_is_one_line(tmp_path: Path, spec: str, says: str) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    result = CliRunner().invoke(app, ["worker", "--url", url, "--app", spec])
    assert result.exit_code == 1
    assert says in result.output and "Traceback" not in result.output


def test_status_shows_who_holds_which_stream(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"

    async def seed() -> None:
        async with open_journal(url, namespace="tenant") as journal:
            await new_agent_stream(journal, "chat/a")
            await claim_lease(journal, "chat/a", holder="host:1:abc", ttl=60)
            await new_agent_stream(journal, "chat/b")
            await (await claim_lease(journal, "chat/b", holder="host:2:def", ttl=60)).release()

    asyncio.run(seed())
    runner = CliRunner()
    result = runner.invoke(app, ["worker", "status", "--url", url, "--namespace", "tenant"])
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert [row[:3] for row in rows] == [
        ["chat/a", "host:1:abc", "held"],
        ["chat/b", "host:2:def", "released"],
    ]
    as_json = runner.invoke(
        app, ["worker", "status", "--url", url, "--namespace", "tenant", "--json"]
    )
    document = json.loads(as_json.stdout)
    assert [lease["state"] for lease in document["leases"]] == ["held", "released"]
    empty = runner.invoke(app, ["worker", "status", "--url", url])  # the default namespace
    assert empty.exit_code == 0 and empty.stdout == ""
    missing = runner.invoke(app, ["worker", "status", "--url", f"sqlite:///{tmp_path / 'x.db'}"])
    assert missing.exit_code == 1 and not (tmp_path / "x.db").exists()


async def test_the_worker_process_serves_until_sigterm_and_hands_leases_back(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    (tmp_path / "agents_app.py").write_text(APP)
    streams = [f"chat/{n}" for n in range(4)]
    async with open_journal(url, namespace="tenant") as journal:
        for stream in streams:
            await new_agent_stream(journal, stream)
        log = (tmp_path / "worker.log").open("wb")
        child = subprocess.Popen(
            [sys.executable, "-m", "contextfold", "worker", "--url", url, *COMMAND],
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        try:

            async def all_answered() -> bool:
                assert child.poll() is None, (tmp_path / "worker.log").read_text()
                return all([await answered(journal, s) for s in streams])

            await eventually(all_answered, what="the worker answered every stream")
            child.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(child.wait, 30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
            log.close()
        output = (tmp_path / "worker.log").read_text()
        assert code == 0, output
        assert "serving namespace 'tenant'" in output and "worker stopped" in output
        assert {r.state for r in await lease_table(journal)} == {"released"}
