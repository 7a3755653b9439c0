"""Folds: typed state derived from journal events, incrementally and cached."""

from .fold import Fold, FoldBase, MissingSegment
from .freeze import FrozenDict, FrozenList, freeze
from .segmented import Segment, SegmentedFold, SegmentedState

__all__ = [
    "Fold",
    "FoldBase",
    "FrozenDict",
    "FrozenList",
    "MissingSegment",
    "Segment",
    "SegmentedFold",
    "SegmentedState",
    "freeze",
]
