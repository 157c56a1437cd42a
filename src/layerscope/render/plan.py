"""The JSON of a StagePlan (its table comes from layerscope.reports.plan's columns)."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..reports.plan import Stage, StagePlan

__all__ = ["plan_dict"]


def _stage_row(s: "Stage") -> dict[str, Any]:
    return {"stage": s.index, "rank": s.rank, "first_unit": s.units[0], "last_unit": s.units[-1],
            "units": len(s.units), "params": s.params, "flops": s.flops, "macs": s.macs,
            "cost": s.cost, **{f"memory_{k}": v for k, v in s.memory.items()}, "limit_bytes": s.limit,
            "forward_time": s.forward_time, "backward_time": s.backward_time, "send_time": s.send_time,
            "optimizer_time": s.optimizer_time, **({"weight_time": s.weight_time} if s.weight_time is not None else {})}


def plan_dict(plan: "StagePlan") -> dict[str, Any]:
    return {"model": plan.model_name, "by": plan.by_name, "objective": plan.objective, "schedule": plan.schedule,
            "microbatches": plan.microbatches, "stages_per_rank": plan.stages_per_rank,
            "micro_batch_size": plan.units.micro_batch, "step_time": plan.step_time, "bubble": plan.bubble,
            "timeline": plan.timeline.to_dict() if plan.timeline is not None else None,
            "bottleneck": plan.bottleneck, "lower_bound": plan.lower_bound, "imbalance": plan.imbalance,
            "split_points": list(plan.split_points), "options": plan.options, "notes": list(plan.notes),
            "stages": [{**_stage_row(s), "unit_names": list(s.units)} for s in plan.stages],
            "units": [_unit_dict(u) for u in plan.units.units],
            "ties": [{"names": list(t.names), "units": list(t.units), "state_bytes": t.state_bytes}
                     for t in plan.units.ties]}


def _unit_dict(u) -> dict[str, Any]:
    d = asdict(u)
    d["forward"] = asdict(u.forward)
    d["backward"] = asdict(u.backward)
    d["paths"] = list(u.paths)
    return d
