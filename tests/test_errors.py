"""One error tree: no plain builtin raise in the package, the tree's drawing is its
classes, and the settings, arguments and misuses that used to raise builtins raise the
tree's classes (still catchable as the builtin)."""

from __future__ import annotations

import ast
import inspect
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import contextfold as cf
from contextfold import canonical, errors
from contextfold.render.envelope import Layer
from contextfold.runtime.tools import Tool
from contextfold.server.auth import token_writers

SRC = Path(__file__).resolve().parent.parent / "src" / "contextfold"
PLAIN = frozenset({"ValueError", "TypeError", "RuntimeError", "Exception"})
# pydantic turns a ValueError raised in a validator into its ValidationError: there a plain
# ValueError is the protocol, not a hole in the tree.
VALIDATORS = frozenset({"field_validator", "model_validator"})


def _decorator_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Attribute):
        return target.attr
    return target.id if isinstance(target, ast.Name) else ""


def plain_raises(root: Path = SRC) -> list[str]:
    """``path:line Name`` for each raise of a plain builtin outside a pydantic validator."""
    found: list[str] = []

    def visit(node: ast.AST, in_validator: bool, path: Path) -> None:
        for child in ast.iter_child_nodes(node):
            inside = in_validator
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                names = {_decorator_name(d) for d in child.decorator_list}
                inside = in_validator or bool(names & VALIDATORS)
            elif isinstance(child, ast.Raise) and child.exc is not None and not in_validator:
                exc = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(exc, ast.Name) and exc.id in PLAIN:
                    found.append(f"{path.relative_to(root.parent)}:{child.lineno} {exc.id}")
            visit(child, inside, path)

    for path in sorted(root.rglob("*.py")):
        visit(ast.parse(path.read_text(encoding="utf-8"), str(path)), False, path)
    return found


_TREE_LINE = re.compile(r"^(?P<indent>[ │├└─]*)(?P<name>[A-Z]\w*)(?: \((?P<builtin>\w+)\))?")


def drawn_tree(doc: str) -> dict[str, tuple[str | None, str | None]]:
    """``{class: (parent, builtin)}`` read from the box drawing in ``doc``."""
    drawn: dict[str, tuple[str | None, str | None]] = {}
    stack: list[tuple[int, str]] = []
    lines = doc.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "ContextfoldError")
    for line in lines[start:]:
        match = _TREE_LINE.match(line.strip("\n")[4:])
        if not line.strip() or match is None:
            break
        depth = len(match["indent"])
        while stack and stack[-1][0] >= depth:
            stack.pop()
        drawn[match["name"]] = (stack[-1][1] if stack else None, match["builtin"])
        stack.append((depth, match["name"]))
    return drawn


def _tree_classes() -> dict[str, type[BaseException]]:
    return {name: getattr(errors, name) for name in errors.__all__}


# -- the package ------------------------------------------------------------------------------


def test_no_plain_builtin_raise_outside_validators() -> None:
    assert plain_raises() == []


def test_every_exported_class_is_in_the_tree() -> None:
    for name, cls in _tree_classes().items():
        assert inspect.isclass(cls) and issubclass(cls, errors.ContextfoldError), name


def test_the_drawing_is_the_tree() -> None:
    assert errors.__doc__ is not None
    drawn = drawn_tree(errors.__doc__)
    classes = _tree_classes()
    assert set(drawn) == set(classes)
    for name, (parent, builtin) in drawn.items():
        cls = classes[name]
        tree_bases = [b for b in cls.__bases__ if issubclass(b, errors.ContextfoldError)]
        builtins = [b.__name__ for b in cls.__bases__ if b.__module__ == "builtins"]
        assert [b.__name__ for b in tree_bases] == ([] if parent is None else [parent]), name
        assert builtins == ([builtin] if builtin else ([] if parent else ["Exception"])), name


def test_the_public_api_carries_the_tree() -> None:
    # The errors a user of the top package handles are reachable from it.
    for name in ("ConfigurationError", "MissingSegmentError", "StrictJsonError", "UsageError"):
        assert getattr(cf, name) is getattr(errors, name)


# -- the checks catch what they are for -------------------------------------------------------


