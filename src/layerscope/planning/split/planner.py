"""The planner: the split a PartitionOptions asks for (the optimal one for its objective, the uniform
one, or the caller's cuts) under the memory limits, with every stage's figures, the simulated step
and the ranks' memory. Plain results (``results.py``); reports/plan_build.py makes the StagePlan."""

from __future__ import annotations

import math

import torch

from ...capture.notes import Note
from ...errors import InputError, PlanError
from ...options import parse_bytes
from ...options import iec
from ..config import PartitionOptions, schedule_of
from .stage_memory import rank_memory, stage_memory, stage_total
from .partition import OBJECTIVES, TIME_COSTS, given_bounds, solve, uniform_bounds, unit_cost
from .plan import PlanResult, StageFigures
from ..steptime.schedule import rank_orders, simulate, stage_ranks
from ..steptime.split_time import StepTimes, best_step_split
from .units import SplitUnits

__all__ = ["plan_split"]


def plan_split(units: SplitUnits, options: PartitionOptions, notes=()) -> PlanResult:
    """The split of ``units`` that ``options`` asks for, with each stage's figures (reports/ turns it
    into a StagePlan); infeasible -> PlanError with what would work. From ``options``: ``stages``,
    ``by``, ``memory_limit``, ``schedule``, ``microbatches``, ``stages_per_rank`` and these.

    ``objective``: "step_time" (the smallest predicted step time of the schedule; the default when
    the units have times), "bottleneck" (the smallest largest stage cost; the default otherwise) or
    "uniform" (equal numbers of repeated blocks per stage, the rest on the first and last: the
    split torchtitan makes by default). ``cuts``: the caller's split instead (the first unit of
    each stage after the first: unit indices or split point names, as ``plan.split_points``; a
    pipeline run passes its plan to every rank this way). ``link_bandwidth`` (bytes/s) prices the sends across cuts,
    ``optimizer_bandwidth`` (bytes/s) each rank's optimizer step; without them neither is in the
    predicted step time, and the plan says so."""
    stages, by, schedule, microbatches = options.stages, options.by, options.schedule, options.microbatches
    stages_per_rank = options.stages_per_rank
    kind = schedule_of(schedule)
    _check_shape(units, options, kind)
    timed = all(u.forward_time is not None and u.backward_time is not None for u in units.units)
    given = None if options.cuts is None else given_bounds(units, stages, options.cuts)
    objective = _objective(options, kind, timed, given)
    notes = list(notes)
    limits, device_limits = _limits(options, kind, notes)
    unit_cost(by) if by != "memory" else None   # validates ``by`` early
    found = solve(units, stages, by, limits, schedule, microbatches, stages_per_rank)
    if found is None:
        raise _no_fit(units, options, limits, device_limits)
    bounds = [x for x, _ in found[0]] + [len(units)]
    times = _step_times(units, options.link_bandwidth, options.optimizer_bandwidth, notes) if timed else None
    bounds, exact = _choose_bounds(units, options, objective, bounds, given, times, limits)
    out = _stage_figures(units, options, bounds, times, device_limits)
    timeline = None
    if times is not None:
        timeline = _timeline(out, options)
        if kind.zero_bubble:
            measured = all(u.measured_weight_share is not None for u in units.units)
            notes.append(Note("split-zero-bubble", {"measured": measured}))
    rank_bytes = _rank_bytes(units, options, out) if kind.multi else None
    if objective == "step_time" and not exact:
        notes.append(Note("split-descent", {}))
    return PlanResult(units=units, stages=tuple(out), by=by if isinstance(by, str) else "custom",
                      schedule=schedule, microbatches=microbatches,
                      bottleneck=max(st.cost for st in out), notes=tuple(notes),
                      objective=objective, timeline=timeline, stages_per_rank=stages_per_rank,
                      rank_bytes=rank_bytes)


def _check_shape(units: SplitUnits, options: PartitionOptions, kind) -> None:
    """The stage and microbatch counts are valid for the schedule and the units."""
    stages, microbatches = options.stages, options.microbatches
    if not isinstance(stages, int) or stages < 1:
        raise InputError(f"stages must be a positive integer, got {stages!r}")
    if microbatches < 1:
        raise InputError(f"microbatches must be at least 1, got {microbatches}")
    kind.check_stages(stages, options.stages_per_rank)
    n = len(units)
    if stages > n:
        raise PlanError(f"{units.model_name} has only {n} split units "
                        f"({', '.join(u.name for u in units.units[:8])}{' ...' if n > 8 else ''}); "
                        f"it cannot be cut into {stages} stages", min_stages=None)


