"""Pipeline splits: split units, the optimal split and its memory model, runnable stages (plain results:
reports/ makes the StagePlan)."""

from .plan import PlanResult, StageFigures
from .planner import plan_split
from .stage_memory import held_microbatches, stage_memory
from .units import SplitUnits, Tie, Unit, split_units

__all__ = ["PlanResult", "SplitUnits", "StageFigures", "Tie", "Unit", "held_microbatches", "plan_split",
           "split_units", "stage_memory"]
