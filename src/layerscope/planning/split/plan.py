"""The plan of a pipeline split, the one record the planning package passes on: what the planner chose
(``plan_split``, with every stage's figures), the uniform split the parallel simulation, the search and
the real runs cut a model by (``outline_plan``: the cuts alone), and what a stage module is built from
(split/runnable.py). reports/plan_build.py turns a planner's result into the StagePlan users see."""

from __future__ import annotations

from dataclasses import dataclass

from ..steptime.schedule import Timeline
from .units import SplitUnits

__all__ = ["StageFigures", "StageIndex", "PlanResult", "outline_plan"]


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
    notes: tuple            # capture.notes.Note records (and text), worded in reports/notes.py
    objective: str
    timeline: Timeline | None
    stages_per_rank: int
    rank_bytes: tuple[int, ...] | None

    @property
    def num_stages(self) -> int:
        return len(self.stages)



def outline_plan(units: SplitUnits, bounds: list[tuple[int, int]], schedule: str, ranks: list[int], *,
                 microbatches: int = 1, stages_per_rank: int = 1) -> PlanResult:
    """A split known by its cuts alone, nothing counted: stage s over units ``bounds[s]`` (first, last),
    on rank ``ranks[s]`` (the uniform split a run or a simulated rank cuts the model by)."""
    stages = tuple(StageFigures(index=s, first=x, last=y, units=tuple(u.name for u in units.units[x:y + 1]), cost=0.0,
                                flops=0, macs=0, params=0, memory={}, limit=None, rank=r)
                   for s, ((x, y), r) in enumerate(zip(bounds, ranks)))
    return PlanResult(units=units, stages=stages, by="blocks", schedule=schedule, microbatches=microbatches,
                      bottleneck=0.0, notes=(), objective="uniform", timeline=None, stages_per_rank=stages_per_rank,
                      rank_bytes=None)
