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
    rebuilt = await cf.rebuild_request(journal, "s", report.requests[0])
    assert rebuilt.body == cf.render_request(seen[0], "openai-chat").body
    await journal.close()


async def test_the_scheduler_classifies_by_the_logged_header_not_the_live_registry() -> None:
    """A warm read and a cold rebuild agree whatever the process registered meanwhile: the
    scheduler trusts the extensions of the latest agent-written request header only."""
    from contextfold.folds.reader import FoldCache
    from contextfold.runtime.scheduling import Scheduler

    journal = cf.open_journal("memory://")
    bot = cf.Actor(type="sched-ci-bot")
    await journal.append("s", cf.system_prompt("Be brief."))
    await journal.append("s", cf.ContextAdded(role="developer", actor=bot, content="build red"))
    warm = await journal.fold(Scheduler, "s")
    assert [(t.offset, t.kind) for t in warm.pending] == [(2, "integration")]
    register_actor_type("sched-ci-bot", trusted=True)
    cold = cf.Journal(journal.store, fold_cache=FoldCache())
    for j in (journal, cold):
        assert [(t.offset, t.kind) for t in (await j.fold(Scheduler, "s")).pending] == [
            (2, "integration")
        ]
    # A request made now logs the type as trusted: later items from it are agent feedback.
    await cf.Agent(journal, "s", cf.FunctionModel(lambda request: "ok")).run_until_idle()
    appended = await journal.append(
        "s", cf.ContextAdded(role="developer", actor=bot, content="build green")
    )
    cold = cf.Journal(journal.store, fold_cache=FoldCache())
    for j in (journal, cold):
        kinds = [(t.offset, t.kind) for t in (await j.fold(Scheduler, "s")).pending]
        assert kinds == [(appended.first_position, "feedback")]
    # ...but a header another writer logged trusts nothing.
    header = cf.RequestHeader(
        transport="openai-chat", model="m", max_tokens=8, trusted_actor_types=("evil-bot",)
    )
    await journal.append("s", cf.LlmRequestRequested(header=header), actor="webhook")
    late = await journal.append(
        "s", cf.ContextAdded(role="developer", actor=cf.Actor(type="evil-bot"), content="x")
    )
    cold = cf.Journal(journal.store, fold_cache=FoldCache())
    for j in (journal, cold):
        by_offset = {t.offset: t.kind for t in (await j.fold(Scheduler, "s")).pending}
        assert by_offset == {late.first_position: "integration"}
        state = await j.fold(Scheduler, "s")
        assert "sched-ci-bot" in state.trusted and "evil-bot" not in state.trusted
    await journal.close()
