"""The optimal contiguous split of units into pipeline stages, under per-stage memory limits.

Objective: minimise the bottleneck, the largest stage cost (the pipeline's throughput is set by its
slowest stage). Constraint: each stage's memory fits its device. A stage's memory depends on where
it sits (how many micro-batches the schedule keeps in flight there) and on its first and last unit
(the boundary buffers), so it is not a plain sum and greedy splitting is not exact. The solver is a
dynamic programme over (stage, first unit):

    best[s][x] = min over y > x of  max(cost_s(x, y), best[s + 1][y])   with  mem_s(x, y) <= limit_s

evaluated a whole row of ``y`` at a time with tensors: O(K·n²) work, exact for any costs (ties between
equal bottlenecks go to the earliest cut). A stage's memory, per the schedule, is ``memory.py``'s
model.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ...errors import InputError
from .stage_memory import held_microbatches, in_flight, local_neighbours, zb_pending
from .units import SplitUnits, Unit

__all__ = ["solve", "uniform_bounds", "given_bounds", "unit_cost", "COSTS", "OBJECTIVES", "TIME_COSTS"]

COSTS = ("flops", "macs", "params", "memory", "latency", "roofline")
TIME_COSTS = ("latency", "roofline")        # costs that are seconds: the step time can be predicted
OBJECTIVES = ("step_time", "bottleneck", "uniform")   # and "given": the caller's cuts


def unit_cost(by) -> Callable[[Unit], float]:
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

    def __init__(self, units: SplitUnits, by, microbatches: int, schedule: str) -> None:
        us = units.units
        self.n = len(us)
        d = torch.float64

        def prefix(vals):
            return torch.cat([torch.zeros(1, dtype=d), torch.cumsum(torch.tensor(vals, dtype=d), 0)])

        self.by_memory = by == "memory"
        self.cost = None if self.by_memory else prefix([unit_cost(by)(u) for u in us])
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


def given_bounds(units: SplitUnits, stages: int, cuts) -> list[int]:
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
