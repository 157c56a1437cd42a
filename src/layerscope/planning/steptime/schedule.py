"""The time of one training step under a pipeline schedule, predicted from per-stage times.

Each rank runs its actions (forward or backward of one micro-batch on one of its stages) in the
order torch.distributed.pipelining's schedule runs them:

- GPipe (``ScheduleGPipe``): all M forwards, then all M backwards.
- 1F1B (``Schedule1F1B``): stage s runs W = min(M, K - s) warm-up forwards, then alternates one
  backward and one forward ("1B1F") until the forwards are done, then the remaining backwards.
- Interleaved 1F1B (``ScheduleInterleaved1F1B``, v stages per rank, rank r owns stages r, r + P, ...):
  torch's own per-rank order (``PipelineSchedule.rank_order``), Megatron's depth-first warm-up.
- Zero bubble (``ScheduleInterleavedZeroBubble``: v stages per rank, placed as interleaved;
  ``ScheduleZBVZeroBubble``: two stages per rank in a V, rank r owns stages r and 2P - 1 - r):
  torch's own orders. Each backward is split in two: "I" computes the gradient of the stage's input
  (what the previous stage waits for) and "W" the gradients of its weights, which the schedule
  defers to fill what would be idle time. W of micro-batch i needs I of i on the same stage.

Which order a schedule follows is its entry's ``order`` in the schedule table (planning/config.py;
the orders themselves: planning/orders.py).

An action starts when its rank is free and its input has arrived: the forward of micro-batch i on
stage s needs stage s - 1's forward of i plus the time to send the activations across; the backward
needs stage s + 1's backward of i plus the time to send the gradient back (on the last stage, its own
forward of i: the loss is part of that stage's forward time). Sends overlap compute (torch posts them
asynchronously). The step ends when every rank is done, plus the slowest rank's optimizer step.

The simulation is the longest path through that dependency graph, computed in topological order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..config import SCHEDULES, schedule_of

__all__ = ["Action", "Block", "Graph", "Timeline", "graph", "rank_orders", "simulate", "stage_ranks", "MULTI",
           "ZERO_BUBBLE"]

FORWARD, BACKWARD, INPUT, WEIGHT = "F", "B", "I", "W"
# names of the schedules that split each backward into I and W, and of those that put several
# stages on each rank, as the table has them at import (the code here tests an entry's fields:
# ``schedule_of(name).zero_bubble``, ``.multi``)
ZERO_BUBBLE = tuple(name for name, s in SCHEDULES.items() if s.zero_bubble)
MULTI = tuple(name for name, s in SCHEDULES.items() if s.multi)


@dataclass(frozen=True, slots=True)
class Action:
    stage: int
    kind: str          # "F", "B" (full backward), "I" (input gradient) or "W" (weight gradients)
    microbatch: int


@dataclass(frozen=True, slots=True)
class Block:
    """One action on the timeline (seconds from the step's start)."""

    rank: int
    stage: int
    kind: str
    microbatch: int
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """A simulated step: every block, the step time and where the ranks idle."""

    blocks: tuple[Block, ...]
    ranks: int
    pipeline_time: float           # the last block's end
    step_time: float               # the slowest rank's last block plus its optimizer step
    busy: tuple[float, ...]        # compute seconds per rank in the pipeline part

    @property
    def bubble(self) -> float:
        """Idle share of the ranks' pipeline time: 1 - sum(busy) / (ranks x pipeline time)."""
        if self.pipeline_time <= 0:
            return 0.0
        return 1.0 - sum(self.busy) / (self.ranks * self.pipeline_time)

    def to_dict(self) -> dict:
        return {"step_time": self.step_time, "pipeline_time": self.pipeline_time, "bubble": self.bubble, "busy": list(self.busy),
                "blocks": [[b.rank, b.stage, b.kind, b.microbatch, b.start, b.end] for b in self.blocks]}


def stage_ranks(schedule: str, stages: int, stages_per_rank: int = 2) -> list[int]:
    """The rank each stage runs on: one stage per rank, or several placed in a loop (s % P) or, under a
    ``v_shape`` schedule, in a V (stage s on rank s for s < P, else 2P - 1 - s)."""
    kind = schedule_of(schedule)
    p = kind.ranks(stages, stages_per_rank)
    if kind.v_shape:
        return [s if s < p else 2 * p - 1 - s for s in range(stages)]
    return [s % p for s in range(stages)]


def rank_orders(schedule: str, stages: int, microbatches: int,
                stages_per_rank: int = 2) -> list[list[Action]]:
    """Per rank, its actions in the order torch's schedule runs them (the entry's ``order``)."""
    kind = schedule_of(schedule)
    return [[Action(st, what, mb) for st, what, mb in order]
            for order in kind.order(kind, stages, microbatches, stages_per_rank)]


class Graph:
    """The dependency graph of one step: every action, in waves of actions that can be computed
    together (each action's predecessors are in earlier waves). Built once per (schedule, stages,
    micro-batches, stages per rank) and evaluated for many candidate splits at once."""

    def __init__(self, schedule: str, stages: int, microbatches: int, stages_per_rank: int = 2) -> None:
        k, m = stages, microbatches
        self.schedule, self.stages, self.microbatches = schedule_of(schedule).name, k, m
        self.where = stage_ranks(schedule, k, stages_per_rank)
        self.ranks = max(self.where) + 1
        orders = rank_orders(schedule, k, m, stages_per_rank)
        index = {}
        acts, rank_of, prev = [], [], []
        for r, order in enumerate(orders):
            for n, a in enumerate(order):
                index[(a.stage, a.kind, a.microbatch)] = len(acts)
                acts.append(a)
                rank_of.append(r)
                prev.append(len(acts) - 2 if n else -1)
        dep, link = [], []       # the action whose output this one needs, and the boundary it crosses
        for a in acts:
            if a.kind == FORWARD:
                d = index[(a.stage - 1, FORWARD, a.microbatch)] if a.stage else -1
                link.append(a.stage - 1 if a.stage else -1)
            elif a.kind == WEIGHT:                 # its own stage's input gradient, on this rank
                d = index[(a.stage, INPUT, a.microbatch)]
                link.append(-1)
            elif a.stage == k - 1:
                d = index[(a.stage, FORWARD, a.microbatch)]
                link.append(-1)
            else:
                d = index[(a.stage + 1, a.kind, a.microbatch)]
                link.append(a.stage)
            if link[-1] >= 0 and self.where[link[-1]] == self.where[link[-1] + 1]:
                link[-1] = -1                      # both stages on one rank (zbv's turn): no send
            dep.append(d)
        # each action's wave: one more than its predecessors' (its rank's previous action and the
        # action it needs), resolved rank by rank in the ranks' own orders (torch's orders are
        # deadlock-free, so every round moves some rank on)
        level: list = [None] * len(acts)
        base = [0] * (self.ranks + 1)
        for r, order in enumerate(orders):
            base[r + 1] = base[r] + len(order)
        nxt, left = list(base[:-1]), len(acts)
        while left:
            moved = False
            for r in range(self.ranks):
                while nxt[r] < base[r + 1]:
                    i = nxt[r]
                    if dep[i] >= 0 and level[dep[i]] is None:
                        break
                    level[i] = max(level[prev[i]] + 1 if prev[i] >= 0 else 0,
                                   level[dep[i]] + 1 if dep[i] >= 0 else 0)
                    nxt[r] += 1
                    left -= 1
                    moved = True
            if not moved:
                raise AssertionError(f"the {self.schedule} order deadlocks")
        self.actions = tuple(acts)
        self.rank_of = tuple(rank_of)
        self.dep, self.link = tuple(dep), tuple(link)
        self.orders = tuple(tuple(range(base[r], base[r + 1])) for r in range(self.ranks))
        waves: dict[int, list[int]] = {}
        for i, lv in enumerate(level):
            waves.setdefault(lv, []).append(i)
        t = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
        self.waves = []
        for lv in sorted(waves):
            ids = waves[lv]
            self.waves.append((t(ids), t([prev[i] for i in ids]), t([dep[i] for i in ids]),
                               t([link[i] for i in ids]),
                               t([acts[i].stage + k * _COLUMN[acts[i].kind] for i in ids])))

    def ends(self, forward: torch.Tensor, backward: torch.Tensor, send: torch.Tensor,
             weight: torch.Tensor | None = None) -> torch.Tensor:
        """End time of every action for C candidates: ``forward``/``backward`` [C, K] seconds per
        micro-batch, ``send`` [C, K-1] seconds per boundary, ``weight`` [C, K] the part of each
        backward that computes the weights' gradients (zero bubble runs it apart as W, the rest
        as I; None: zero). Returns [C, actions]."""
        c = forward.shape[0]
        if weight is None:
            weight = torch.zeros_like(backward)
        cost = torch.cat([forward, backward, backward - weight, weight], dim=1)   # [C, 4K]
        sendp = torch.cat([send, torch.zeros(c, 1, dtype=send.dtype)], dim=1)  # index -1: no send
        end = torch.zeros(c, len(self.actions) + 1, dtype=forward.dtype)     # column -1: time 0
        for ids, prev, dep, link, col in self.waves:
            ready = torch.maximum(end[:, prev], end[:, dep] + sendp[:, link])
            end[:, ids] = ready + cost[:, col]
        return end[:, :-1]

    def pipeline_times(self, forward, backward, send, optimizer=None, weight=None) -> torch.Tensor:
        """Step time [C]: per rank, its last action's end plus its optimizer step; the slowest rank."""
        end = self.ends(forward, backward, send, weight)
        ranks = torch.tensor(self.rank_of)
        last = torch.full((end.shape[0], self.ranks), 0.0, dtype=end.dtype)
        last = last.scatter_reduce(1, ranks.expand(end.shape[0], -1), end, reduce="amax")
        if optimizer is not None:
            where = torch.tensor(self.where)
            per_rank = torch.zeros_like(last).index_add_(1, where, optimizer)
            last = last + per_rank
        return last.max(dim=1).values


_COLUMN = {FORWARD: 0, BACKWARD: 1, INPUT: 2, WEIGHT: 3}     # an action's block of cost columns


def _action_cost(a: Action, forward, backward, weight) -> float:
    if a.kind == FORWARD:
        return forward[a.stage]
    if a.kind == BACKWARD:
        return backward[a.stage]
    w = weight[a.stage] if weight is not None else 0.0
    return w if a.kind == WEIGHT else backward[a.stage] - w


def graph(schedule: str, stages: int, microbatches: int, stages_per_rank: int = 2) -> Graph:
    return _graph(schedule_of(schedule), stages, microbatches, stages_per_rank)


@functools.lru_cache(maxsize=32)
def _graph(kind, stages: int, microbatches: int, stages_per_rank: int) -> Graph:
    # keyed by the schedule's entry, not its name: an entry registered under a name another had holds
    # no stale graph
    return Graph(kind, stages, microbatches, stages_per_rank)


def simulate(schedule: str, forward: list[float], backward: list[float], microbatches: int, *,
             send: list[float] | None = None, optimizer: list[float] | None = None,
             stages_per_rank: int = 2, corun: float = 1.0, weight: list[float] | None = None) -> Timeline:
    """Simulate one step. ``forward[s]``/``backward[s]``: seconds per micro-batch on stage s (the
    last stage's forward includes the loss); ``send[s]``: seconds to send stage s's output to stage
    s + 1 (and its gradient back); ``optimizer[s]``: seconds of stage s's optimizer step, which
    its rank runs after its last backward. ``weight[s]``: of ``backward[s]``, the seconds of the
    weights' gradients (zero bubble's W; its I takes the rest); None: zero. ``corun``: how much slower a rank computes while every
    rank computes at once (ranks that share one machine's cores and memory: CPU processes), as a
    factor of its time alone; with n of P ranks computing each runs at 1 / (1 + (corun - 1)(n - 1)
    / (P - 1)) of its speed alone. 1 (the default): ranks on their own devices. A block's length
    and the busy times are then the slowed ones."""
    k = len(forward)
    g = graph(schedule, k, microbatches, stages_per_rank)
    d = torch.float64
    f, b = torch.tensor([forward], dtype=d), torch.tensor([backward], dtype=d)
    sd = torch.tensor([list(send) if send is not None else [0.0] * (k - 1)], dtype=d).reshape(1, k - 1)
    if corun > 1.0 and g.ranks > 1:
        start, end = _shared(g, forward, backward, sd[0].tolist(), corun, weight)
    else:
        w = torch.tensor([weight], dtype=d) if weight is not None else None
        end = g.ends(f, b, sd, w)[0].tolist()
        start = [e - _action_cost(a, forward, backward, weight) for e, a in zip(end, g.actions)]
    blocks, busy, last = [], [0.0] * g.ranks, [0.0] * g.ranks
    for i, a in enumerate(g.actions):
        r = g.rank_of[i]
        blocks.append(Block(r, a.stage, a.kind, a.microbatch, start[i], end[i]))
        busy[r] += end[i] - start[i]
        last[r] = max(last[r], end[i])
    opt = [0.0] * g.ranks
    for s, x in enumerate(optimizer or [0.0] * k):
        opt[g.where[s]] += x
    step = max((a + o for a, o in zip(last, opt)), default=0.0)
    return Timeline(blocks=tuple(sorted(blocks, key=lambda b: (b.rank, b.start))), ranks=g.ranks,
                    pipeline_time=max(last, default=0.0), step_time=step, busy=tuple(busy))


def _shared(g: Graph, forward, backward, send, corun: float, weight=None) -> tuple[list[float], list[float]]:
    """Start and end of every action when ranks that compute at the same time slow each other down
    (processor sharing): an event loop over the ranks' orders. Between two events every computing
    rank progresses at the speed the number of computing ranks gives; an event is an action ending
    or an input arriving."""
    n, p = len(g.actions), g.ranks
    cost = [_action_cost(a, forward, backward, weight) for a in g.actions]
    start, end = [0.0] * n, [None] * n
    pos = [0] * p                      # next action of each rank in its order
    cur: list = [None] * p             # the action a rank is computing and the work left of it
    t, left = 0.0, n
    while left:
        wake = float("inf")
        for r in range(p):
            if cur[r] is None and pos[r] < len(g.orders[r]):
                i = g.orders[r][pos[r]]
                d = g.dep[i]
                if d >= 0 and end[d] is None:
                    continue           # its input is not computed yet
                ready = end[d] + (send[g.link[i]] if g.link[i] >= 0 else 0.0) if d >= 0 else 0.0
                if ready <= t + 1e-15:
                    start[i], cur[r] = t, [i, cost[i]]
                    pos[r] += 1
                else:
                    wake = min(wake, ready)
        busy = sum(c is not None for c in cur)
        if not busy:
            if wake == float("inf"):
                raise AssertionError(f"the {g.schedule} order deadlocks")
            t = wake
            continue
        speed = 1.0 / (1.0 + (corun - 1.0) * (busy - 1) / (p - 1))
        dt = min(min(c[1] for c in cur if c is not None) / speed, wake - t)
        t += dt
        for r in range(p):
            c = cur[r]
            if c is not None:
                c[1] -= dt * speed
                if c[1] <= 1e-12 * max(1.0, cost[c[0]]):
                    end[c[0]], cur[r] = t, None
                    left -= 1
    return start, end
