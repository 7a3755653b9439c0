"""Views: a fold's state trimmed to a token budget, and compaction with a view."""

from .policy import CompactResult, chunks_of, compact_with_view
from .strategies import drop_oldest, elide, from_newest, newest
from .tokens import TiktokenCounter, approx_tokens
from .view import ContextView, SplitResult, StrategyContext, ViewResult, check_budget

__all__ = [
    "CompactResult",
    "ContextView",
    "SplitResult",
    "StrategyContext",
    "TiktokenCounter",
    "ViewResult",
    "approx_tokens",
    "check_budget",
    "chunks_of",
    "compact_with_view",
    "drop_oldest",
    "elide",
    "from_newest",
    "newest",
]
