"""LangGraph is imported only by the integration, and its absence is a one-line hint."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

_PRIVATE = "contextfold.integrations._langgraph_"  # the modules the integration is made of


def test_without_langgraph_the_import_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(sys.modules):
        top = name.split(".")[0]
        ours = name.startswith(("contextfold.integrations.langgraph", _PRIVATE))
        if top in ("langgraph", "langchain_core") or ours:
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "langgraph", None)  # None: "not installed" to the importer
    monkeypatch.setitem(sys.modules, "langchain_core", None)
    with pytest.raises(ImportError) as raised:
        importlib.import_module("contextfold.integrations.langgraph")
    message = str(raised.value)
    assert "\n" not in message
    assert message.endswith("pip install 'contextfold[langgraph]'")


def test_importing_contextfold_does_not_import_langgraph() -> None:
    code = "import sys, contextfold; print(sorted(m for m in sys.modules if 'langgraph' in m))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
