"""Prices: what a model's tokens cost, so traces, stats and spans can show money.

By default prices come from ``genai-prices``' catalogue, maintained upstream and read
offline from the installed package (:class:`CataloguePrices`). A user's own table
overrides it model by model: a JSON file (``{"gpt-4.1": {"input": 2.0, "cached_input":
0.5, "output": 8.0}}``, US dollars per million tokens) named by ``--prices`` or the
``CONTEXTFOLD_PRICES`` environment variable. In a table a model matches its own name,
else the longest key it starts with (``claude-haiku-4-5`` prices
``claude-haiku-4-5-20251001``). A model neither knows has no cost (None, shown as
unknown), never zero.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import InvalidInputError
from .wire import Usage

__all__ = [
    "PRICES_ENV",
    "CataloguePrices",
    "Price",
    "PriceTable",
    "Prices",
    "Pricing",
    "default_prices",
    "load_prices",
    "prices_from_env",
]

PRICES_ENV = "CONTEXTFOLD_PRICES"
"""The environment variable naming a price table file."""

_PER_TOKEN = 1 / 1_000_000


class Pricing(Protocol):
    """Anything that prices a model's usage: a :class:`PriceTable`, :class:`Prices`."""

    def cost(self, model: str | None, usage: Usage | None) -> float | None:
        """What ``usage`` of ``model`` cost in US dollars; None when unknown."""
        ...


class Price(BaseModel):
    """One model's prices in US dollars per million tokens.

    ``cached_input`` prices input read from the provider's prompt cache and
    ``cache_write`` input written to it; each is priced as ``input`` when not given.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(default=None, ge=0)
    cache_write: float | None = Field(default=None, ge=0)

    @field_validator("input", "output", "cached_input", "cache_write")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("a price must be a finite number")
        return value

    def cost(self, usage: Usage) -> float:
        """The dollars ``usage`` cost: uncached input, cache reads, cache writes and output,
        each at its price (``usage.input_tokens`` is the whole prompt, cache parts included)."""
        cached = usage.cached_input_tokens or 0
        written = usage.cache_write_tokens or 0
        fresh = max(usage.input_tokens - cached - written, 0)
        read_price = self.input if self.cached_input is None else self.cached_input
        write_price = self.input if self.cache_write is None else self.cache_write
        dollars = (
            fresh * self.input
            + cached * read_price
            + written * write_price
            + usage.output_tokens * self.output
        )
        return dollars * _PER_TOKEN


class PriceTable(BaseModel):
    """Prices by model name (see the module docstring for the matching rule)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prices: Mapping[str, Price] = Field(default_factory=dict)

    def price_of(self, model: str | None) -> Price | None:
        """The price of ``model``: its own entry, else the longest key it starts with."""
        if not model:
            return None
        found = self.prices.get(model)
        if found is not None:
            return found
        keys = [key for key in self.prices if key and model.startswith(key)]
        return self.prices[max(keys, key=len)] if keys else None

    def cost(self, model: str | None, usage: Usage | None) -> float | None:
        """What ``usage`` of ``model`` cost in dollars; None when either is unknown."""
        price = self.price_of(model)
        if price is None or usage is None:
            return None
        return price.cost(usage)


def load_prices(path: str | Path) -> PriceTable:
    """The price table in the JSON file at ``path`` (an object of model names to prices).

    Raises InvalidInputError naming the file and the entry at fault.
    """
    where = str(path)
    try:
        data = orjson.loads(Path(path).read_bytes())
    except OSError as exc:
        raise InvalidInputError(f"price table {where!r} cannot be read: {exc.strerror}") from None
    except orjson.JSONDecodeError as exc:
        raise InvalidInputError(f"price table {where!r} is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidInputError(
            f"price table {where!r} must be a JSON object of model names to prices, "
            'e.g. {"gpt-4.1": {"input": 2.0, "output": 8.0}}'
        )
    try:
        return PriceTable(prices=data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"][1:])
        raise InvalidInputError(
            f"price table {where!r}: {field or 'an entry'}: {error['msg']} (prices are US "
            "dollars per million tokens: input, output, cached_input, cache_write)"
        ) from None


def prices_from_env(environ: Mapping[str, str] = os.environ) -> PriceTable | None:
    """The table named by :data:`PRICES_ENV`, or None when it names none."""
    path = environ.get(PRICES_ENV, "").strip()
    return load_prices(path) if path else None


class CataloguePrices:
    """Prices from ``genai-prices``' catalogue (the snapshot its installed release holds:
    no network). A model it does not know, or usage it cannot price, costs None."""

    def cost(self, model: str | None, usage: Usage | None) -> float | None:
        if not model or usage is None:
            return None
        try:
            from genai_prices import Usage as Tokens
            from genai_prices import calc_price
        except ImportError:  # pragma: no cover - a core dependency, absent only if removed
            return None
        tokens = Tokens(
            input_tokens=usage.input_tokens,
            cache_read_tokens=usage.cached_input_tokens,
            cache_write_tokens=usage.cache_write_tokens,
            output_tokens=usage.output_tokens,
        )
        try:
            found = calc_price(tokens, model_ref=model)
        except (LookupError, ValueError):
            return None
        return float(found.total_price)


class Prices:
    """A user's table first (``override``), then the catalogue, model by model."""

    def __init__(self, override: PriceTable | None = None, *, catalogue: bool = True) -> None:
        self.override = override
        self.catalogue = CataloguePrices() if catalogue else None

    def cost(self, model: str | None, usage: Usage | None) -> float | None:
        if self.override is not None and self.override.price_of(model) is not None:
            return self.override.cost(model, usage)
        return None if self.catalogue is None else self.catalogue.cost(model, usage)


def default_prices(environ: Mapping[str, str] = os.environ) -> Prices:
    """The catalogue, overridden by the table :data:`PRICES_ENV` names, if any."""
    return Prices(prices_from_env(environ))
