"""Token counters. The default is a cheap, dependency-free estimate; tiktoken plugs in."""

from __future__ import annotations

import math
from typing import Any, Protocol

import orjson
from pydantic import BaseModel

from ..errors import UsageError
from ..folds.segmented import Segment

__all__ = ["TiktokenCounter", "TokenCounter", "approx_tokens", "json_text"]


class TokenCounter(Protocol):
    def __call__(self, value: Any, /) -> float: ...


def _default(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, Segment):
        return {"id": value.id, "data": value.data}
    if isinstance(value, (tuple, frozenset, set)):
        return list(value)
    if hasattr(value, "tolist"):  # a persistent vector
        return value.tolist()
    raise UsageError(f"cannot count tokens of {type(value).__name__}")


def json_text(value: Any) -> bytes:
    """The JSON a counter measures: sorted keys, compact (models and segments included)."""
    if isinstance(value, BaseModel):
        return value.model_dump_json().encode()
    try:
        return orjson.dumps(value, default=_default, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError as exc:  # it wraps what _default raised
        raise UsageError(f"cannot count the tokens of this {type(value).__name__}: {exc}") from exc


def approx_tokens(value: Any) -> int:
    """⌈length of the value's JSON / 4⌉: a cheap heuristic, the default counter."""
    return math.ceil(len(json_text(value)) / 4)


class TiktokenCounter:
    """A real tokenizer: counts tokens of the value's JSON with a tiktoken encoding.

    Pass an encoding name (it must be available offline, in tiktoken's cache) or an
    ``tiktoken.Encoding`` object. Needs the ``tiktoken`` extra.
    """

    def __init__(self, encoding: Any = "cl100k_base") -> None:
        try:
            import tiktoken
        except ImportError as exc:  # pragma: no cover - depends on extras
            raise ImportError(
                "TiktokenCounter needs tiktoken: pip install 'contextfold[tiktoken]'"
            ) from exc
        self.encoding = tiktoken.get_encoding(encoding) if isinstance(encoding, str) else encoding

    def __call__(self, value: Any) -> int:
        text = value if isinstance(value, str) else json_text(value).decode()
        return len(self.encoding.encode(text, disallowed_special=()))
