"""``contextfold rebuild`` shows a request's manifest: in ``--json`` and alone with
``--manifest`` (null outside an event-driven turn), recomputed from the journal."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

import contextfold as cf
from contextfold.cli import URL_ENV, app

STREAM = "chat"


async def _session(url: str) -> tuple[int, cf.Manifest, int]:
    async with cf.open_journal(url) as journal:
        await journal.append(STREAM, cf.system_prompt("You help in chat."), actor="agent")
        agent = cf.Agent(journal, STREAM, cf.FunctionModel(lambda request: "done"))
        dispatcher = cf.TurnDispatcher(journal, STREAM)
        await dispatcher.receive(
            cf.TurnEvent(kind="mention", actor="pk-morgan", event_id="e-1", content="Deploy?")
        )
        [turn] = await dispatcher.run(agent)
        [offset] = (await journal.fold(cf.AgentContext, STREAM)).request_offsets
        await journal.append(STREAM, cf.ContextAdded(role="user", content="plain"), actor="user")
        plain = (await agent.run_until_idle()).requests[0]
        return offset, turn.compiled.manifest, plain


def _rebuild(*args: str) -> str:
    done = CliRunner().invoke(app, ["rebuild", *args], env={URL_ENV: ""})
    assert done.exit_code == 0, (done.stdout, done.stderr)
    return done.stdout


def test_rebuild_shows_the_manifest(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'journal.db'}"
    offset, manifest, plain = asyncio.run(_session(url))
    shown = json.loads(_rebuild(STREAM, str(offset), "--url", url, "--manifest"))
    assert shown == manifest.model_dump(mode="json")
    assert shown["hash"] == manifest.hash and shown["schemaVersion"] == 1
    full = json.loads(_rebuild(STREAM, str(offset), "--url", url, "--json"))
    assert full["manifest"] == shown and "body" in full
    assert json.loads(_rebuild(STREAM, str(plain), "--url", url, "--manifest")) is None
    assert json.loads(_rebuild(STREAM, str(plain), "--url", url, "--json"))["manifest"] is None
