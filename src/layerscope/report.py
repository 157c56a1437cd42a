"""The Report of ``layerscope.analyze`` (defined in layerscope.reports.summary; kept here for imports)."""

from .reports.summary import Report

__all__ = ["Report"]
