"""Folds: typed state derived from journal events, incrementally and cached."""

from .fold import Fold, FoldBase
from .freeze import FrozenDict, FrozenList, freeze
from .segmented import Segment, SegmentedFold, SegmentedState

__all__ = [
    "Fold",
    "FoldBase",
    "FrozenDict",
    "FrozenList",
    "Segment",
    "SegmentedFold",
    "SegmentedState",
    "freeze",
]
