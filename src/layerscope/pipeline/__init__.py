"""Pipeline parallelism: split units, the optimal split and its memory model, schedule simulation,
runnable stages and what a rank of a torchrun run does (plain results: reports/ makes the StagePlan)."""

from .memory import held_microbatches, stage_memory
from .planner import plan_split
from .results import PlanResult, StageFigures
from .units import SplitUnits, Tie, Unit, split_units

__all__ = ["PlanResult", "SplitUnits", "StageFigures", "Tie", "Unit", "held_microbatches", "plan_split",
           "split_units", "stage_memory"]
