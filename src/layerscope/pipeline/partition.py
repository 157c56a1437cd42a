"""The optimal contiguous split of units into pipeline stages, under per-stage memory limits.

Objective: minimise the bottleneck, the largest stage cost (the pipeline's throughput is set by its
slowest stage). Constraint: each stage's memory fits its device. A stage's memory depends on where
it sits (how many micro-batches the schedule keeps in flight there) and on its first and last unit
(the boundary buffers), so it is not a plain sum and greedy splitting is not exact. The solver is a
dynamic programme over (stage, first unit):

    best[s][x] = min over y > x of  max(cost_s(x, y), best[s + 1][y])   with  mem_s(x, y) <= limit_s

evaluated a whole row of ``y`` at a time with tensors: O(K·n²) work, exact for any costs (ties between
equal bottlenecks go to the earliest cut). Memory of stage s over units [x, y), per the schedule:

    state (params + grads + optimizer state, tied weights once per stage)
    + in flight: the most that is held during the backward of any micro-batch j = 0 .. M-1, of
        a = one micro-batch's saved activations, less what the stage's first unit saves of its own
            inputs (those are the receive buffers) and what its last unit saves of its output (that
            is o); on the last stage plus what the loss saves
        o = one micro-batch's output, kept for its backward
        g = one micro-batch's input gradient (s > 0), kept while the schedule waits on its send
      counted as torch.distributed.pipelining's schedules keep them (``flight_counts``). GPipe:
      (M - j) × a, the outputs of all M (the forward sends are never dropped; M - j on the last
      stage) and j × g. 1F1B, W = held(s) = min(K - s, M) warm-up forwards: (min(W + j, M) - j) ×
      (a + o), one g (j >= 1), and with W >= 2 one more o while the warm-up's send work holds it.
      At j = 0 the gradients appear as that micro-batch is freed: min(freed, gradients) less.
    + boundary buffers: M received inputs (s > 0) and M received output gradients (s < K - 1),
      which is how torch.distributed.pipelining allocates its receive buffers (one per micro-batch);
      none across a boundary between two stages on one rank (zbv's V; ``local_neighbours``)
    + working memory: the largest transient of one unit's forward or backward (a range maximum),
      and on the last stage at least the loss's forward and backward working memory
    + what the caller of ``schedule.step()`` keeps (``SplitUnits.kept_outputs``, ``input_batch_bytes``,
      ``target_bytes``): with ``return_outputs=True`` (torch's default) the last stage keeps the output
      of every micro-batch whose backward is done (detached, its data alive until the next step) and
      at the end of the step returns them concatenated: j more outputs at backward j, 2·M outputs at
      the end; the whole batch's inputs on the first stage and its targets on the last

held(s): GPipe keeps all M micro-batches; 1F1B keeps min(K - s, M); interleaved 1F1B with v stages per
rank keeps, on rank r of p, min(M, ceil(((p - r - 1)·2 + (v - 1)·p + 1) / v)) per stage (Megatron's
warm-up count spread over the rank's stages); zero bubble (zb, zbv) keeps a micro-batch from its
forward to its W (the weights' gradients need what the forward saved), the most at once in torch's
order. The runtime schedules (interleaved, zb, zbv) keep every send's work to the end of the step.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch

from ..errors import InputError, PlanError
from .schedule import MULTI, ZERO_BUBBLE, rank_orders, simulate, stage_ranks
from .units import SplitUnits, Unit

__all__ = ["solve", "held_microbatches", "stage_memory", "rank_memory", "SCHEDULES", "COSTS", "OBJECTIVES",
           "TIME_COSTS"]

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb", "zbv")
COSTS = ("flops", "macs", "params", "memory", "latency", "roofline")
TIME_COSTS = ("latency", "roofline")        # costs that are seconds: the step time can be predicted
OBJECTIVES = ("step_time", "bottleneck", "uniform")   # and "given": the caller's cuts


def held_microbatches(schedule: str, stages: int, microbatches: int, stage: int,
                      stages_per_rank: int = 2) -> int:
    m = microbatches
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(stages - stage, m)
    if schedule in ZERO_BUBBLE:
        return _zb_held(schedule, stages, m, stages_per_rank)[stage]
    v = stages_per_rank
    p = stages // v
    r = stage % p
    return min(m, math.ceil(((p - r - 1) * 2 + (v - 1) * p + 1) / v))


@functools.lru_cache(maxsize=64)
def _zb_held(schedule: str, stages: int, microbatches: int, stages_per_rank: int) -> tuple[int, ...]:
    """Per stage, the most micro-batches between their forward and their W at once, in torch's order."""
    return _zb_counts(schedule, stages, microbatches, stages_per_rank)[0]


