"""The OpenTelemetry SDK's in-memory exporter and metric reader for tests.

The SDK's providers are process-global and set once: these install them unless another
test module did, and then read through what it installed.
"""

from __future__ import annotations

from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from contextfold import telemetry as tm


def span_exporter() -> InMemorySpanExporter:
    """A new in-memory exporter on the global tracer provider (installed when none is)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    found = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(found))
    return found


def metric_reader() -> InMemoryMetricReader | None:
    """The global meter provider's in-memory reader (installed when no provider is); None
    when another provider without one is set."""
    current = metrics.get_meter_provider()
    if isinstance(current, MeterProvider):
        readers = [r for r in current._metric_readers if isinstance(r, InMemoryMetricReader)]
        return readers[0] if readers else None
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def histogram(
    reader: InMemoryMetricReader, name: str, **attributes: Any
) -> list[HistogramDataPoint]:
    """The points of histogram ``name`` whose attributes include ``attributes``."""
    found = []
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != name:
                    continue
                for point in metric.data.data_points:
                    if isinstance(point, HistogramDataPoint) and (
                        attributes.items() <= dict(point.attributes or {}).items()
                    ):
                        found.append(point)
    return found


def attributes(span: ReadableSpan) -> dict[str, Any]:
    """A finished span's attributes as a plain dict."""
    return dict(span.attributes or {})


def of_operation(found: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    """The spans of GenAI operation ``name`` that are not compactions, or the compactions
    (``name`` is ``tm.COMPACTION``)."""
    if name == tm.COMPACTION:
        return [s for s in found if attributes(s).get(tm.CONTEXTFOLD_OPERATION) == name]
    return [
        s
        for s in found
        if attributes(s).get(tm.OPERATION_NAME) == name
        and tm.CONTEXTFOLD_OPERATION not in attributes(s)
    ]
