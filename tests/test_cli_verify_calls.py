"""``contextfold verify`` and ``rebuild`` on a framework's call records: every request
rebuilt to its recorded digest and every recorded view recomputed, each problem printed
with its position (exit status 1), a stream holding both an agent's requests and call
records verified for both, and a call request rebuilt as the JSON its digest covers."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

import contextfold as cf
from contextfold.canonical import sha256_hex
from contextfold.cli import URL_ENV, app
from contextfold.context.call_records import call_body, read_calls
from contextfold.context.calls import CallRequested
from tests.call_streams import FRAMEWORKS, Session, record_session

STREAM = "framework"


def _invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), env={URL_ENV: ""})


def _recorded(url: str, framework: str = "langchain", *, agent: bool = False) -> Session:
    async def run() -> Session:
        async with cf.open_journal(url) as journal:
            if agent:  # the same stream also holds a contextfold agent's requests
                await journal.append(STREAM, cf.system_prompt("Be brief."))
                await journal.append(STREAM, cf.ContextAdded(role="user", content="hi"))
                bot = cf.Agent(journal, STREAM, cf.FunctionModel(lambda request: "hello"))
                await bot.run_until_idle()
            return await record_session(journal, STREAM, framework, compact_at=80)

    return asyncio.run(run())


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_verify_says_how_many_framework_requests_rebuild(tmp_path: Path, framework: str) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    session = _recorded(url, framework)
    shown = _invoke("verify", STREAM, "--url", url)
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines() == [
        f"all {len(session.requests)} framework request(s) of {STREAM!r} ({framework}) rebuild "
        f"to their recorded digest, and the {len(session.requests)} view(s) that chose their "
        "messages recompute"
    ]
    report = json.loads(_invoke("verify", STREAM, "--url", url, "--json").stdout)
    assert report["ok"] is True and report["requests"] == 0
    assert report["framework_requests"] == report["framework_views"] == len(session.requests)
    assert report["frameworks"] == [framework]
    assert report["framework_problems"] == [] and report["framework_problem_count"] == 0


def test_each_problem_is_printed_with_its_position(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    session = _recorded(url)

    async def forge() -> int:
        async with cf.open_journal(url) as journal:
            calls = await read_calls(journal, STREAM)
            sent = calls.requests[session.requests[-1]]
            assert sent.view is not None
            # The newest request, recorded again sending one message more than its view.
            forged = sent.model_copy(update={"messages": (sent.view.history[0], *sent.messages)})
            return (await journal.append(STREAM, forged)).first_position

    at = asyncio.run(forge())
    shown = _invoke("verify", STREAM, "--url", url)
    assert shown.exit_code == 1
    assert shown.stdout.splitlines() == [
        f"@{at}: the request rebuilt from the journal does not have its recorded digest",
        f"@{at}: its messages are not the ones its view chooses",
    ]
    as_json = _invoke("verify", STREAM, "--url", url, "--json")
    assert as_json.exit_code == 1
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and report["framework_problem_count"] == 2
    assert [p["position"] for p in report["framework_problems"]] == [at, at]


def test_a_stream_with_both_kinds_of_requests_verifies_both(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    session = _recorded(url, "adk", agent=True)
    shown = _invoke("verify", STREAM, "--url", url)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0] == f"all 1 recorded request(s) of {STREAM!r} rebuild byte for byte"
    assert lines[1].startswith(f"all {len(session.requests)} framework request(s)")
    report = json.loads(_invoke("verify", STREAM, "--url", url, "--json").stdout)
    assert report["ok"] and report["requests"] == 1
    assert report["framework_requests"] == len(session.requests)


def test_rebuild_prints_a_framework_request(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    session = _recorded(url, "openai-agents")
    offset = session.requests[1]

    async def expected() -> tuple[bytes, CallRequested]:
        async with cf.open_journal(url) as journal:
            calls = await read_calls(journal, STREAM)
            return call_body(calls, offset), calls.requests[offset]

    body, sent = asyncio.run(expected())
    printed = _invoke("rebuild", STREAM, str(offset), "--url", url)
    assert printed.exit_code == 0, printed.output
    assert printed.stdout == body.decode() + "\n"
    as_json = json.loads(_invoke("rebuild", STREAM, str(offset), "--url", url, "--json").stdout)
    assert as_json["framework"] == "openai-agents" and as_json["model"] == sent.model
    assert as_json["sha256"] == as_json["recorded_sha256"] == sha256_hex(body) == sent.sha256
    assert as_json["size"] == len(body) and as_json["manifest"] is None
    assert as_json["body"] == json.loads(body)
    assert _invoke("rebuild", STREAM, str(offset), "--url", url, "--manifest").stdout == "null\n"
    # An answer is no request: the error names the offset as before.
    wrong = _invoke("rebuild", STREAM, str(session.answers[0]), "--url", url)
    assert wrong.exit_code == 1 and f"position {session.answers[0]}" in wrong.stderr
