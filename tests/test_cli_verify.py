"""``contextfold verify`` streams: one line per drift as it is found, every drift in
``--json`` with its count and the position of its record, exit status 1 on any."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner, Result

import contextfold as cf
from contextfold.cli import URL_ENV, app

STREAM = "chat"
WRONG = "0" * 64


def _verify(*args: str) -> Result:
    return CliRunner().invoke(app, ["verify", STREAM, *args], env={URL_ENV: ""})


def _tampered(url: str) -> tuple[list[int], list[int]]:
    """Three answered requests, then a record with a wrong hash naming the first and one
    naming the third: the requests, and the positions of the wrong records."""

    async def run() -> tuple[list[int], list[int]]:
        async with cf.open_journal(url) as journal:
            await journal.append(STREAM, cf.system_prompt("Be brief."))
            agent = cf.Agent(journal, STREAM, cf.FunctionModel(lambda request: "hi"))
            requests = []
            for turn in range(3):
                await journal.append(STREAM, cf.ContextAdded(role="user", content=f"q{turn}?"))
                requests.extend((await agent.run_until_idle()).requests)
            wrong = []
            for offset in (requests[0], requests[2]):
                record = cf.RequestRecorded(
                    request_offset=offset, transport="openai-chat", sha256=WRONG, size=1
                )
                wrong.append((await journal.append(STREAM, record)).first_position)
            return requests, wrong

    return asyncio.run(run())


def test_verify_prints_each_drift_and_lists_them_all_in_json(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'j.db'}"
    requests, wrong = _tampered(url)
    shown = _verify("--url", url)
    assert shown.exit_code == 1
    # The newest request's wrong record is checked where it is read, the first's after.
    assert shown.stdout.splitlines() == [
        f"@{requests[2]}: bytes differ",
        f"@{requests[0]}: bytes differ",
    ]
    as_json = _verify("--url", url, "--json")
    assert as_json.exit_code == 1
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and report["requests"] == 3 and report["drift_count"] == 2
    assert [(d["request_offset"], d["recorded"], d["recorded_at"]) for d in report["drifts"]] == [
        (requests[0], WRONG, wrong[0]),
        (requests[2], WRONG, wrong[1]),
    ]
    with cf.open_journal_sync(url) as journal:
        rebuilt = [journal.run(cf.rebuild_request, STREAM, n).sha256 for n in requests]
    assert [d["rebuilt"] for d in report["drifts"]] == [rebuilt[0], rebuilt[2]]
