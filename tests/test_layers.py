"""The house rules of the package, checked from its source: the import layers, no import
cycle, no module over 600 lines.

Imports are read with ``ast``: module-level, function-level and ``TYPE_CHECKING`` ones
alike, since a lazy or type-only import against the order is the same coupling. The top
package's ``__init__.py`` is the re-export point and is exempt; everything else is
checked, and importing the top package from inside counts as importing its layer.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "contextfold"
SRC = Path(__file__).resolve().parent.parent / "src" / PACKAGE
MAX_LINES = 600

# DESIGN.md's layer order, top to bottom: a module imports only its own layer and those
# above it (a lower number).
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    # telemetry: the OpenTelemetry names and instruments every layer reports through
    ("events", frozenset({"events", "errors", "canonical", "_aio", "telemetry"})),
    ("store", frozenset({"store"})),
    ("folds", frozenset({"folds"})),
    ("views", frozenset({"views"})),
    ("journal", frozenset({"journal"})),
    ("wire", frozenset({"wire", "prices"})),
    ("context", frozenset({"context"})),
    ("render", frozenset({"render"})),
    ("transcript", frozenset({"transcript"})),
    ("runtime", frozenset({"runtime"})),
    ("integrations", frozenset({"integrations"})),
    (
        "surfaces",
        frozenset(
            {"", "__main__", "server", "cli", "_cli_support", "demo", "inspection", "timeline"}
            | {"examples"}
        ),
    ),
    ("testing", frozenset({"testing"})),
)
"""Each layer and the top-level names (modules or subpackages) in it; ``""`` is the top
package itself, the public API, which sits with the surfaces."""


def layer_of(module: str, layers: tuple[tuple[str, frozenset[str]], ...] = LAYERS) -> int:
    """The index of ``module``'s layer (a dotted name under the package); KeyError if none."""
    parts = module.split(".")
    head = parts[1] if len(parts) > 1 else ""
    for index, (_, names) in enumerate(layers):
        if head in names:
            return index
    raise KeyError(f"{module}: no layer in LAYERS holds {head!r}; add it to the table")


@dataclass(frozen=True, slots=True)
class Edge:
    """``source`` imports ``target`` at ``line``."""

    source: str
    target: str
    line: int


def module_files(root: Path = SRC, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join([package, *parts])] = path
    return found


def _resolve(name: str, modules: Mapping[str, Path]) -> str:
    """The longest prefix of ``name`` that is a module of the package."""
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts)


def imports_of(
    module: str, path: Path, modules: Mapping[str, Path], package: str = PACKAGE
) -> Iterator[Edge]:
    """Every import of a package module that ``module`` makes, wherever it stands."""
    is_package = path.name == "__init__.py"
    base = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.Import | ast.ImportFrom):
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            if node.level:
                anchor = base[: len(base) - node.level + 1]
                origin = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            # ``from pkg import sub`` imports the submodule when there is one.
            names = [f"{origin}.{alias.name}" for alias in node.names]
        for name in names:
            if name == package or name.startswith(f"{package}."):
                target = _resolve(name, modules)
                if target and target != module:
                    yield Edge(module, target, node.lineno)


def import_graph(root: Path = SRC, package: str = PACKAGE) -> list[Edge]:
    """All import edges between the package's modules, the top package's own left out."""
    modules = module_files(root, package)
    return [
        edge
        for module, path in modules.items()
        if module != package
        for edge in imports_of(module, path, modules, package)
    ]


def layer_violations(edges: list[Edge]) -> list[str]:
    """One line per import of a lower layer (a higher index) than the importer's."""
    found = []
    for edge in edges:
        source, target = layer_of(edge.source), layer_of(edge.target)
        if target > source:
            found.append(
                f"{edge.source}:{edge.line} imports {edge.target}: layer "
                f"{LAYERS[source][0]!r} may not import the lower layer {LAYERS[target][0]!r}"
            )
    return found


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph: dict[str, set[str]] = {}
    for edge in edges:
        graph.setdefault(edge.source, set()).add(edge.target)
        graph.setdefault(edge.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def oversize(root: Path = SRC, limit: int = MAX_LINES) -> list[str]:
    """Every module over ``limit`` lines, with its count."""
    found = []
    for path in sorted(root.rglob("*.py")):
        count = len(path.read_text(encoding="utf-8").splitlines())
        if count > limit:
            found.append(f"{path.relative_to(root.parent)}: {count} lines (limit {limit})")
    return found


# --- the package itself ---


def test_every_module_has_a_layer() -> None:
    for module in module_files():
        layer_of(module)  # raises naming the module when the table misses it


def test_no_import_against_the_layer_order() -> None:
    assert layer_violations(import_graph()) == []


def test_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_no_module_over_the_size_limit() -> None:
    assert oversize() == []


# --- the checks catch what they are for ---


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    root = tmp_path / PACKAGE
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_a_lazy_or_type_only_import_against_the_order_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "wire.py": "",
            "journal/__init__.py": "",
            "journal/journal.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from ..wire import X\n"
                "def f():\n"
                "    from contextfold.context import rebuild\n"
            ),
            "context/__init__.py": "",
            "context/rebuild.py": "from ..journal.journal import f\n",
        },
    )
    found = layer_violations(import_graph(root))
    assert len(found) == 2
    assert found[0].startswith("contextfold.journal.journal:3 imports contextfold.wire")
    assert found[1].startswith("contextfold.journal.journal:5 imports contextfold.context.rebuild")


def test_an_import_of_the_top_package_from_below_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"store/__init__.py": "", "store/base.py": "import contextfold\n"})
    assert layer_violations(import_graph(root)) == [
        "contextfold.store.base:1 imports contextfold: layer 'store' may not import the "
        "lower layer 'surfaces'"
    ]


def test_a_cycle_through_a_lazy_import_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "render/__init__.py": "from . import neutral, chat\n",
            "render/neutral.py": "def pick():\n    from .chat import render\n",
            "render/chat.py": "from .neutral import pick\n",
            "render/other.py": "from .chat import pick\n",
        },
    )
    assert cycles(import_graph(root)) == [["contextfold.render.chat", "contextfold.render.neutral"]]


def test_from_package_import_submodule_is_an_edge_to_the_submodule(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {"views/__init__.py": "", "views/view.py": "", "runtime.py": "from .views import view\n"},
    )
    assert import_graph(root) == [Edge("contextfold.runtime", "contextfold.views.view", 1)]


def test_a_module_without_a_layer_is_named() -> None:
    with pytest.raises(KeyError, match="'nowhere'"):
        layer_of("contextfold.nowhere.thing")


def test_an_oversize_module_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"big.py": "x = 1\n" * 7, "small.py": "x = 1\n" * 6})
    assert oversize(root, limit=6) == ["contextfold/big.py: 7 lines (limit 6)"]
