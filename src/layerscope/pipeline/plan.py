"""StagePlan and Stage (defined in layerscope.reports.plan; kept here for imports)."""

from ..reports.plan import Stage, StagePlan

__all__ = ["Stage", "StagePlan"]
