"""The split with the smallest predicted step time under the schedule that will run it.

The step time of a split is the longest path through the schedule's dependency graph
(``schedule.Graph``): per-stage forward and backward seconds per micro-batch, the seconds to send
a micro-batch's activations (and their gradient) across each cut, and each rank's optimizer step.
It is not a sum or a maximum over stages, so the min-max programme of ``partition.solve`` does not
minimise it (the warm-up and drain of 1F1B depend on every stage, GPipe pays its slowest forward
and its slowest backward separately, interleaved ranks run the sum of their stages, and a cut where
activations are large costs send time).

Search: when the splits number at most ``enumerate_limit`` they are all simulated (batched: one
pass over the graph evaluates thousands of candidate splits), which is exact. Beyond that, a
descent from the best min-max splits (by forward + backward time, and by forward and by backward
time alone): every move of one cut by 1, 2, 4, ... units is simulated in one batch, the best move
is taken, until no move helps. Memory limits are honoured in both: a split with a stage over its
limit is never a candidate. ``tests/planning/pipeline/test_steptime.py`` measures how often the descent
reaches the enumerated optimum.
"""

from __future__ import annotations

import itertools
import math

import torch

from .schedule import graph

__all__ = ["StepTimes", "best_step_split"]

_D = torch.float64


class StepTimes:
    """Per-unit seconds, as prefix sums: forward and backward per micro-batch, the send across a
    cut after each unit, the optimizer step, and of the backward the weights' gradients (``weight``:
    zero bubble's W; None: zero)."""

    def __init__(self, forward, backward, send_after, optimizer, weight=None) -> None:
        def prefix(v):
            return torch.cat([torch.zeros(1, dtype=_D), torch.cumsum(torch.tensor(v, dtype=_D), 0)])
        self.n = len(forward)
        self.f, self.b, self.o = prefix(forward), prefix(backward), prefix(optimizer)
        self.w = prefix(weight if weight is not None else [0.0] * self.n)
        self.send_after = torch.tensor(list(send_after), dtype=_D)

    def stage_times(self, bounds: torch.Tensor):
        """bounds [C, K+1] (0 = b0 < b1 < ... < bK = n) -> forward, backward [C, K], send [C, K-1],
        optimizer, weight [C, K]."""
        x, y = bounds[:, :-1], bounds[:, 1:]
        send = self.send_after[bounds[:, 1:-1] - 1] if bounds.shape[1] > 2 else \
            torch.zeros(bounds.shape[0], 0, dtype=_D)
        back, w = self.b[y] - self.b[x], self.w[y] - self.w[x]
        # the first stage's input needs no gradient: torch runs its whole backward as the W
        w = torch.cat([back[:, :1], w[:, 1:]], dim=1)
        return self.f[y] - self.f[x], back, send, self.o[y] - self.o[x], w


def _evaluate(g, t: StepTimes, bounds: torch.Tensor, batch: int = 4096) -> torch.Tensor:
    out = []
    for i in range(0, bounds.shape[0], batch):
        f, b, send, opt, w = t.stage_times(bounds[i:i + batch])
        out.append(g.pipeline_times(f, b, send, opt, w))
    return torch.cat(out) if out else torch.zeros(0, dtype=_D)


def best_step_split(t: StepTimes, stages: int, schedule: str, microbatches: int, stages_per_rank: int,
                    fits, seeds, enumerate_limit: int = 20000):
    """The split of ``t.n`` units into ``stages`` with the smallest simulated step time among those
    whose every stage ``fits(stage, x, y)``. ``seeds``: splits (bounds lists) to start the descent
    from (those that do not fit are skipped); the result is never slower than any seed. Returns (bounds, step time, exact) or None when no split fits."""
    n, k = t.n, stages
    if k > n:
        return None
    g = graph(schedule, k, microbatches, stages_per_rank)
    if math.comb(n - 1, k - 1) <= enumerate_limit:
        cands = [(0, *c, n) for c in itertools.combinations(range(1, n), k - 1)]
        cands = [c for c in cands if all(fits(s, c[s], c[s + 1]) for s in range(k))]
        if not cands:
            return None
        times = _evaluate(g, t, torch.tensor(cands))
        i = int(torch.argmin(times))          # the first of equal times: the earliest cuts
        return list(cands[i]), float(times[i]), True
    best, best_t = None, math.inf
    for seed in seeds:
        if seed is None or not all(fits(s, seed[s], seed[s + 1]) for s in range(k)):
            continue
        cur = tuple(seed)
        cur_t = float(_evaluate(g, t, torch.tensor([cur]))[0])
        while True:
            moves = _single_moves(cur, k, fits)
            nxt = _best_move(g, t, moves, cur_t)
            if nxt is None:           # stuck: move two cuts at once
                nxt = _best_move(g, t, _pair_moves(cur, k, fits), cur_t)
            if nxt is None:
                break
            cur, cur_t = nxt
        if cur_t < best_t:
            best, best_t = list(cur), cur_t
    if best is None:
        return None
    return best, best_t, False


def _best_move(g, t: StepTimes, moves: list, cur_t: float):
    if not moves:
        return None
    times = _evaluate(g, t, torch.tensor(moves))
    j = int(torch.argmin(times))
    if float(times[j]) >= cur_t * (1 - 1e-12):
        return None
    return moves[j], float(times[j])


def _single_moves(cur: tuple, k: int, fits) -> list:
    """Every split with one cut moved by 1, 2, 4, ... units (within its neighbours)."""
    moves = []
    for i in range(1, k):
        lo, hi = cur[i - 1] + 1, cur[i + 1] - 1
        d = 1
        while d <= max(cur[i] - lo, hi - cur[i]):
            for y in (cur[i] - d, cur[i] + d):
                if lo <= y <= hi and fits(i - 1, cur[i - 1], y) and fits(i, y, cur[i + 1]):
                    moves.append(cur[:i] + (y,) + cur[i + 1:])
            d *= 2
    return moves


def _pair_moves(cur: tuple, k: int, fits) -> list:
    """Every split with two cuts each moved by one unit."""
    moves = []
    for i in range(1, k):
        for j in range(i + 1, k):
            for di in (-1, 1):
                for dj in (-1, 1):
                    c = list(cur)
                    c[i] += di
                    c[j] += dj
                    if all(c[s] < c[s + 1] for s in range(k)) and \
                            all(fits(s, c[s], c[s + 1]) for s in {i - 1, i, j - 1, j}):
                        moves.append(tuple(c))
    return moves
