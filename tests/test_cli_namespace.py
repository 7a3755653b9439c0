"""``--namespace`` on every command that reads a journal: what ``worker --namespace N``
serves can be listed, read, rebuilt and verified from the command line, and a name the
journal would refuse is a usage error naming the option."""

from __future__ import annotations

import asyncio
import json

import pytest
from typer.testing import CliRunner, Result

import contextfold as cf
from contextfold import cli
from contextfold.cli import URL_ENV, app

runner = CliRunner()
TEAM = "team-a"


def invoke(*args: str) -> Result:
    return runner.invoke(app, list(args), env={URL_ENV: ""})


@pytest.fixture(scope="module")
def journal_url(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, int]:
    """A journal whose stream ``chat`` (with one recorded request) is in namespace TEAM
    only; the URL and the request's offset."""
    url = f"sqlite:///{tmp_path_factory.mktemp('namespaces') / 'j.db'}"

    async def run() -> int:
        async with cf.open_journal(url, namespace=TEAM) as journal:
            await journal.append("chat", cf.system_prompt("Be brief."))
            await journal.append("chat", cf.ContextAdded(role="user", content="hello?"))
            agent = cf.Agent(journal, "chat", cf.FunctionModel(lambda request: "hi"))
            offset = (await agent.run_until_idle()).requests[0]
            await journal.with_namespace("default").append("other", cf.RawEvent("note", {}))
            return offset

    return url, asyncio.run(run())


def _commands(offset: int) -> list[list[str]]:
    return [
        ["streams"],
        ["events", "chat"],
        ["rebuild", "chat", str(offset)],
        ["ref", "chat@2"],
        ["verify", "chat"],
        ["stats", "chat"],
    ]


def test_every_read_command_takes_a_namespace() -> None:
    read = ("streams", "events", "rebuild", "ref", "verify", "stats", "worker_status")
    for name in read:
        assert "namespace" in cli.__dict__[name].__wrapped__.__annotations__, name


def test_each_read_command_reads_the_namespace_it_is_given(journal_url: tuple[str, int]) -> None:
    url, offset = journal_url
    for command in _commands(offset):
        result = invoke(*command, "--url", url, "--namespace", TEAM)
        assert result.exit_code == 0, (command, result.stdout, result.stderr)
    assert invoke("streams", "--url", url, "--namespace", TEAM).stdout.startswith("chat\t")
    events = invoke("events", "chat", "--url", url, "--namespace", TEAM).stdout.splitlines()
    assert json.loads(events[1])["payload"]["content"] == "hello?"
    verified = invoke("verify", "chat", "--url", url, "--namespace", TEAM, "--json")
    assert json.loads(verified.stdout)["requests"] == 1
    assert invoke("ref", "chat@2", "--url", url, "--namespace", TEAM).stdout == "hello?"


def test_without_it_the_default_namespace_is_read(journal_url: tuple[str, int]) -> None:
    url, offset = journal_url
    assert invoke("streams", "--url", url).stdout.startswith("other\t")
    for command in _commands(offset)[1:]:
        result = invoke(*command, "--url", url)
        assert result.exit_code == 1, (command, result.stdout)
        assert "no stream 'chat'" in result.stderr, (command, result.stderr)


def test_an_unknown_stream_names_the_namespace_searched(journal_url: tuple[str, int]) -> None:
    url, _ = journal_url
    result = invoke("verify", "chat", "--url", url, "--namespace", "nobody")
    assert result.exit_code == 1
    assert "no stream 'chat' in namespace 'nobody' of sqlite:///" in " ".join(result.stderr.split())
    empty = invoke("streams", "--url", url, "--namespace", "nobody")
    assert empty.exit_code == 0 and empty.stdout == ""
    assert "no streams in namespace 'nobody'" in empty.stderr


@pytest.mark.parametrize("bad", ["", "a\x01b", "x" * 513])
def test_a_namespace_the_journal_refuses_is_a_usage_error(
    journal_url: tuple[str, int], bad: str
) -> None:
    url, offset = journal_url
    for command in [*_commands(offset), ["worker", "status"]]:
        result = invoke(*command, "--url", url, "--namespace", bad)
        assert result.exit_code == 2, (command, result.stdout, result.stderr)
        lines = result.stderr.splitlines()
        assert len(lines) == 1, (command, result.stderr)
        assert lines[0].startswith("error: --namespace is no namespace: namespace ")