def test_a_plain_raise_is_found_and_a_validator_is_exempt(tmp_path: Path) -> None:
    root = tmp_path / "pkg"
    root.mkdir()
    (root / "m.py").write_text(
        "from pydantic import BaseModel, field_validator\n"
        "class M(BaseModel):\n"
        "    @field_validator('x')\n"
        "    @classmethod\n"
        "    def check(cls, v):\n"
        "        raise ValueError('pydantic protocol')\n"
        "def f():\n"
        "    raise TypeError\n"
        "def g():\n"
        "    raise RuntimeError('x') from None\n"
        "def h():\n"
        "    raise KeyError('a lookup stays a lookup')\n",
        encoding="utf-8",
    )
    assert plain_raises(root) == ["pkg/m.py:8 TypeError", "pkg/m.py:10 RuntimeError"]


def test_a_drawing_that_misplaces_a_class_is_read_as_drawn() -> None:
    doc = "x\n\n    ContextfoldError\n    ├── A (ValueError)\n    │   └── B\n    └── C\n"
    assert drawn_tree(doc) == {
        "ContextfoldError": (None, None),
        "A": ("ContextfoldError", "ValueError"),
        "B": ("A", None),
        "C": ("ContextfoldError", None),
    }


# -- what used to raise builtins --------------------------------------------------------------


def _varargs(*args: int) -> int:
    return len(args)


def _one() -> int:
    """One."""
    return 1


MISUSES: list[tuple[str, Callable[[], Any], type[Exception], type[Exception]]] = [
    ("view of no fold", lambda: cf.ContextView(object()), cf.UsageError, TypeError),  # type: ignore[arg-type]
    ("read-only state", lambda: cf.FrozenDict({"a": 1}).update(a=2), cf.UsageError, TypeError),
    ("tool *args", lambda: Tool.from_function(_varargs), cf.UsageError, TypeError),
    ("no tokens", lambda: cf.approx_tokens(object()), cf.UsageError, TypeError),
    ("cache size", lambda: cf.FoldCache(max_entries=0), cf.ConfigurationError, ValueError),
    ("turn budget", lambda: cf.TurnBudgets(user=0), cf.ConfigurationError, ValueError),
    ("two tools", lambda: cf.Toolbox([_one, _one]), cf.ConfigurationError, ValueError),
    ("empty token", lambda: token_writers(""), cf.ConfigurationError, ValueError),
    ("newest(-1)", lambda: cf.newest(-1), cf.InvalidInputError, ValueError),
    ("layer name", lambda: Layer.canonical("nope", "x"), cf.InvalidInputError, ValueError),
    ("not JSON", lambda: canonical.dumps({"a": object()}), cf.PayloadError, ValueError),
]


@pytest.mark.parametrize(
    ("call", "tree", "builtin"), [m[1:] for m in MISUSES], ids=[m[0] for m in MISUSES]
)
def test_a_misuse_raises_the_tree_class_and_its_builtin(
    call: Callable[[], Any], tree: type[Exception], builtin: type[Exception]
) -> None:
    with pytest.raises(tree) as caught:
        call()
    assert isinstance(caught.value, builtin) and str(caught.value)


def test_a_bad_budget_names_the_setting() -> None:
    view = cf.ContextView(cf.SegmentedFold("errs_view", data=str))
    with pytest.raises(cf.InvalidInputError, match="budget must be"):
        view(view.fold.initial_state(), budget=-1)


_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=10,
)


@given(value=_json, key=st.text(min_size=1, max_size=4), bad=st.sampled_from([math.nan, math.inf]))
def test_non_finite_json_anywhere_is_a_payload_error_naming_its_path(
    value: Any, key: str, bad: float
) -> None:
    with pytest.raises(cf.PayloadError) as caught:
        canonical.check_json_value({"data": value, key: [bad]}, where="payload")
    assert f"payload.{key}[0]" in str(caught.value)


class Pinged(cf.Event, type="errs/pinged"):
    n: int


async def test_a_handler_raising_missing_segment_leaves_the_event_out() -> None:
    counted: cf.Fold[tuple[int, ...]] = cf.Fold("errs_counted", initial=tuple)

    @counted.on(Pinged)
    def _(state: tuple[int, ...], ev: cf.Envelope[Pinged]) -> tuple[int, ...]:
        if ev.payload.n < 0:
            raise cf.MissingSegmentError(f"no segment for {ev.payload.n}")
        return (*state, ev.payload.n)

    async with cf.open_journal("memory://") as journal:
        await journal.append("s", [Pinged(n=1), Pinged(n=-1), Pinged(n=2)])
        assert await journal.fold(counted, "s") == (1, 2)