@functools.lru_cache(maxsize=64)
def _zb_counts(schedule: str, stages: int, microbatches: int, stages_per_rank: int):
    """Per stage, the most micro-batches at once between their forward and their W, and between
    their I and their W (the output gradients kept for the W: ``Unit.deferred_bytes``)."""
    held, pending = [0] * stages, [0] * stages
    for order in rank_orders(schedule, stages, microbatches, stages_per_rank):
        live, wait = [0] * stages, [0] * stages
        for a in order:
            live[a.stage] += 1 if a.kind == "F" else -1 if a.kind == "W" else 0
            wait[a.stage] += 1 if a.kind == "I" else -1 if a.kind == "W" else 0
            held[a.stage] = max(held[a.stage], live[a.stage])
            pending[a.stage] = max(pending[a.stage], wait[a.stage])
    return tuple(held), tuple(pending)


def zb_pending(schedule: str, stages: int, microbatches: int, stage: int, stages_per_rank: int = 2) -> int:
    """Zero bubble: the most micro-batches of ``stage`` between their I and their W at once (0 on
    the first stage, whose I torch skips: its W runs the whole backward; 0 for other schedules)."""
    if schedule not in ZERO_BUBBLE or stage == 0:
        return 0
    return _zb_counts(schedule, stages, microbatches, stages_per_rank)[1][stage]


def local_neighbours(schedule: str, stages: int, stage: int, stages_per_rank: int = 2) -> tuple[bool, bool]:
    """Whether the stage before and the one after ``stage`` run on its own rank (zbv's V, or a
    runtime schedule on one rank). torch passes tensors between such stages directly: the receiving
    stage's buffer becomes the sender's output (or input gradient), already counted on the sender,
    so neither side holds receive buffers for that boundary."""
    if not multi_stage(schedule):
        return False, False
    ranks = stage_ranks(schedule, stages, stages_per_rank)
    return (stage > 0 and ranks[stage - 1] == ranks[stage],
            stage < stages - 1 and ranks[stage + 1] == ranks[stage])


def multi_stage(schedule: str) -> bool:
    """Whether the schedule puts several stages on each rank (torch's runtime schedules)."""
    return schedule in MULTI


def _unit_cost(by) -> Callable[[Unit], float]:
    if callable(by):
        return lambda u: float(by(u))
    if by == "flops":
        return lambda u: float(u.flops)
    if by == "macs":
        return lambda u: float(u.macs)
    if by == "params":
        return lambda u: float(u.params)
    if by in TIME_COSTS:
        def lat(u):
            if u.latency is None:
                raise InputError(f"unit {u.name!r} has no time (partition(..., by='latency') measures it on a "
                                 "real model, by='roofline' predicts it from FLOPs and bytes)")
            return float(u.latency)
        return lat
    raise InputError(f"by must be one of {', '.join(COSTS)} or a callable unit -> cost, got {by!r}")


class _Tables:
    """Prefix sums over units, so any stage's cost and memory are O(1) tensor expressions."""

    def __init__(self, units: SplitUnits, by, microbatches: int, schedule: str = "1f1b") -> None:
        us = units.units
        self.n = len(us)
        d = torch.float64

        def prefix(vals):
            return torch.cat([torch.zeros(1, dtype=d), torch.cumsum(torch.tensor(vals, dtype=d), 0)])

        self.by_memory = by == "memory"
        self.cost = None if self.by_memory else prefix([_unit_cost(by)(u) for u in us])
        self.state = prefix([u.state_bytes for u in us])
        self.grads = prefix([u.grad_bytes for u in us])
        self.act = prefix([u.saved_bytes for u in us])
        self.deferred = prefix([u.deferred_bytes for u in us])
        self.inb = torch.tensor([u.input_bytes for u in us] + [0], dtype=d)
        # what a stage starting at x saves of its received inputs (counted as receive buffers)
        self.recv = torch.tensor([min(u.received_saved_bytes, u.input_bytes) for u in us] + [0], dtype=d)
        # what a stage ending at y - 1 saves of its own output (counted as the output)
        self.osaved = torch.tensor([0] + [min(u.output_saved_bytes, u.output_bytes) for u in us], dtype=d)
        self.outb = torch.tensor([0] + [u.output_bytes for u in us], dtype=d)   # of unit y-1
        self.ties = [(prefix([1.0 if i in t.units else 0.0 for i in range(self.n)]), float(t.state_bytes))
                     for t in units.ties]
        self.m = microbatches
        self.schedule = schedule
        # work[x, y] = the largest working memory of units x .. y-1 (a range maximum, O(n^2) once)
        w = torch.tensor([float(u.work_bytes) for u in us], dtype=d)
        j = torch.arange(self.n)
        rows = torch.where(j[None, :] >= torch.arange(self.n)[:, None], w[None, :], torch.zeros(1, dtype=d))
        self.work = torch.zeros((self.n + 1, self.n + 1), dtype=d)
        if self.n:
            self.work[:self.n, 1:] = torch.cummax(rows, dim=1).values
        self.loss = float(units.loss_bytes)
        self.loss_saved = float(units.loss_saved_bytes)
        self.kept = bool(units.kept_outputs)
        self.inputs = float(units.input_batch_bytes)
        self.targets = float(units.target_bytes)

    def _grid(self, p, x, y):
        return p[y][None, :] - p[x][:, None]

    def memory(self, x, y, held: int, first: bool, last: bool, pending: int = 0,
               local: tuple[bool, bool] = (False, False)):
        """Memory of a stage over units [x, y) for every pair in the index vectors x (rows), y (cols).
        ``pending``: zero bubble's micro-batches between their I and W (``zb_pending``); ``local``:
        whether its neighbours before and after run on its own rank (``local_neighbours``)."""
        mem = self._grid(self.state, x, y)
        if pending:
            mem = mem + pending * self._grid(self.deferred, x, y)
        for pre, nbytes in self.ties:
            cnt = self._grid(pre, x, y)
            mem = mem - torch.clamp(cnt - 1, min=0) * nbytes
        # per micro-batch in flight: saved activations (less the received inputs the first unit
        # saves; on the last stage plus what the loss saved) and the stage's output
        act = self._grid(self.act, x, y) + (self.loss_saved if last else 0.0) - self.osaved[y][None, :]
        if not first:
            act = act - self.recv[x][:, None]
        mem = mem + in_flight(act, self.outb[y][None, :], self._grid(self.grads, x, y),
                              self.inb[x][:, None], held, self.m, self.schedule, first, last,
                              kept=self.kept)
        mem = mem + (self.inputs if first else 0.0) + (self.targets if last else 0.0)
        if not first and not local[0]:
            mem = mem + (self.m * self.inb[x])[:, None]
        if not last and not local[1]:
            mem = mem + (self.m * self.outb[y])[None, :]
        work = self.work[x][:, y]
        return mem + (torch.clamp(work, min=self.loss) if last else work)

    def cost_grid(self, x, y, mem):
        return mem if self.by_memory else self._grid(self.cost, x, y)


