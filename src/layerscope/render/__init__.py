"""Renderers: they format a report's table model (``layerscope.reports``), never change it.

The reports sit below render and never import it; the report objects users receive are the view
classes of ``render.views`` (each kind's record plus its views), built by the API's entry points.
"""

from __future__ import annotations

from .csv import render_csv
from .json import SCHEMA_VERSION
from .table import render_rich
from .text import render_text
from .views import Comparison, LatencyReport, MemoryReport, Report, StagePlan, compare, view

__all__ = ["render_csv", "render_rich", "render_text", "SCHEMA_VERSION", "Report", "MemoryReport",
           "LatencyReport", "StagePlan", "Comparison", "compare", "view"]
