"""Deep freezing of plain state: read state is shared by every reader, so it is immutable.

Lists and plain tuples become :class:`FrozenList` (a tuple), dicts :class:`FrozenDict` (a
dict that refuses writes), sets frozensets. Already-frozen values are not walked again: a
handler's ``(*state, new)`` only costs a type check per old item (run in C), plus the
freezing of what the handler added.
"""

from __future__ import annotations

from typing import Any, NoReturn

from pydantic import BaseModel

from ..errors import FoldDefinitionError, UsageError

__all__ = ["FrozenDict", "FrozenList", "freeze"]

_SCALARS = (str, int, float, bool, bytes, type(None))


def _refuse(*_: object, **__: object) -> NoReturn:
    raise UsageError("fold state is read-only: derive a new value instead of writing to it")


class FrozenDict(dict[str, Any]):
    """A dict whose contents cannot change after construction."""

    __slots__ = ()
    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


class FrozenList(tuple[Any, ...]):
    """A list or tuple frozen all the way down (marked, so it is not walked again)."""

    __slots__ = ()


_FROZEN = (*_SCALARS, FrozenDict, FrozenList, frozenset)
# Types whose values freeze returns as they are, without looking inside: cached per type,
# so checking the items of a container is one set lookup each.
_LEAVES: set[type] = set()


def _is_leaf(cls: type) -> bool:
    if issubclass(cls, _FROZEN):
        leaf = True
    elif issubclass(cls, BaseModel):
        leaf = bool(cls.model_config.get("frozen"))
    else:  # other tuple subclasses (named tuples) and objects are left as they are
        leaf = not (issubclass(cls, (dict, list, set)) or cls is tuple)
    if leaf:
        if len(_LEAVES) >= 4096:  # classes made at runtime must not pile up
            _LEAVES.clear()
        _LEAVES.add(cls)
    return leaf


def freeze(value: Any) -> Any:
    """Return ``value`` with every plain list, tuple, dict and set inside it frozen.

    Raises TypeError for a mutable (not frozen) pydantic model inside it.
    """
    cls = type(value)
    if cls in _LEAVES or _is_leaf(cls):
        return value
    # One C-level pass over the item types first: (*frozen, new) of known types is not walked.
    if isinstance(value, dict):
        if not _LEAVES.issuperset(map(type, value.values())):
            value = {k: v if type(v) in _LEAVES else freeze(v) for k, v in value.items()}
        return FrozenDict(value)
    if isinstance(value, (list, tuple)):
        if not _LEAVES.issuperset(map(type, value)):
            value = [v if type(v) in _LEAVES else freeze(v) for v in value]
        return FrozenList(value)
    if isinstance(value, set):
        return frozenset(value)
    raise FoldDefinitionError(
        f"{cls.__name__} is a mutable pydantic model in fold state: give it "
        "model_config = ConfigDict(frozen=True) so shared read state cannot be changed"
    )