def solve(units: SplitUnits, stages: int, by, limits: list[float] | None, schedule: str,
          microbatches: int, stages_per_rank: int = 2):
    """Exact min-max split. Returns (bounds, bottleneck) with bounds[s] = (x, y), or None when no split
    fits the limits.

    For additive non-negative costs the programme only looks at stages whose cost is at most a cap
    U (a band around the diagonal, in blocks of rows): U = 1.25 x the lower bound max(total / K,
    largest unit), doubled twice while no split is found within it (memory limits can force larger
    stages), then no band. This is exact: an optimum of bottleneck B <= U has every stage within the band, every row on its path
    (and every row it ties with) has a value <= U and so is computed as without the band, and the
    banded values are never below the true ones."""
    t = _Tables(units, by, microbatches, schedule)
    n, k = t.n, stages
    if k > n:
        return None
    if t.cost is None or n == 0 or bool((t.cost[1:] < t.cost[:-1]).any()):
        return _solve(t, k, limits, schedule, microbatches, stages_per_rank, None)
    total = float(t.cost[-1])
    unit_max = float((t.cost[1:] - t.cost[:-1]).max())
    cap = 1.25 * max(total / k, unit_max)
    for _ in range(3):             # within the band every value is <= cap: None means not found in it
        if cap >= total:
            break
        found = _solve(t, k, limits, schedule, microbatches, stages_per_rank, cap)
        if found is not None:
            return found
        cap *= 2
    return _solve(t, k, limits, schedule, microbatches, stages_per_rank, None)


def _solve(t: "_Tables", k: int, limits, schedule: str, microbatches: int, stages_per_rank: int,
           cap: float | None, block: int = 64):
    n = t.n
    inf = float("inf")
    best = torch.full((n + 1,), inf, dtype=torch.float64)
    best[n] = 0.0
    choice: list[torch.Tensor] = [None] * k  # type: ignore[list-item]
    for s in range(k - 1, -1, -1):
        lo, hi = s, n - (k - s)                 # stage s starts in [lo, hi]
        ytop = n - (k - s - 1)
        held = held_microbatches(schedule, k, microbatches, s, stages_per_rank)
        pending = zb_pending(schedule, k, microbatches, s, stages_per_rank)
        local = local_neighbours(schedule, k, s, stages_per_rank)
        nb = torch.full((n + 1,), inf, dtype=torch.float64)
        full = torch.zeros(n + 1, dtype=torch.long)
        if cap is None:
            spans = [(lo, hi, lo + 1, ytop)]
        else:
            # y of the last stage end whose cost from x is within the cap, per row x
            xs = torch.arange(lo, hi + 1)
            reach = torch.searchsorted(t.cost, t.cost[xs] + cap * (1 + 1e-12), right=True) - 1
            spans = []
            for a in range(lo, hi + 1, block):
                b = min(a + block - 1, hi)
                y1 = min(int(reach[b - lo]), ytop)
                if y1 >= a + 1:
                    spans.append((a, b, a + 1, y1))
        for a, b, y0, y1 in spans:
            x = torch.arange(a, b + 1)
            y = torch.arange(y0, y1 + 1)
            mem = t.memory(x, y, held, s == 0, s == k - 1, pending, local)
            val = torch.maximum(t.cost_grid(x, y, mem), best[y][None, :])
            bad = y[None, :] <= x[:, None]
            if limits is not None:
                bad = bad | (mem > limits[s])
            val = val.masked_fill(bad, inf)
            row_best, arg = val.min(dim=1)
            nb[a:b + 1] = row_best
            full[a:b + 1] = y[arg]
        choice[s] = full
        best = nb
        if not bool(torch.isfinite(nb).any()):   # no stage s .. K-1 fits from any start: infeasible
            return None
    if not math.isfinite(best[0].item()):
        return None
    bounds, x = [], 0
    for s in range(k):
        y = int(choice[s][x])
        bounds.append((x, y))
        x = y
    return bounds, best[0].item()


