"""The runtime records the process's trusted actor extensions in each request header, so
a rebuild in any process renders the same roles."""

from __future__ import annotations

import contextfold as cf
from contextfold.context.trust import register_actor_type


async def test_registered_trusted_types_are_recorded_and_rendered_from_the_header() -> None:
    register_actor_type("crm-sync", trusted=True)
    journal = cf.open_journal("memory://")
    seen: list[cf.NeutralRequest] = []

    def model(request: cf.NeutralRequest) -> str:
        seen.append(request)
        return "ok"

    await journal.append("s", cf.system_prompt("Be brief."))
    await journal.append(
        "s", cf.ContextAdded(role="developer", actor=cf.Actor(type="crm-sync"), content="note")
    )
    await journal.append("s", cf.ContextAdded(role="user", content="go?"))
    report = await cf.Agent(journal, "s", cf.FunctionModel(model)).run_until_idle()
    state = await journal.fold(cf.AgentContext, "s")
    assert state.header is not None and "crm-sync" in state.header.trusted_actor_types
    note = next(m for m in seen[0].messages if m.content.endswith("note"))
    assert note.role == "developer"  # trusted here, and recorded as trusted
    rebuilt = await journal.rebuild_request("s", report.requests[0])
    assert rebuilt.body == cf.render_request(seen[0], "openai-chat").body
    await journal.close()
