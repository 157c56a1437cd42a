"""LatencyReport and its records (defined in layerscope.reports.latency and layerscope.analyses.latency;
kept here for imports)."""

from .reports.latency import LatencyLayer, LatencyReport, latency_layers, latency_totals

__all__ = ["LatencyLayer", "LatencyReport", "latency_layers", "latency_totals"]
