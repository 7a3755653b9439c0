"""The HTTP API shows each request's manifest: its hash with the body, the manifest itself
with ``view=manifest`` (null outside an event-driven turn)."""

from __future__ import annotations

import contextfold as cf
from contextfold.context.rebuild import RequestRecorded
from contextfold.server.streams import MANIFEST_HEADER, SHA256_HEADER
from tests.server.helpers import Running

STREAM = "chat/turns"


async def _session(journal: cf.Journal) -> tuple[list[RequestRecorded], int]:
    """One dispatched turn answered, then one plain request; the records, and the plain one."""
    await journal.append(STREAM, cf.system_prompt("You help in chat."), actor="agent")
    agent = cf.Agent(journal, STREAM, cf.FunctionModel(lambda request: "done"))
    dispatcher = cf.TurnDispatcher(journal, STREAM)
    event = cf.TurnEvent(kind="mention", actor="pk-morgan", event_id="e-1", content="Deploy?")
    await dispatcher.receive(event)
    await dispatcher.run(agent)
    await journal.append(STREAM, cf.ContextAdded(role="user", content="plain"), actor="user")
    plain = (await agent.run_until_idle()).requests[0]
    records = [
        stored.decode(RequestRecorded)
        async for stored in journal.read_all(STREAM, types=[RequestRecorded])
    ]
    return [r for r in records if isinstance(r, RequestRecorded)], plain


async def test_a_turns_request_shows_its_manifest(journal: cf.Journal, server: Running) -> None:
    records, plain = await _session(journal)
    turn = next(r for r in records if r.manifest is not None)
    assert turn.manifest is not None
    path = f"/v1/streams/{STREAM}/requests/{turn.request_offset}"
    body = await server.client.get(path)
    assert body.status_code == 200
    assert body.headers[SHA256_HEADER] == turn.sha256
    assert body.headers[MANIFEST_HEADER] == turn.manifest.hash
    shown = await server.client.get(path, params={"view": "manifest"})
    assert shown.status_code == 200
    assert shown.json() == {
        "stream": STREAM,
        "offset": turn.request_offset,
        "manifest": turn.manifest.model_dump(mode="json"),
    }
    assert cf.Manifest.model_validate(shown.json()["manifest"]) == turn.manifest

    outside = f"/v1/streams/{STREAM}/requests/{plain}"
    assert MANIFEST_HEADER not in (await server.client.get(outside)).headers
    none = await server.client.get(outside, params={"view": "manifest"})
    assert none.json()["manifest"] is None


async def test_an_unknown_view_is_refused(journal: cf.Journal, server: Running) -> None:
    records, _ = await _session(journal)
    path = f"/v1/streams/{STREAM}/requests/{records[0].request_offset}"
    refused = await server.client.get(path, params={"view": "headers"})
    assert refused.status_code == 400
    assert "unknown request view 'headers'" in refused.text