def stage_memory(units: SplitUnits, x: int, y: int, stage: int, stages: int, schedule: str,
                 microbatches: int, stages_per_rank: int = 2) -> dict:
    """Breakdown of one stage's memory (bytes): state, activations, boundary, total."""
    us = units.units[x:y]
    held = held_microbatches(schedule, stages, microbatches, stage, stages_per_rank)
    pending = zb_pending(schedule, stages, microbatches, stage, stages_per_rank)
    dup = 0
    for tie in units.ties:
        c = sum(1 for i in tie.units if x <= i < y)
        dup += max(c - 1, 0) * tie.state_bytes
    params = sum(u.param_bytes for u in us)
    grads = sum(u.grad_bytes for u in us)
    opt = sum(u.optimizer_bytes for u in us)
    last = stage == stages - 1
    loss_saved = units.loss_saved_bytes if last else 0
    recv = min(us[0].received_saved_bytes, us[0].input_bytes) if stage > 0 else 0
    a = sum(u.saved_bytes for u in us) - recv - min(us[-1].output_saved_bytes, us[-1].output_bytes) \
        + loss_saved
    o = us[-1].output_bytes
    parts = _in_flight_parts(a, o, grads, us[0].input_bytes, held, microbatches, schedule, stage == 0,
                             last, kept=units.kept_outputs)
    local = local_neighbours(schedule, stages, stage, stages_per_rank)
    boundary = (microbatches * us[0].input_bytes if stage > 0 and not local[0] else 0) + \
        (microbatches * us[-1].output_bytes if not last and not local[1] else 0)
    work = max(u.work_bytes for u in us)
    if last:
        work = max(work, units.loss_bytes)
    state = params + grads + opt - dup
    dup, state = int(dup), int(state)
    flight = parts["activations"] + parts["outputs"] + parts["grad_overlap"] + parts["sends"] + \
        parts["kept_outputs"]
    inputs = units.input_batch_bytes if stage == 0 else 0
    targets = units.target_bytes if last else 0
    # the step's own keys only where the plan counts them (a plan without them reads as before)
    if not units.kept_outputs:
        del parts["kept_outputs"]
    step = {"inputs": inputs, "targets": targets} if units.input_batch_bytes or units.target_bytes else {}
    # zero bubble: the output gradients each I keeps for its W, for the micro-batches between them
    deferred = pending * sum(u.deferred_bytes for u in us)
    zb = {"deferred": deferred, "pending_microbatches": pending} if schedule in ZERO_BUBBLE else {}
    return {"params": params, "grads": grads, "optimizer": opt, "tied_dedup": dup, "state": state,
            "held_microbatches": held, **parts, **zb, "boundary": boundary, "working": work, **step,
            "total": state + flight + deferred + boundary + work + inputs + targets}


def _stage_sizes(units: SplitUnits, x: int, y: int, stage: int, stages: int) -> tuple[int, int, int, int, int]:
    """(a, o, grads, inb, deferred) of the stage over units [x, y): per micro-batch activations (as
    in ``stage_memory``), output and input-gradient bytes, its gradients, and what zero bubble's I
    keeps for the W per micro-batch (none on the first stage)."""
    us = units.units[x:y]
    last = stage == stages - 1
    recv = min(us[0].received_saved_bytes, us[0].input_bytes) if stage > 0 else 0
    a = sum(u.saved_bytes for u in us) - recv - min(us[-1].output_saved_bytes, us[-1].output_bytes) \
        + (units.loss_saved_bytes if last else 0)
    return a, us[-1].output_bytes, sum(u.grad_bytes for u in us), us[0].input_bytes, \
        (sum(u.deferred_bytes for u in us) if stage > 0 else 0)


