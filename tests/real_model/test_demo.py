"""`contextfold demo` on a local server (``OPENAI_BASE_URL``), as the README tells users to
run it: it names the server, takes the window it is given, compacts inside it, and every
request it made rebuilds byte for byte."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from contextfold import open_journal
from contextfold.context.events import ContextAdded, LlmResponse
from contextfold.context.rebuild import verify_requests
from tests.llamaserver import LlamaServer


async def test_the_demo_runs_on_a_local_server_and_compacts_in_its_window(
    llama_server: LlamaServer, tmp_path: Path
) -> None:
    db = tmp_path / "demo.db"
    env = {
        **os.environ,
        "OPENAI_BASE_URL": llama_server.openai_url,
        "CONTEXTFOLD_OPENAI_MODEL": llama_server.model,
        "CONTEXTFOLD_CONTEXT_WINDOW": "4096",
    }
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "contextfold", "demo", "--db", str(db)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"at {llama_server.openai_url}" in done.stdout
    stream = "demo/coding-session"
    async with open_journal(f"sqlite:///{db}") as journal:
        answers = [e async for e in journal.read_all(stream, types=[LlmResponse])]
        summaries = [
            stored
            async for stored in journal.read_all(stream, types=[ContextAdded])
            if stored.decode(ContextAdded).compaction is not None  # type: ignore[attr-defined]
        ]
        assert answers and summaries, "the demo compacted inside the 4,096-token window"
        assert await verify_requests(journal, stream) == ()
