"""What the planner returns: plain records of the chosen split (reports/plan_build.py turns them into
the StagePlan users see; the stages of a run need no more than these)."""

from __future__ import annotations

from dataclasses import dataclass

from ..steptime.schedule import Timeline
from .units import SplitUnits

__all__ = ["StageFigures", "StageIndex", "PlanResult"]


@dataclass(frozen=True, slots=True)
class StageFigures:
    """One stage of the split: its units, cost, counts, memory breakdown (``memory.stage_memory``),
    its device's limit, its rank and, with unit times, its seconds per micro-batch."""

    index: int
    first: int                     # unit indices, inclusive
    last: int
    units: tuple[str, ...]
    cost: float
    flops: int
    macs: int
    params: int
    memory: dict
    limit: int | None
    rank: int
    forward_time: float | None = None
    backward_time: float | None = None
    send_time: float | None = None
    optimizer_time: float | None = None
    weight_time: float | None = None


class StageIndex:
    """Where the stages of a split begin and which stage holds a unit: the planner's result and the
    StagePlan users see (layerscope.reports.plan) both answer with these."""

    __slots__ = ()

    @property
    def split_points(self) -> tuple[str, ...]:
        """Module path where each stage after the first begins (for SplitPoint.BEGINNING)."""
        return tuple(self.units.units[s.first].paths[0] for s in self.stages[1:])

    def stage_of(self, unit: int) -> int:
        for s in self.stages:
            if s.first <= unit <= s.last:
                return s.index
        raise IndexError(unit)


@dataclass(frozen=True)
class PlanResult(StageIndex):
    """The split the planner chose and how it chose it."""

    units: SplitUnits
    stages: tuple[StageFigures, ...]
    by: str
    schedule: str
    microbatches: int
    bottleneck: float
    notes: tuple[str, ...]
    objective: str
    timeline: Timeline | None
    stages_per_rank: int
    rank_bytes: tuple[int, ...] | None

    @property
    def num_stages(self) -> int:
        return len(self.stages)