def rank_memory(units: SplitUnits, plan_stages, num_stages: int, order, microbatches: int) -> int:
    """Memory of one rank holding several stages (interleaved 1F1B), from the order its schedule
    runs them: ``order`` is the rank's (stage index, "F", "B", "I" or "W") actions, as torch's
    runtime schedules list them (``pipeline_order[rank]``; zero bubble's W frees a micro-batch as a
    full backward does, its I frees nothing). The stages' state, boundary
    buffers, inputs and targets add up, working memory is the largest one's; what is in flight is
    counted after every forward, during every backward and at the end of the step, with each
    stage's counts so far (the runtime schedule keeps every send's work to the end: all outputs
    and input gradients sent so far; with kept outputs the last stage holds those of its finished
    backwards, and at the end their concatenation too, when no action's working memory is held); a
    stage's gradients exist from its first backward on. Summing each stage's own peak instead
    over-counts: they peak at different times."""
    m, last_index = microbatches, num_stages - 1
    info = {st.index: _stage_sizes(units, st.first, st.last + 1, st.index, num_stages) for st in plan_stages}
    const = sum(st.memory["state"] + st.memory["boundary"] + st.memory.get("inputs", 0)
                + st.memory.get("targets", 0) for st in plan_stages)
    work = max(st.memory["working"] for st in plan_stages)
    f = {t: 0 for t in info}
    b = dict(f)
    i = dict(f)         # zero bubble: I done (its W frees the micro-batch and what the I kept)

    def flight(doing: int | None) -> int:
        v = 0
        for t, (a, o, grads, inb, kept_for_w) in info.items():
            first, last = t == 0, t == last_index
            acts = f[t] - b[t]
            waiting = max(i[t] - b[t], 0) if not first else 0
            after_i = max(a - units.loss_saved_bytes, 0)     # the last stage's micro-batch after its I
            if last and waiting:
                # zero bubble's I on the last stage detaches the loss (and the output, when the step
                # does not keep it): what only they held goes, the loss's saved tensors with it; the
                # weight ops' saved inputs stay for the W (their nodes are held until it)
                acts -= waiting
                v += waiting * (after_i + (o if units.kept_outputs else 0))
            v += acts * a + (acts if last else f[t]) * o + (0 if first else b[t]) * inb
            v += waiting * kept_for_w
            if last and units.kept_outputs:
                v += b[t] * o
            if b[t] == 0:
                if t == doing:     # its gradients appear as this backward frees its micro-batch
                    freed = after_i + kept_for_w if last and waiting else \
                        a if (not last or units.kept_outputs) else a + o
                    v -= min(freed, grads)
                else:
                    v -= grads     # no backward yet: no gradients
        return v

    best = 0
    for t, kind in order:
        if t not in f:
            continue
        if kind in ("F", "I"):     # zero bubble's I: the micro-batch stays until its W
            best = max(best, flight(None))
            f[t] += kind == "F"
            i[t] += kind == "I"
            best = max(best, flight(None))
        else:
            best = max(best, flight(t))
            b[t] += 1
    # the end of the step: every action done (no working memory), the kept outputs concatenated
    merged = m * info[last_index][1] if last_index in info and units.kept_outputs else 0
    return int(const + max(best + work, flight(None) + merged))


def flight_counts(schedule: str, held: int, m: int, first: bool, last: bool) -> list[tuple[int, int, int]]:
    """For the backward of each micro-batch j = 0 .. M-1 on a stage: how many micro-batches'
    activations, outputs and input gradients are alive, as torch.distributed.pipelining's schedules
    keep them (a tensor handed to a send stays alive while the schedule holds the send's work or op
    list). The first entry is j = 0, when the gradients appear.

    GPipe: all M forwards run first; backward j holds M - j micro-batches' activations, and the
    outputs of all M on a stage that sends them (the forward sends' works are kept to the end), and j
    input gradients (the backward sends are waited on after the last backward).
    1F1B with W = held warm-up forwards: backward j comes after min(W + j, M) forwards, so
    min(W + j, M) - j micro-batches are in flight; the input gradient of backward j - 1 is still
    held (its op list is replaced after backward j); and with W >= 2 the warm-up's send work keeps
    the output of micro-batch W - 2 alive until the steady phase ends (backward M - W).
    Interleaved (torch's ScheduleInterleaved1F1B, a runtime schedule): ``held`` warm-up forwards
    from its own count; every send's work is kept until the step ends, so a stage that sends its
    outputs holds all it has sent (min(W + j, M) at backward j) and the j input gradients sent
    before backward j."""
    out = []
    for j in range(m):
        if schedule == "gpipe":
            acts = m - j
            outs = acts if last else m
            sends = j
        elif multi_stage(schedule):
            acts = min(held + j, m) - j
            outs = acts if last else acts + j
            sends = j
        else:
            acts = min(held + j, m) - j
            stale = schedule == "1f1b" and not last and held >= 2 and held - 2 < j <= m - held
            outs = acts + stale
            sends = min(j, 1)
        out.append((acts, outs, 0 if first else sends))
    return out


def in_flight(a, o, grads, inb, held: int, m: int, schedule: str, first: bool, last: bool,
              kept: bool = False):
    """Bytes a stage holds for micro-batches in flight at its peak: the largest over its backwards
    (``flight_counts``) of ``a`` activations and ``o`` output per micro-batch and ``inb`` bytes per
    input gradient waiting to be sent; during the first backward the gradients appear as that
    micro-batch's activations (and its output, when nothing else holds it) are freed, so that
    backward counts min(freed, gradients) less. ``kept`` (step(return_outputs=True)): the last stage
    also holds the outputs it keeps to return (``_candidates``). On the solver's tensor grids."""
    best = None
    for j, acts, outs, sends, nkept, freed in _candidates(a, o, held, m, schedule, first, last, kept):
        v = acts * a + outs * o + sends * inb + nkept * o
        if freed is not None:
            v = v - torch.minimum(freed, grads)
        best = v if best is None else torch.maximum(best, v)
    return best


