"""A toolbox builds its tools' definitions (their JSON schemas) once, not per request."""

from __future__ import annotations

import pytest

from contextfold.runtime.tools import Tool, Toolbox


def read_file(path: str, limit: int = 100) -> str:
    """Read a file."""
    return path[:limit]


def test_definitions_are_built_once_and_describe_every_tool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    box = Toolbox([read_file])
    built: list[str] = []
    definition = Tool.definition

    def counting(self: Tool) -> object:
        built.append(self.name)
        return definition.__get__(self)

    monkeypatch.setattr(Tool, "definition", property(counting))
    first = box.definitions
    assert box.definitions is first
    assert built == ["read_file"]
    [only] = first
    assert only.name == "read_file" and only.description == "Read a file."
    assert set(only.arguments_schema()["properties"]) == {"path", "limit"}
