"""The Report of ``layerscope.analyze`` (defined in layerscope.reports.summary; kept here for imports)."""

from .render.views import Report

__all__ = ["Report"]
