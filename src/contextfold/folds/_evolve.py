"""Frozen pydantic models made from values that are already valid, for fold handlers.

A handler runs once per event of every read and append, and pydantic's own ways cost many
times the work itself: a model's constructor validates every field again (values taken
from a validated payload or state), and ``model_copy`` is Python code around a copy.
:func:`evolve` and :func:`construct` make the same instance directly. Only for models
without extra fields kept (``extra="allow"``) or private attributes; others go through
pydantic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["construct", "evolve"]

M = TypeVar("M", bound=BaseModel)

_new = object.__new__
_set_dict = BaseModel.__dict__["__dict__"].__set__
_set_fields_set = BaseModel.__dict__["__pydantic_fields_set__"].__set__
_set_extra = BaseModel.__dict__["__pydantic_extra__"].__set__
_set_private = BaseModel.__dict__["__pydantic_private__"].__set__

_PLAIN: dict[type[BaseModel], bool] = {}


def _plain(cls: type[BaseModel]) -> bool:
    """Whether an instance of ``cls`` is its field values and nothing else."""
    plain = _PLAIN.get(cls)
    if plain is None:
        plain = _PLAIN[cls] = (
            cls.model_config.get("extra") != "allow" and not cls.__private_attributes__
        )
    return plain


def evolve(model: M, changes: Mapping[str, Any]) -> M:
    """``model.model_copy(update=changes)``: the same fields (in the same order), fields
    set and equality, without pydantic's Python copy. ``changes`` names fields only and
    holds valid values: nothing is validated."""
    cls = type(model)
    # The cached answer first: one dict lookup, not a call, per evolve of a known class.
    if not (_PLAIN.get(cls) or _plain(cls)):
        return model.model_copy(update=changes)
    made: M = _new(cls)
    _set_dict(made, {**model.__dict__, **changes})
    _set_fields_set(made, model.__pydantic_fields_set__.union(changes))
    _set_extra(made, None)
    _set_private(made, None)
    return made


def construct(cls: type[M], values: dict[str, Any], fields_set: set[str]) -> M:
    """``cls(**values)`` for values validation would keep as they are: ``values`` holds
    every field in definition order (it becomes the instance's, so the caller's is given
    up), ``fields_set`` the names the constructor was given. Nothing is validated."""
    if not (_PLAIN.get(cls) or _plain(cls)):
        return cls.model_validate({name: values[name] for name in fields_set})
    made: M = _new(cls)
    _set_dict(made, values)
    _set_fields_set(made, fields_set)
    _set_extra(made, None)
    _set_private(made, None)
    return made
