"""Prices come from genai-prices' catalogue by default; a user's table overrides it model
by model; a model neither knows costs None (shown as unknown), never zero."""

from __future__ import annotations

import pytest

import contextfold as cf
from contextfold.prices import CataloguePrices, Price, Prices, PriceTable, default_prices

USAGE = cf.Usage(input_tokens=1_000_000, output_tokens=1_000_000, cached_input_tokens=500_000)


def test_the_catalogue_prices_known_models_and_no_others() -> None:
    catalogue = CataloguePrices()
    gpt = catalogue.cost("gpt-4.1", USAGE)
    # gpt-4.1: $2 input, $0.5 cached input, $8 output per million tokens (the catalogue's).
    assert gpt == pytest.approx(0.5 * 2 + 0.5 * 0.5 + 8)
    assert catalogue.cost("SmolLM2-135M-Instruct", USAGE) is None
    assert catalogue.cost(None, USAGE) is None and catalogue.cost("gpt-4.1", None) is None


def test_a_table_overrides_the_catalogue_model_by_model() -> None:
    table = PriceTable(
        prices={"gpt-4.1": Price(input=1, output=1), "local": Price(input=3, output=0)}
    )
    prices = Prices(table)
    assert prices.cost("gpt-4.1", USAGE) == pytest.approx(2.0)  # the table's, not the catalogue's
    assert prices.cost("local-7b", USAGE) == pytest.approx(3.0)
    assert prices.cost("claude-haiku-4-5", USAGE) == CataloguePrices().cost(
        "claude-haiku-4-5", USAGE
    )
    assert prices.cost("unknown-model", USAGE) is None
    assert Prices(table, catalogue=False).cost("claude-haiku-4-5", USAGE) is None


def test_the_default_reads_the_override_named_by_the_environment(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "prices.json"
    path.write_text('{"gpt-4.1": {"input": 1, "output": 1}}')
    assert default_prices({"CONTEXTFOLD_PRICES": str(path)}).cost("gpt-4.1", USAGE) == 2.0
    assert default_prices({}).cost("gpt-4.1", USAGE) == CataloguePrices().cost("gpt-4.1", USAGE)
