"""The public surface: ``contextfold.__all__`` is sorted, complete and importable, and every
module declares an ``__all__`` whose names exist."""

from __future__ import annotations

import importlib
import pkgutil

import contextfold as cf


def _modules() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(cf.__path__, prefix="contextfold."):
        if info.name.endswith("__main__") or ".server" in info.name:
            continue
        names.append(info.name)
    return names


def _isort_key(name: str) -> tuple[int, str]:
    # ruff's RUF022 order: CONSTANTS, then Classes, then functions, each alphabetical.
    kind = 0 if name.isupper() and len(name) > 1 else 1 if name[0].isupper() else 2
    return kind, name


def test_all_is_sorted_and_importable() -> None:
    assert cf.__all__ == sorted(cf.__all__, key=_isort_key)
    assert len(set(cf.__all__)) == len(cf.__all__)
    for name in cf.__all__:
        assert hasattr(cf, name), name


def test_all_lists_every_public_reexport() -> None:
    public = {n for n in vars(cf) if not n.startswith("_")}
    modules = {n for n, v in vars(cf).items() if type(v).__name__ == "module"}
    assert public - modules - {"annotations"} == set(cf.__all__)


def test_every_module_declares_all() -> None:
    for name in _modules():
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        assert exported is not None, f"{name} has no __all__"
        for item in exported:
            assert hasattr(module, item), f"{name}.__all__ names {item!r}, which it lacks"


def test_the_version_is_the_installed_distributions() -> None:
    from importlib import metadata

    from packaging.version import Version

    assert cf.__version__ == metadata.version("contextfold")
    assert str(Version(cf.__version__)) == cf.__version__  # a PEP 440 version
