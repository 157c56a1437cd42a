"""Deprecated alias, kept for one release: MemoryReport and its records live in
layerscope.reports.memory (the report is exported from ``layerscope``). Nothing inside the package
imports this module."""

import warnings

warnings.warn("layerscope.memory_report is deprecated; import from layerscope or layerscope.reports.memory",
              DeprecationWarning, stacklevel=2)

from .reports.memory import MemoryReport  # noqa: E402
from .reports.memory import (CATEGORIES, CallMemory, Marker, Measured, MemoryLayer, PhaseSpan,  # noqa: E402
                             StepMemory, Timeline)

__all__ = ["MemoryReport", "MemoryLayer", "CallMemory", "StepMemory", "PhaseSpan", "Timeline", "Marker",
           "Measured", "CATEGORIES"]
