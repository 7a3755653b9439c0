"""Frozen pydantic models made from values that are already valid, for fold handlers.

Both go through pydantic's public API, so a pydantic release cannot break them: a few
microseconds each, once per event a handler folds, which a model call dwarfs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel

__all__ = ["construct", "evolve"]

M = TypeVar("M", bound=BaseModel)


def evolve(model: M, changes: Mapping[str, Any]) -> M:
    """``model.model_copy(update=changes)``: ``changes`` names fields only and holds valid
    values (nothing is validated)."""
    return model.model_copy(update=changes)


def construct(cls: type[M], values: Mapping[str, Any], fields_set: set[str]) -> M:
    """``cls(**values)`` of the names in ``fields_set`` (the names the constructor was given;
    ``values`` may hold every field, the others at their defaults). Raises pydantic's
    ValidationError for a value the schema refuses."""
    return cls.model_validate({name: values[name] for name in fields_set})