def _candidates(a, o, held, m, schedule, first, last, kept: bool = False):
    """(j, activations, outputs, input gradients, kept outputs, what backward 0 frees or None) for
    the backwards that can be the peak: counts are non-negative multipliers of non-negative sizes, so
    a backward whose counts are all at most another's (j = 0 included: it also subtracts) cannot be;
    under GPipe the counts are linear in j >= 1, so the peak is at j = 0, 1 or M - 1.
    With ``kept`` on the last stage, backward j also holds the j outputs of the micro-batches whose
    backward is done (the stage keeps them to return), and j = M is the end of the step: those M
    outputs and their concatenation (M more), with the input gradients still held (the last one
    under 1F1B, all M under GPipe and interleaved). Interleaved has that end too (every sent output
    and input gradient is held until it)."""
    keeps = kept and last
    counts = [(*c, j if keeps else 0) for j, c in enumerate(flight_counts(schedule, held, m, first, last))]
    js = list(range(m)) if schedule != "gpipe" else sorted({0, min(1, m - 1), m - 1})
    if keeps or multi_stage(schedule):
        end_sends = counts[-1][2] if schedule == "1f1b" else (0 if first else m)
        counts.append((0, m if multi_stage(schedule) and not last else 0, end_sends, 2 * m if keeps else 0))
        js.append(m)

    def covered(j: int, i: int) -> bool:   # backward i holds at least what backward j does
        ci, cj = counts[i], counts[j]
        return all(x <= y for x, y in zip(cj, ci)) and (cj != ci or i < j or j == 0)

    keep = [j for j in js if not any(covered(j, i) for i in js if i not in (0, j))]
    # micro-batch 0's output outlives its backward when a pending forward send holds it
    # (the kept output is micro-batch 0's on the last stage, when the step keeps it to return)
    kept_out = keeps or (not last and (schedule == "gpipe" or multi_stage(schedule)
                                       or (schedule == "1f1b" and held == 2)))
    for j in keep:
        yield (j, *counts[j], (a if kept_out else a + o) if j == 0 else None)


def _in_flight_parts(a: int, o: int, grads: int, inb: int, held, m, schedule, first, last,
                     kept: bool = False) -> dict:
    """``in_flight`` on numbers, with the parts of the backward where it peaks (``peak_backward``
    M: the end of the step, with kept outputs)."""
    best = None
    for j, acts, outs, sends, nkept, freed in _candidates(a, o, held, m, schedule, first, last, kept):
        overlap = -min(freed, grads) if freed is not None else 0
        parts = {"peak_backward": j, "activations": acts * a, "outputs": outs * o,
                 "grad_overlap": overlap, "sends": sends * inb, "kept_outputs": nkept * o}
        v = acts * a + outs * o + sends * inb + nkept * o + overlap
        if best is None or v > best[0]:
            best = (v, parts)
    return best[1]


