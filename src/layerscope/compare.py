"""``layerscope.compare`` (defined in layerscope.reports.compare; kept here for imports)."""

from .render.views import Comparison, compare
from .reports.compare import ComparedLayer

__all__ = ["compare", "Comparison", "ComparedLayer"]
