"""Pipeline parallelism: split units, the optimal stage plan, runnable stages, torchrun runs."""

from .partition import build_plan, held_microbatches, stage_memory
from .plan import Stage, StagePlan
from .units import SplitUnits, Tie, Unit, split_units

__all__ = ["Stage", "StagePlan", "SplitUnits", "Tie", "Unit", "split_units", "build_plan", "held_microbatches",
           "stage_memory"]
