"""Deep freezing of plain state: read state is shared by every reader, so it is immutable.

Lists become :class:`FrozenList` (a tuple), dicts :class:`FrozenDict` (a dict that refuses
writes), sets frozensets. Already-frozen containers are not walked again, so freezing the
output of a handler only costs what the handler added.
"""

from __future__ import annotations

from typing import Any, NoReturn

from pydantic import BaseModel

__all__ = ["FrozenDict", "FrozenList", "freeze"]

_SCALARS = (str, int, float, bool, bytes, type(None))


def _refuse(*_: object, **__: object) -> NoReturn:
    raise TypeError("fold state is read-only: derive a new value instead of writing to it")


class FrozenDict(dict[str, Any]):
    """A dict whose contents cannot change after construction."""

    __slots__ = ()
    __setitem__ = __delitem__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse
    __ior__ = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items())))


class FrozenList(tuple[Any, ...]):
    """A list frozen into a tuple (marked, so it is not walked again)."""

    __slots__ = ()


def freeze(value: Any) -> Any:
    """Return ``value`` with every plain list, dict and set inside it frozen."""
    if isinstance(value, (*_SCALARS, FrozenDict, FrozenList, frozenset)):
        return value
    if isinstance(value, dict):
        return FrozenDict({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list):
        return FrozenList(freeze(v) for v in value)
    if isinstance(value, tuple) and type(value) is tuple:
        frozen = tuple(freeze(v) for v in value)
        return value if all(a is b for a, b in zip(frozen, value, strict=True)) else frozen
    if isinstance(value, (set, frozenset)):
        return frozenset(value)
    if isinstance(value, BaseModel) and not value.model_config.get("frozen"):
        raise TypeError(
            f"{type(value).__name__} is a mutable pydantic model in fold state: give it "
            "model_config = ConfigDict(frozen=True) so shared read state cannot be changed"
        )
    return value
