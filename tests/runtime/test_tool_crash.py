"""At most once for real: a child process running an agent on a SQLite file is killed with
SIGKILL after its tool's side effect and before the result is appended; an agent resuming
the stream does not run the tool again unless it is idempotent."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from contextfold.context.events import ContextAdded, ToolCallResult, ToolCallStarted
from contextfold.journal import open_journal
from contextfold.runtime.clients import FunctionModel
from contextfold.runtime.loop import Agent
from contextfold.runtime.tool_runs import NOT_RERUN
from tests.runtime.helpers import CALL, Charges, charge_tool, charging_model, events_of

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL"),
]

S = "agents/charging"
ROOT = Path(__file__).resolve().parents[2]  # the child imports tests.runtime.helpers from here

# The child: an agent whose charge tool writes its marker line, prints "charged" and blocks
# (the process is killed there: the side effect happened, its result was never appended).
CHILD = """
import asyncio, sys, threading
from pathlib import Path
sys.path.insert(0, sys.argv[3])
import contextfold as cf
from tests.runtime.helpers import charge_tool, charging_model

async def main(url, marker, s="agents/charging"):
    async with cf.open_journal(url) as journal:
        await journal.append(s, cf.system_prompt("You charge cards."))
        await journal.append(s, cf.ContextAdded(role="user", content="charge 100"))
        tool = charge_tool(Path(marker), block=threading.Event(), printed=True)
        await cf.Agent(journal, s, cf.FunctionModel(charging_model), tools=[tool]).run_until_idle()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def killed_while_charging(url: str, marker: Path) -> None:
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        CHILD,
        url,
        str(marker),
        str(ROOT),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        if line.strip() != b"charged":
            assert child.stderr is not None
            pytest.fail(f"child did not charge: {line!r} {await child.stderr.read()!r}")
    finally:
        if child.returncode is None:
            os.kill(child.pid, signal.SIGKILL)
        await child.wait()
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize("idempotent", [False, True])
async def test_a_tool_killed_mid_call_runs_again_only_when_idempotent(
    tmp_path: Path, idempotent: bool
) -> None:
    url, marker = f"sqlite:///{tmp_path / 'journal.db'}", tmp_path / "charges"
    await killed_while_charging(url, marker)
    [killed] = Charges(marker).lines()
    assert killed[:3] == [CALL.id, killed[1], "False"]

    async with open_journal(url) as journal:
        [(_, started)] = await events_of(journal, S, ToolCallStarted)
        assert started.tool_call_id == CALL.id
        assert await events_of(journal, S, ToolCallResult) == []

        tool = charge_tool(marker, idempotent=idempotent)
        agent = Agent(journal, S, FunctionModel(charging_model), tools=[tool])
        report = await agent.run_until_idle()
        assert report.status == "idle"
        [(_, result)] = await events_of(journal, S, ToolCallResult)
        answers = [e.content for _, e in await events_of(journal, S, ContextAdded)]
        charges = Charges(marker).lines()
        if idempotent:
            assert len(charges) == 2 and charges[1][1:3] == [killed[1], "True"]
            assert (result.content, result.is_error) == ("charged 100", False)
            assert answers[-1] == "tool said: charged 100"
        else:
            assert charges == [killed]  # "charged 100" once, not twice
            assert (result.content, result.is_error) == (NOT_RERUN, True)
            assert report.not_rerun == [CALL.id]
            assert answers[-1].startswith("tool said: error: this tool call may already have run")
