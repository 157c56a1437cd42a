"""``layerscope.compare`` (defined in layerscope.reports.compare; kept here for imports)."""

from .reports.compare import ComparedLayer, Comparison, compare

__all__ = ["compare", "Comparison", "ComparedLayer"]
