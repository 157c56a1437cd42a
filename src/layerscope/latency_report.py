"""Deprecated alias, kept for one release: LatencyReport and its records live in
layerscope.reports.latency (the report is exported from ``layerscope``). Nothing inside the package
imports this module."""

import warnings

warnings.warn("layerscope.latency_report is deprecated; import from layerscope or layerscope.reports.latency",
              DeprecationWarning, stacklevel=2)

from .reports.latency import LatencyReport  # noqa: E402
from .reports.latency import LatencyLayer, latency_layers, latency_totals  # noqa: E402

__all__ = ["LatencyLayer", "LatencyReport", "latency_layers", "latency_totals"]
