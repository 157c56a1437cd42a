"""The StagePlan users see, from the planner's plain results (``pipeline.planner.plan_split``)."""

from __future__ import annotations

from ..errors import InputError
from ..options import entry_options
from ..planning.config import LAUNCHER_FIELDS, PartitionOptions
from ..planning.split.planner import plan_split
from ..planning.split.plan import PlanResult
from ..planning.split.units import SplitUnits
from .plan import Stage, StagePlan

__all__ = ["build_plan", "stage_plan"]


def stage_plan(result: PlanResult, recorded: dict | None = None) -> StagePlan:
    """``result`` as a StagePlan; ``recorded``: what the plan's ``options`` state (the optimizer,
    autocast, device, roofline the units were measured or predicted with)."""
    stages = tuple(Stage(**{f: getattr(s, f) for f in Stage.__dataclass_fields__}) for s in result.stages)
    return StagePlan(units=result.units, stages=stages, by=result.by, schedule=result.schedule,
                     microbatches=result.microbatches, bottleneck=result.bottleneck, options=dict(recorded or {}),
                     notes=result.notes, objective=result.objective, timeline=result.timeline,
                     stages_per_rank=result.stages_per_rank, rank_bytes=result.rank_bytes)


def build_plan(units: SplitUnits, options: PartitionOptions | None = None, *, notes=(), recorded: dict | None = None,
               **keywords) -> StagePlan:
    """Plan ``units`` (``options``, or its fields as keywords: ``stages``, ``by``, ``memory_limit``,
    ``schedule``, ``microbatches``, ...) and return the StagePlan."""
    opts, unknown = entry_options(PartitionOptions, options, keywords, keep=LAUNCHER_FIELDS)
    if unknown:
        raise InputError(f"build_plan() got unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}")
    return stage_plan(plan_split(units, opts, notes), recorded)
