"""Timelines, request details and stats of agent streams, derived from the journal alone:
what the inspector shows and ``contextfold stats`` prints."""

from .build import RequestTrace, Timeline, TimelineBuilder, ToolTrace, TraceItem, TurnTrace
from .prices import Price, PriceTable, load_prices

__all__ = [
    "Price",
    "PriceTable",
    "RequestTrace",
    "Timeline",
    "TimelineBuilder",
    "ToolTrace",
    "TraceItem",
    "TurnTrace",
    "load_prices",
]