def build_plan(units: SplitUnits, *, stages: int, by, memory_limit, schedule: str, microbatches: int,
               stages_per_rank: int = 2, options: dict | None = None, notes=(), objective: str | None = None,
               link_bandwidth: float | None = None, optimizer_bandwidth: float | None = None,
               cuts=None):
    """Solve and package the result as a StagePlan; infeasible -> PlanError with what would work.

    ``objective``: "step_time" (the smallest predicted step time of the schedule; the default when
    the units have times), "bottleneck" (the smallest largest stage cost; the default otherwise) or
    "uniform" (equal numbers of repeated blocks per stage, the rest on the first and last: the
    split torchtitan makes by default). ``cuts``: the caller's split instead (the first unit of
    each stage after the first: unit indices or split point names, as ``plan.split_points``; a
    pipeline run passes its plan to every rank this way). ``link_bandwidth`` (bytes/s) prices the sends across cuts,
    ``optimizer_bandwidth`` (bytes/s) each rank's optimizer step; without them neither is in the
    predicted step time, and the plan says so."""
    from ..render.units import iec, parse_bytes
    from .plan import Stage, StagePlan

    if schedule not in SCHEDULES:
        raise InputError(f"schedule must be one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if not isinstance(stages, int) or stages < 1:
        raise InputError(f"stages must be a positive integer, got {stages!r}")
    if microbatches < 1:
        raise InputError(f"microbatches must be at least 1, got {microbatches}")
    if schedule == "interleaved" and (stages_per_rank < 2 or stages % stages_per_rank):
        raise InputError(f"the interleaved schedule puts {stages_per_rank} stages on each rank: stages "
                         f"({stages}) must be a multiple of stages_per_rank (at least 2)")
    if schedule == "zb" and (stages_per_rank < 1 or stages % stages_per_rank):
        raise InputError(f"the zb schedule puts {stages_per_rank} stages on each rank: stages ({stages}) must "
                         "be a multiple of stages_per_rank")
    if schedule == "zbv" and (stages_per_rank != 2 or stages % 2):
        raise InputError(f"the zbv schedule puts exactly 2 stages on each rank (stages_per_rank=2, got "
                         f"{stages_per_rank}): stages ({stages}) must be even")
    n = len(units)
    if stages > n:
        raise PlanError(f"{units.model_name} has only {n} split units "
                        f"({', '.join(u.name for u in units.units[:8])}{' ...' if n > 8 else ''}); "
                        f"it cannot be cut into {stages} stages", min_stages=None)
    timed = all(u.forward_time is not None and u.backward_time is not None for u in units.units)
    given = None if cuts is None else _given_bounds(units, stages, cuts)
    if given is not None:
        objective = "given"
    if objective is None:
        objective = "step_time" if timed and by in TIME_COSTS else "bottleneck"
    if objective not in OBJECTIVES and given is None:
        raise InputError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if objective == "step_time" and not timed:
        raise InputError("objective='step_time' needs each unit's forward and backward time: by='latency' "
                         "measures them on the real model, by='roofline' predicts them from FLOPs and bytes")
    if multi_stage(schedule) and timed:
        from .._compat import schedule_order
        schedule_order(schedule, 0, stages_per_rank, stages // stages_per_rank, microbatches)   # torch's rule
    limits = None
    if memory_limit is not None:
        raw = memory_limit if isinstance(memory_limit, (list, tuple)) else [memory_limit] * stages
        if len(raw) != stages:
            raise InputError(f"memory_limit has {len(raw)} entries for {stages} stages")
        limits = [float(parse_bytes(v)) for v in raw]
    notes = list(notes)
    device_limits = limits
    if limits is not None and multi_stage(schedule):
        # a rank holds stages_per_rank stages: each stage held to its share of the device, which is
        # sufficient (the rank's peak is at most the sum of its stages' peaks) but not necessary
        limits = [v / stages_per_rank for v in limits]
        notes.append(f"{schedule}: each stage is held to 1/{stages_per_rank} of the device's memory limit "
                     f"(a rank holds {stages_per_rank} stages; sufficient, not necessary: the rank's own "
                     "peak is in Rank memory)")
    _unit_cost(by) if by != "memory" else None   # validates ``by`` early
    found = solve(units, stages, by, limits, schedule, microbatches, stages_per_rank)
    if found is None:
        fit = solve(units, stages, "memory", None, schedule, microbatches, stages_per_rank)
        need = int(math.ceil(fit[1])) if fit else None
        k_ok = None
        for k in range(stages + 1, n + 1):
            if multi_stage(schedule) and k % stages_per_rank:
                continue
            lim_k = None if limits is None else [min(limits)] * k
            if solve(units, k, by, lim_k, schedule, microbatches, stages_per_rank) is not None:
                k_ok = k
                break
        share = stages_per_rank if multi_stage(schedule) else 1     # stages on one device
        need = need * share if need else need
        raise PlanError(
            f"no split of {units.model_name} into {stages} stages fits the memory limit "
            f"({', '.join(iec(int(v)) for v in sorted(set(device_limits or [])))}); "
            + (f"the smallest {'device' if share > 1 else 'per-stage'} limit that works with {stages} stages "
               f"is {iec(need)}" + (f" ({share} stages on each)" if share > 1 else "") if need else "")
            + (f"; with this limit the smallest stage count that works is {k_ok}" if k_ok
               else "; no stage count works with this limit"),
            min_memory=need, min_stages=k_ok)
    bounds = [x for x, _ in found[0]] + [n]
    exact = True
    times = _step_times(units, link_bandwidth, optimizer_bandwidth, notes) if timed else None

    seen: dict[tuple[int, int, int], bool] = {}     # the searches ask about the same stages often

    def fits(s: int, x: int, y: int) -> bool:
        if limits is None:
            return True
        key = (s, x, y)
        if key not in seen:
            seen[key] = _stage_total(units, x, y, s, stages, schedule, microbatches, stages_per_rank) <= limits[s]
        return seen[key]

    if objective in ("uniform", "given"):
        bounds = given or uniform_bounds(units, stages)
        over = [s for s in range(stages) if not fits(s, bounds[s], bounds[s + 1])]
        if over:
            raise PlanError(f"the {objective} split of {units.model_name} into {stages} stages does not fit the "
                            f"memory limit: stage{'s' if len(over) > 1 else ''} {', '.join(map(str, over))} "
                            "over (objective='bottleneck' or 'step_time' finds one that fits)", min_stages=None)
    elif objective == "step_time":
        from .steptime import best_step_split
        seeds = [bounds, uniform_bounds(units, stages)]   # never worse than either
        for part in ("forward_time", "backward_time"):
            alt = solve(units, stages, lambda u, p=part: getattr(u, p), limits, schedule, microbatches,
                        stages_per_rank)
            seeds.append([x for x, _ in alt[0]] + [n] if alt else None)
        best = best_step_split(times, stages, schedule, microbatches, stages_per_rank, fits, seeds)
        bounds, exact = best[0], best[2]
    cost_of = None if by == "memory" else _unit_cost(by)
    where = stage_ranks(schedule, stages, stages_per_rank)
    p = max(where) + 1
    zero_bubble = schedule in ZERO_BUBBLE
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
        out.append(Stage(index=s, first=x, last=y - 1, units=tuple(u.name for u in us),
                         cost=float(mem["total"]) if cost_of is None else sum(cost_of(u) for u in us),
                         flops=sum(u.flops for u in us), macs=sum(u.macs for u in us),
                         params=sum(u.params for u in us), memory=mem,
                         limit=int(device_limits[s]) if device_limits else None, rank=where[s], **timing))
    timeline = None
    if times is not None:
        timeline = simulate(schedule, [st.forward_time for st in out], [st.backward_time for st in out],
                            microbatches, send=[st.send_time for st in out[:-1]],
                            optimizer=[st.optimizer_time for st in out], stages_per_rank=stages_per_rank,
                            weight=[st.weight_time for st in out] if zero_bubble else None)
        if zero_bubble:
            notes.append("zero bubble: each unit's backward is split into the input's gradient (I) and the "
                         "weights' (W) by FLOPs (a weight gradient costs the forward FLOPs of the ops that read "
                         "the weight); the first stage's whole backward is W, as torch runs it")
    rank_bytes = None
    if multi_stage(schedule):
        orders = rank_orders(schedule, stages, microbatches, stages_per_rank)
        rank_bytes = tuple(
            rank_memory(units, [st for st in out if st.rank == r], stages,
                        [(a.stage, a.kind) for a in orders[r]], microbatches) for r in range(p))
    if objective == "step_time" and not exact:
        notes.append("step time: the best split a descent from the min-max splits found (too many splits "
                     "to simulate every one)")
    return StagePlan(units=units, stages=tuple(out), by=by if isinstance(by, str) else "custom",
                     schedule=schedule, microbatches=microbatches,
                     bottleneck=max(st.cost for st in out), options=dict(options or {}), notes=tuple(notes),
                     objective=objective, timeline=timeline, stages_per_rank=stages_per_rank,
                     rank_bytes=rank_bytes)


def _given_bounds(units: SplitUnits, stages: int, cuts) -> list[int]:
    n = len(units.units)
    first = {u.paths[0]: u.index for u in units.units}
    try:
        idx = [c if isinstance(c, int) else first[c] for c in cuts]
    except KeyError as e:
        raise InputError(f"cut {e.args[0]!r} is not where a split unit begins; units begin at: "
                         f"{', '.join(list(first)[:12])}{' ...' if n > 12 else ''}") from None
    bounds = [0, *idx, n]
    if len(idx) != stages - 1 or any(a >= b for a, b in zip(bounds, bounds[1:])):
        raise InputError(f"cuts must be {stages - 1} increasing unit indices in 1 .. {n - 1} (or split point "
                         f"names), got {list(cuts)!r}")
    return bounds


def _stage_total(units, x, y, s, stages, schedule, microbatches, stages_per_rank) -> float:
    return float(stage_memory(units, x, y, s, stages, schedule, microbatches, stages_per_rank)["total"])


def _step_times(units: SplitUnits, link_bandwidth, optimizer_bandwidth, notes: list):
    """Per-unit seconds for the step-time simulation, with a note for each part left out."""
    from .steptime import StepTimes
    us = units.units
    if link_bandwidth:
        send = [u.output_bytes / float(link_bandwidth) for u in us]
    else:
        send = [0.0] * len(us)
        notes.append("step time: sends across cuts not priced (give link_bandwidth, bytes/s)")
    if optimizer_bandwidth:
        opt = [(2 * u.param_bytes + u.grad_bytes + 2 * u.optimizer_bytes) / float(optimizer_bandwidth) for u in us]
    else:
        opt = [0.0] * len(us)
        notes.append("step time: the optimizer step not priced (give optimizer_bandwidth, bytes/s)")
    return StepTimes([u.forward_time for u in us], [u.backward_time for u in us], send, opt,
                     [u.backward_time * u.weight_share for u in us])


def uniform_bounds(units: SplitUnits, stages: int) -> list[int]:
    """torchtitan's default split: the longest run of units of one type (the repeated blocks) in
    equal shares (earlier stages take one more when they do not divide), the units before the run
    on the first stage and those after it on the last; without such a run of at least ``stages``
    units, equal numbers of units."""
    us, n, k = units.units, len(units.units), stages
    best = (0, 0)                      # (length, start) of the longest run of one type
    i = 0
    while i < n:
        j = i
        while j < n and us[j].type == us[i].type:
            j += 1
        if j - i > best[0]:
            best = (j - i, i)
        i = j
    length, start = best
    if length < k:
        length, start = n, 0
    q, r = divmod(length, k)
    bounds = [0]
    pos = start
    for s in range(k):
        pos += q + (1 if s < r else 0)
        bounds.append(pos)
    bounds[-1] = n                     # what follows the run goes to the last stage
    return bounds
