"""Deprecated alias, kept for one release: ``Report`` lives in layerscope.reports.summary (and is
exported from ``layerscope``). Nothing inside the package imports this module."""

import warnings

warnings.warn("layerscope.report is deprecated; import Report from layerscope", DeprecationWarning, stacklevel=2)

from .reports.summary import Report  # noqa: E402

__all__ = ["Report"]
