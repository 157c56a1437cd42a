"""LatencyReport and its records (defined in layerscope.reports.latency and layerscope.analyses.latency;
kept here for imports)."""

from .render.views import LatencyReport
from .reports.latency import LatencyLayer, latency_layers, latency_totals

__all__ = ["LatencyLayer", "LatencyReport", "latency_layers", "latency_totals"]
