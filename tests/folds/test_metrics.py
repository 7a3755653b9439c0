"""OpenTelemetry metrics of fold reads: contextfold.fold.read.events and .skipped.

contextfold creates its instruments at import time from the global (proxy) meter. The
API's proxy hands them real instruments once a MeterProvider is set, so a provider set
after the import (as here) still receives every measurement: the first test checks that.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Sum

import contextfold as cf
from contextfold.folds import reader as reader_module


class Said(cf.Event, type="met/said"):
    text: str


class Opened(cf.Event, type="met/opened"):
    id: str


class Attached(cf.Event, type="met/attached"):
    id: str


_created_before_provider = type(reader_module._skipped_counter).__name__.startswith("_Proxy")


@pytest.fixture(scope="module")
def metric_reader() -> Iterator[InMemoryMetricReader]:
    current = metrics.get_meter_provider()
    if isinstance(current, MeterProvider):  # another test module installed the SDK already
        readers = current._metric_readers
        found = [r for r in readers if isinstance(r, InMemoryMetricReader)]
        if not found:
            pytest.skip("a global MeterProvider without an InMemoryMetricReader is already set")
        yield found[0]
        return
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    yield reader


def sums(reader: InMemoryMetricReader, name: str) -> dict[frozenset[tuple[str, object]], float]:
    """Cumulative sums of a counter by attribute set."""
    found: dict[frozenset[tuple[str, object]], float] = {}
    data = reader.get_metrics_data()
    if data is None:
        return found
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                assert isinstance(metric.data, Sum)  # a counter's points are sums
                for point in metric.data.data_points:
                    found[frozenset((point.attributes or {}).items())] = point.value
    return found


class Counter:
    """Reads one counter's value for one attribute set, as a delta since the last call."""

    def __init__(self, reader: InMemoryMetricReader, name: str, **attributes: str) -> None:
        self.reader, self.name, self.key = reader, name, frozenset(attributes.items())
        self.last = self.total()

    def total(self) -> float:
        return sums(self.reader, self.name).get(self.key, 0)

    def delta(self) -> float:
        now = self.total()
        delta, self.last = now - self.last, now
        return delta


def said_fold(name: str) -> cf.Fold[tuple[str, ...]]:
    fold: cf.Fold[tuple[str, ...]] = cf.Fold(name, initial=tuple)
    fold.on(Said)(lambda state, ev: (*state, ev.payload.text))
    return fold


def test_instruments_from_import_time_reach_a_provider_set_later(
    metric_reader: InMemoryMetricReader,
) -> None:
    if not _created_before_provider:
        pytest.skip("a MeterProvider was set before contextfold was imported")
    # The counters are the API's proxies, created before the provider existed...
    assert type(reader_module._events_counter).__name__ == "_ProxyCounter"
    # ...and after set_meter_provider they forward to real SDK instruments.
    reader_module._events_counter.add(0, {"fold": "probe", "start": "warm"})
    assert frozenset({("fold", "probe"), ("start", "warm")}) in sums(
        metric_reader, "contextfold.fold.read.events"
    )


async def test_skipped_counts_each_left_out_event_once(metric_reader: InMemoryMetricReader) -> None:
    decode = Counter(
        metric_reader, "contextfold.fold.read.skipped", fold="met_decode", reason="decode"
    )
    journal = cf.open_journal("memory://")
    fold = said_fold("met_decode")
    await journal.append(
        "s", [Said(text="a"), cf.RawEvent("met/said", {"text": 1}), Said(text="b")]
    )
    assert await journal.fold(fold, "s") == ("a", "b")
    assert decode.delta() == 1
    for _ in range(3):
        journal.folds.cache.drop(lambda key: True)
        assert await journal.fold(fold, "s") == ("a", "b")
    assert decode.delta() == 0

    # Another journal object is another plane: it reports once more.
    assert await cf.Journal(journal.store).fold(fold, "s") == ("a", "b")
    assert decode.delta() == 1


async def test_skipped_counts_missing_segments_and_bad_checkpoints(
    metric_reader: InMemoryMetricReader,
) -> None:
    missing = Counter(
        metric_reader, "contextfold.fold.read.skipped", fold="met_seg", reason="missing-segment"
    )
    checkpoint = Counter(
        metric_reader, "contextfold.fold.read.skipped", fold="met_seg", reason="checkpoint"
    )
    fold = cf.SegmentedFold("met_seg", data=str, summary=str, tag=None)
    fold.open(Opened)(lambda ev: cf.Segment(ev.payload.id, ev.payload.id))
    fold.attach(Attached, to=lambda ev: ev.payload.id)(lambda data, ev: data + "+")
    journal = cf.open_journal("memory://")
    await journal.append("s", [Opened(id="a"), Attached(id="a"), Attached(id="nope")])
    await journal.append(
        "s",
        cf.RawEvent(fold.checkpoint_type, {"through": "987654", "state": {"segments": []}}),
        channels=(),
    )
    state = await journal.fold(fold, "s")
    assert [s.data for s in state.segments] == ["a+"]
    assert (missing.delta(), checkpoint.delta()) == (1, 1)
    journal.folds.cache.drop(lambda key: True)
    await journal.fold(fold, "s")
    assert (missing.delta(), checkpoint.delta()) == (0, 0)


async def test_read_events_by_start(metric_reader: InMemoryMetricReader) -> None:
    name = "met_events"
    cold = Counter(metric_reader, "contextfold.fold.read.events", fold=name, start="cold")
    warm = Counter(metric_reader, "contextfold.fold.read.events", fold=name, start="warm")
    reset = Counter(metric_reader, "contextfold.fold.read.events", fold=name, start="reset")
    appended = Counter(metric_reader, "contextfold.fold.read.events", fold=name, start="append")
    journal = cf.open_journal("memory://")
    fold = said_fold(name)
    await journal.append("s", [Said(text="1"), Said(text="2"), Said(text="3")])
    await journal.fold(fold, "s")
    assert (cold.delta(), warm.delta(), reset.delta()) == (3, 0, 0)

    await journal.append("s", [Said(text="4"), Said(text="5")])  # folded as it lands
    assert appended.delta() == 2
    await cf.Journal(journal.store).append("s", Said(text="6"))  # another writer's
    await journal.fold(fold, "s")
    assert (cold.delta(), warm.delta(), reset.delta(), appended.delta()) == (0, 1, 0, 0)
    await journal.fold(fold, "s")
    assert (cold.delta(), warm.delta(), reset.delta()) == (0, 0, 0)

    await journal.delete_stream("s")
    await journal.append("s", Said(text="new"))
    assert await journal.fold(fold, "s") == ("new",)
    assert (cold.delta(), warm.delta(), reset.delta()) == (0, 0, 1)

    journal.folds.cache.drop(lambda key: True)
    await journal.fold(fold, "s")
    assert (cold.delta(), warm.delta(), reset.delta()) == (1, 0, 0)
