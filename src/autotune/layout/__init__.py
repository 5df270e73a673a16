"""Layouts: the parallel degrees of a run, their legality, their labels and their arguments.

Pure Python and numpy: no torch, no ray.
"""

from .args import format_args, layout_args, layout_from_args
from .core import DISPATCHERS, FLEX_DISPATCHERS, OFFLOAD_MODULES, SELECTIVE_MODULES, Layout, Recompute
from .rules import RULES, Violation, check, legal_mask, nearest_legal, validate, violations
from .table import LayoutTable

__all__ = [
    "DISPATCHERS",
    "FLEX_DISPATCHERS",
    "SELECTIVE_MODULES",
    "OFFLOAD_MODULES",
    "Layout",
    "Recompute",
    "LayoutTable",
    "RULES",
    "Violation",
    "check",
    "legal_mask",
    "nearest_legal",
    "validate",
    "violations",
    "format_args",
    "layout_args",
    "layout_from_args",
]
