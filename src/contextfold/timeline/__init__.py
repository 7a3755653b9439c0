"""Timelines, request details and stats of agent streams and of a framework's call
records, derived from the journal alone: what the inspector shows and ``contextfold
stats`` prints (and LangGraph's stored values shown readable, for event listings)."""

from ..prices import Price, PriceTable, load_prices
from .build import RequestTrace, Timeline, TimelineBuilder, ToolTrace, TraceItem, TurnTrace

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
