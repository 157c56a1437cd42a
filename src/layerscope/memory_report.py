"""MemoryReport and its records (defined in layerscope.reports.memory and layerscope.analyses.memory;
kept here for imports)."""

from .render.views import MemoryReport
from .reports.memory import (CATEGORIES, CallMemory, Marker, Measured, MemoryLayer, PhaseSpan, StepMemory,
                             Timeline)

__all__ = ["MemoryReport", "MemoryLayer", "CallMemory", "StepMemory", "PhaseSpan", "Timeline", "Marker",
           "Measured", "CATEGORIES"]
