"""Views: a fold's state trimmed to a token budget, pure (no reads, no appends)."""

from .chunks import chunks_of
from .strategies import drop_oldest, elide, from_newest, newest
from .tokens import TiktokenCounter, approx_tokens
from .view import ContextView, SplitResult, StrategyContext, ViewResult, check_budget

__all__ = [
    "ContextView",
    "SplitResult",
    "StrategyContext",
    "TiktokenCounter",
    "ViewResult",
    "approx_tokens",
    "check_budget",
    "chunks_of",
    "drop_oldest",
    "elide",
    "from_newest",
    "newest",
]