def _objective(options: PartitionOptions, kind, timed: bool, given) -> str:
    """The objective the split optimises: "given" with cuts, else the asked or default one, checked."""
    objective, by, stages_per_rank = options.objective, options.by, options.stages_per_rank
    if given is not None:
        objective = "given"
    if objective is None:
        objective = "step_time" if timed and by in TIME_COSTS else "bottleneck"
    if objective not in OBJECTIVES and given is None:
        raise InputError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if objective == "step_time" and not timed:
        raise InputError("objective='step_time' needs each unit's forward and backward time: by='latency' "
                         "measures them on the real model, by='roofline' predicts them from FLOPs and bytes")
    if kind.multi and timed:
        kind.rank_order(0, stages_per_rank, options.stages // stages_per_rank, options.microbatches)   # torch's rule
    return objective


def _limits(options: PartitionOptions, kind, notes: list):
    """(each stage's byte limit, each device's byte limit), both None without a memory limit."""
    stages, stages_per_rank = options.stages, options.stages_per_rank
    limits = None
    memory_limit = options.memory_limit
    if memory_limit is not None:
        raw = memory_limit if isinstance(memory_limit, (list, tuple)) else [memory_limit] * stages
        if len(raw) != stages:
            raise InputError(f"memory_limit has {len(raw)} entries for {stages} stages")
        limits = [float(parse_bytes(v)) for v in raw]
    device_limits = limits
    if limits is not None and kind.multi:
        # a rank holds stages_per_rank stages: each stage held to its share of the device, which is
        # sufficient (the rank's peak is at most the sum of its stages' peaks) but not necessary
        limits = [v / stages_per_rank for v in limits]
        notes.append(Note("split-stage-share", {"schedule": options.schedule, "stages_per_rank": stages_per_rank}))
    return limits, device_limits


def _choose_bounds(units: SplitUnits, options: PartitionOptions, objective: str, bounds: list, given,
                   times, limits):
    """(the split's stage bounds, whether the step-time search was exact) for ``objective``, starting
    from the bottleneck split ``bounds``; a uniform or given split over the limits -> PlanError."""
    stages, schedule, microbatches = options.stages, options.schedule, options.microbatches
    stages_per_rank = options.stages_per_rank
    seen: dict[tuple[int, int, int], bool] = {}     # the searches ask about the same stages often

    def fits(s: int, x: int, y: int) -> bool:
        if limits is None:
            return True
        key = (s, x, y)
        if key not in seen:
            seen[key] = stage_total(units, x, y, s, stages, schedule, microbatches, stages_per_rank) <= limits[s]
        return seen[key]

    if objective in ("uniform", "given"):
        bounds = given or uniform_bounds(units, stages)
        over = [s for s in range(stages) if not fits(s, bounds[s], bounds[s + 1])]
        if over:
            raise PlanError(f"the {objective} split of {units.model_name} into {stages} stages does not fit the "
                            f"memory limit: stage{'s' if len(over) > 1 else ''} {', '.join(map(str, over))} "
                            "over (objective='bottleneck' or 'step_time' finds one that fits)", min_stages=None)
    elif objective == "step_time":
        seeds = [bounds, uniform_bounds(units, stages)]   # never worse than either
        for part in ("forward_time", "backward_time"):
            alt = solve(units, stages, lambda u, p=part: getattr(u, p), limits, schedule, microbatches,
                        stages_per_rank)
            seeds.append([x for x, _ in alt[0]] + [len(units)] if alt else None)
        best = best_step_split(times, stages, schedule, microbatches, stages_per_rank, fits, seeds)
        return best[0], best[2]
    return bounds, True


def _stage_figures(units: SplitUnits, options: PartitionOptions, bounds: list, times,
                   device_limits) -> list[StageFigures]:
    """Each stage's figures for the split at ``bounds``: units, cost, memory, times, rank."""
    stages, by, schedule, microbatches = options.stages, options.by, options.schedule, options.microbatches
    stages_per_rank = options.stages_per_rank
    cost_of = None if by == "memory" else unit_cost(by)
    where = stage_ranks(schedule, stages, stages_per_rank)
    zero_bubble = schedule_of(schedule).zero_bubble
    if zero_bubble and times is not None:
        weights = times.stage_times(torch.tensor([bounds]))[4][0].tolist()   # the first stage's: all of it
    out = []
    for s in range(stages):
        x, y = bounds[s], bounds[s + 1]
        us = units.units[x:y]
        mem = stage_memory(units, x, y, s, stages, schedule, microbatches, stages_per_rank)
        timing = {}
        if times is not None:
            timing = {"forward_time": float(times.f[y] - times.f[x]), "backward_time": float(times.b[y] - times.b[x]),
                      "send_time": float(times.send_after[y - 1]) if s < stages - 1 else None,
                      "optimizer_time": float(times.o[y] - times.o[x])}
            if zero_bubble:
                timing["weight_time"] = float(weights[s])
        out.append(StageFigures(index=s, first=x, last=y - 1, units=tuple(u.name for u in us),
                         cost=float(mem["total"]) if cost_of is None else sum(cost_of(u) for u in us),
                         flops=sum(u.flops for u in us), macs=sum(u.macs for u in us),
                         params=sum(u.params for u in us), memory=mem,
                         limit=int(device_limits[s]) if device_limits else None, rank=where[s], **timing))
    return out


def _timeline(out: list[StageFigures], options: PartitionOptions):
    """The simulated step of the schedule over the stages' times."""
    zero_bubble = schedule_of(options.schedule).zero_bubble
    return simulate(options.schedule, [st.forward_time for st in out], [st.backward_time for st in out],
                    options.microbatches, send=[st.send_time for st in out[:-1]],
                    optimizer=[st.optimizer_time for st in out], stages_per_rank=options.stages_per_rank,
                    weight=[st.weight_time for st in out] if zero_bubble else None)


def _rank_bytes(units: SplitUnits, options: PartitionOptions, out: list[StageFigures]) -> tuple:
    """Each rank's memory when a rank holds several stages."""
    schedule, stages, microbatches = options.schedule, options.stages, options.microbatches
    orders = rank_orders(schedule, stages, microbatches, options.stages_per_rank)
    p = max(stage_ranks(schedule, stages, options.stages_per_rank)) + 1
    return tuple(
        rank_memory(units, [st for st in out if st.rank == r], stages,
                    [(a.stage, a.kind) for a in orders[r]], microbatches) for r in range(p))


def _no_fit(units: SplitUnits, options: PartitionOptions, limits: list[float] | None,
            device_limits: list[float] | None) -> PlanError:
    """No split fits the limits: the error says the smallest limit that works with this stage
    count, and the smallest stage count that works with this limit."""
    stages, by, schedule = options.stages, options.by, options.schedule
    microbatches, stages_per_rank, n = options.microbatches, options.stages_per_rank, len(units)
    kind = schedule_of(schedule)
    fit = solve(units, stages, "memory", None, schedule, microbatches, stages_per_rank)
    need = int(math.ceil(fit[1])) if fit else None
    k_ok = None
    for k in range(stages + 1, n + 1):
        if kind.multi and k % stages_per_rank:
            continue
        lim_k = None if limits is None else [min(limits)] * k
        if solve(units, k, by, lim_k, schedule, microbatches, stages_per_rank) is not None:
            k_ok = k
            break
    share = stages_per_rank if kind.multi else 1     # stages on one device
    need = need * share if need else need
    return PlanError(
        f"no split of {units.model_name} into {stages} stages fits the memory limit "
        f"({', '.join(iec(int(v)) for v in sorted(set(device_limits or [])))}); "
        + (f"the smallest {'device' if share > 1 else 'per-stage'} limit that works with {stages} stages "
           f"is {iec(need)}" + (f" ({share} stages on each)" if share > 1 else "") if need else "")
        + (f"; with this limit the smallest stage count that works is {k_ok}" if k_ok
           else "; no stage count works with this limit"),
        min_memory=need, min_stages=k_ok)


def _step_times(units: SplitUnits, link_bandwidth, optimizer_bandwidth, notes: list):
    """Per-unit seconds for the step-time simulation, with a note for each part left out."""
    us = units.units
    if link_bandwidth:
        send = [u.output_bytes / float(link_bandwidth) for u in us]
    else:
        send = [0.0] * len(us)
        notes.append(Note("split-sends-unpriced", {}))
    if optimizer_bandwidth:
        opt = [(2 * u.param_bytes + u.grad_bytes + 2 * u.optimizer_bytes) / float(optimizer_bandwidth) for u in us]
    else:
        opt = [0.0] * len(us)
        notes.append(Note("split-optimizer-unpriced", {}))
    return StepTimes([u.forward_time for u in us], [u.backward_time for u in us], send, opt,
                     [u.backward_time * u.weight_share for u in us])
