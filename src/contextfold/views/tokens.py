"""Token counters. The default is a cheap, dependency-free estimate; tiktoken plugs in."""

from __future__ import annotations

import math
from typing import Any, Protocol

import orjson
from pydantic import BaseModel

from ..errors import ConfigurationError, UsageError
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

    Pass an encoding name or a ``tiktoken.Encoding`` object. Needs the ``tiktoken`` extra.
    tiktoken downloads a named encoding's file once and keeps it in its cache
    (``TIKTOKEN_CACHE_DIR``): offline, the file must be there already. Raises
    ConfigurationError for an unknown name or a file that could not be had.
    """

    def __init__(self, encoding: Any = "cl100k_base") -> None:
        try:
            import tiktoken
        except ImportError as exc:  # pragma: no cover - depends on extras
            raise ImportError(
                "TiktokenCounter needs tiktoken: pip install 'contextfold[tiktoken]'"
            ) from exc
        self.encoding = _named(tiktoken, encoding) if isinstance(encoding, str) else encoding

    def __call__(self, value: Any) -> int:
        text = value if isinstance(value, str) else json_text(value).decode()
        return len(self.encoding.encode(text, disallowed_special=()))


def _named(tiktoken: Any, name: str) -> Any:
    """The tiktoken encoding ``name``; its failures (a download's included: ``requests``
    raises OSErrors) as a ConfigurationError saying what to do."""
    try:
        return tiktoken.get_encoding(name)
    except ValueError as exc:  # an unknown name, or a download that failed its hash
        if name not in tiktoken.list_encoding_names():
            known = ", ".join(sorted(tiktoken.list_encoding_names()))
            raise ConfigurationError(
                f"TiktokenCounter: tiktoken has no encoding {name!r}; it knows {known}"
            ) from exc
        failure: Exception = exc
    except OSError as exc:
        failure = exc
    raise ConfigurationError(
        f"TiktokenCounter: the file of tiktoken encoding {name!r} is not in tiktoken's cache "
        f"and could not be downloaded ({type(failure).__name__}: {failure}). To work offline, "
        "set TIKTOKEN_CACHE_DIR to a directory holding it: call tiktoken.get_encoding("
        f"{name!r}) once with network access and the same TIKTOKEN_CACHE_DIR, then copy the "
        "directory; or pass a tiktoken.Encoding of your own"
    ) from failure
