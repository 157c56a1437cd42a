"""The step-time lower bound of planning/search/bounds.py: no configuration's predicted step (the step-time
model's, planning/steptime/sharded_time.py ``assemble``) is shorter, from one block's figures and those of
the modules outside the blocks (``BlockFigures``), without simulating the configuration.

What the model does. Each pipeline coordinate's simulated rank (its role) is walked over its ops on two
streams (``rank_seconds``); the role's forward seconds ``F`` (every forward op, the loss too), backward
``B``, tensor-parallel collectives ``TP`` and the GPU's waits for the host ``H`` are shared evenly among
its stages and micro-batches: each stage's forward takes ``fw = (F + H_f + TP F / (F + B)) / M`` a
micro-batch, its backward ``bw`` the like, ``M`` = micro-batches x stages a rank; the role's exposed FSDP
communication ``e = max(0, end - M (fw + bw))`` (``end`` the walk's two streams' end) and its optimizer
step follow its last action. The schedule's simulation (planning/steptime/schedule.py) is a longest path
through the actions' fixed dependency graph, so the step is the largest, over the graph's paths, of the
seconds of the path's actions plus the optimizer step and ``e`` of the rank it ends on (and the sends:
none counted here, each at least 0). Without a pipeline the step is ``end`` plus the optimizer step: the
path through its one rank's actions.

What is known of each role ``c``, holding ``n`` blocks and, with the first stage, the modules before the
blocks (the embedding) and, with the last, those after them (the final norm and the head; not the loss,
which a pipeline computes apart), over ``m`` micro-batches of the configuration's size:

* ``fw >= Lf = (n f + f_outer) / s`` and ``bw >= Lb``, the like, where ``f`` is a block's forward
  compute (``BlockFigures.forward``, the least of the proxy's blocks), ``s`` the stages a rank: ``F`` is
  no less than its blocks' and outer modules' forward ops over the micro-batches, ``H`` and ``TP`` are at
  least 0;
* ``M (fw + bw) = F + B + TP + H >= C = m (n (f + b + t) + outer)``: the blocks' and outer modules'
  compute and tensor-parallel collectives (the walk puts each of them on the compute stream);
* ``e >= E - M (fw + bw)``, ``E`` a lower bound on ``end``: (i) the host's issue of every op of the
  role's blocks and outer modules over the micro-batches, but one block's (which may trail the last op
  that takes seconds), at ``host_op_seconds`` an op: the walk runs no op before the host issued it; (ii)
  in a pipeline with FSDP, ``C`` plus the reduce-scatter of one of its stages' gradients: torch's schedule
  runs every backward with gradient sync off and, after a stage's last backward, reduce-scatters the
  gradients it accumulated (``perform_reduce_grad``; torch's runtime schedules put it right after the
  stage's last backward): the role's last such reduction is issued after every compute op of the role,
  so the walk starts it no earlier than the compute stream's time then, at least ``C``, and its
  reduce-scatters of the stage's parameters (each FSDP unit's, one after the other on the communication
  stream) end no earlier than their seconds later. Their bytes: the stage's trainable elements over the
  tensor-parallel degree (a shard is no smaller) in the reduce dtype or the model's, the smaller (what
  FSDP2 accumulates), ``(n - 1) / n`` of it through each rank of the FSDP group, priced as
  ``collective_seconds`` prices it on the group's link, with one call's latency. HSDP's all-reduce across
  replicas, after it, is not counted;
  (iii) without a pipeline, with FSDP, the seconds of every collective the walk puts on its communication
  stream, one after the other there (``rank_seconds``: each all-gather starts after the one before, each
  reduce-scatter after it too): each micro-step, FSDP2 (reshard after backward, torch's default) gathers
  every parameter in the forward, those of the blocks it resharded after the forward once more in the
  backward (at least all but one block's: every block's own group, not the root's), and reduce-scatters
  the trainable ones' gradients: their bytes counted as in (ii), the gathers' in the compute dtype, at
  least ``numel / tp`` elements a rank (a replicated parameter is no smaller), with one call's latency a
  micro-step (more calls take no less). HSDP's all-reduce, the same stream's, is not counted;
  (iv) without a pipeline, with FSDP, the compute stream held back by FSDP2's gathers. The walk starts
  an all-gather no earlier than where the compute stream stood when the one before it was issued, and
  the compute waits for it right away (``rank_seconds``: ``start = max(tn, issue, host)``, ``tc =
  max(tc, tn)``, ``issue = tc``); a reduce-scatter starts no earlier than the compute stream then, and
  the next gather no earlier than its end. FSDP2 gathers each block in its pre-forward, with the block's
  forward ops between one block's gather and the next: across each of those ``n - 1`` steps the compute
  stream moves on by at least ``max(f, g)`` (``g`` a block's gather, priced as in (iii)), and the last
  block's forward follows. Resharded after the forward, FSDP2 gathers each block again in its
  pre-backward, before any of the block's backward ops (only its own copies come first, left out of
  ``b``), runs the block's backward, reduce-scatters its gradients in its post-backward, and then
  gathers the next block, which waits for that reduce-scatter on the stream: across each of those ``n -
  1`` steps the compute stream moves by at least ``b + r + g`` (``r`` a block's reduce-scatter). Not
  resharded, it moves by the ``n - 1`` backwards. Either way the last block's backward and its
  reduce-scatter follow, and each micro-step repeats it all (the next one's first gather waits for the
  stream). The least block's elements (and trainable ones) price ``g`` and ``r``;
* without data parallelism ``M (fw + bw) >= E`` (i) as well: with no FSDP nothing runs on the communication
  stream for the compute to wait for (tensor parallel's collectives are on the compute stream), so the
  walk's compute stream ends at exactly ``F + B + TP + H``, no earlier than the host's issue.

The bound. For a path ``P``, the least of its seconds over every (``fw``, ``bw``, ``e``) that meets these
is a lower bound on the step, as the model's own values meet them. A role's part of a path with ``a``
forwards and ``b`` backwards of its stages, ending on it (``z`` = 1) or not (0), is
``a fw + b bw + z e``: for a given ``u = fw + bw`` (at least ``u0 = max(Lf + Lb, C / M)``) it is least at
``a Lf + b Lb + min(a, b) (u - Lf - Lb) + z max(0, E - M u)``, a convex function of ``u``, least at
``u0`` or at ``E / M``. The paths held: for each rank, micro-batch 0's forwards through the stages before
its first, then every action of the rank, then its optimizer step (with ``z`` = 1 and ``a = b = M`` its
part is ``max(M u0, E)``: its compute and TP collectives, or the host's issue, or its compute and last
reduction); and the schedule's critical path with (``fw``, ``bw``, ``e``) at three points that meet the
constraints (the excess of ``u0`` over ``Lf + Lb`` given to the forward in proportion, wholly, or not at
all), each path then held to its least as above. Under the zero bubble schedules the model splits no
weight gradient off a backward (its ``I`` takes the backward's seconds, its ``W`` none), and so here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ParallelConfig
from ..steptime.schedule import graph
from ..steptime.sharded_time import collective_seconds, host_op_seconds, link_of

__all__ = ["chain_seconds", "reduce_seconds", "step_bound", "stream_seconds"]


@dataclass(frozen=True)
class _Role:
    """What is known of one pipeline coordinate's role (module docstring), per stage and micro-batch."""

    lf: float       # a stage's forward, at least
    lb: float       # its backward
    u0: float       # the two together
    end: float      # the walk's end over the step (E)
    opt: float      # the optimizer step


def reduce_seconds(trainable: int, c: ParallelConfig, gpu, f, grad: int) -> float:
    """The least seconds of the reduce-scatters of a stage's ``trainable`` elements of gradients, ``grad``
    bytes each, over the FSDP group of ``c`` (module docstring, (ii))."""
    n = c.fsdp * c.cp           # FSDP's group: dp_shard x cp under context parallel
    if trainable <= 0 or n <= 1:
        return 0.0
    whole = trainable // c.tp * grad
    return collective_seconds(whole * (n - 1) / n, n, link_of(c, "fsdp"), gpu, f)


def stream_seconds(numel: int, trainable: int, regathered: int, c: ParallelConfig, gpu, f, compute: int,
                   grad: int) -> float:
    """The least seconds of FSDP2's communication stream over a step without a pipeline (module docstring,
    (iii)): each micro-step gathers every parameter (``numel`` elements, at least ``numel / tp`` a rank, in
    the ``compute`` dtype's bytes), again in the backward those of the blocks resharded after the forward
    (``regathered``: all but one block's), and reduce-scatters the ``trainable`` elements' gradients
    (``grad`` bytes each), ``(n - 1) / n`` of each through a rank of the FSDP group of ``n``, each call
    no faster than one carrying its bytes alone."""
    n = c.fsdp * c.cp
    if n <= 1 or c.pp > 1:
        return 0.0
    gathered = (numel + (regathered if c.reshard_after_forward else 0)) // c.tp * compute
    whole = gathered + trainable // c.tp * grad
    return c.accumulation * collective_seconds(whole * (n - 1) / n, n, link_of(c, "fsdp"), gpu, f)


def chain_seconds(c: ParallelConfig, fig, blocks: int, numel: int, trainable: int, gpu, f, compute: int,
                  grad: int) -> float:
    """The least seconds of the compute stream's end over a step without a pipeline, held back by FSDP2's
    gathers one block at a time (module docstring, (iv)): ``blocks`` alike blocks of at least ``numel``
    elements, ``trainable`` of them with gradients, ``fig`` their forward and backward (BlockFigures)."""
    n = c.fsdp * c.cp
    if n <= 1 or c.pp > 1 or blocks < 2:
        return 0.0
    link = link_of(c, "fsdp")
    gather = collective_seconds(numel // c.tp * compute * (n - 1) / n, n, link, gpu, f)
    reduce = collective_seconds(trainable // c.tp * grad * (n - 1) / n, n, link, gpu, f) if trainable else 0.0
    forward = (blocks - 1) * max(fig.forward, gather) + fig.forward
    backward = ((blocks - 1) * (fig.backward + reduce + gather) if c.reshard_after_forward
                else (blocks - 1) * fig.backward) + fig.backward + reduce
    return c.accumulation * (forward + backward)


def _roles(c: ParallelConfig, fig, full: list[int], m: int, f, reduce: list[float], opt: list[float],
           where: list[int], stream: float = 0.0) -> list[_Role]:
    k = c.stages
    spr = k // c.pp
    big_m = m * spr
    per_op = host_op_seconds(c, f)
    out = []
    for r in range(c.pp):
        mine = [s for s in range(k) if where[s] == r]
        n = sum(full[s] for s in mine)
        outer = [o for s, o in ((0, fig.first), (k - 1, fig.last)) if s in mine]
        of, ob = sum(o.forward for o in outer), sum(o.backward for o in outer)
        lf, lb = (n * fig.forward + of) / spr, (n * fig.backward + ob) / spr
        total = m * (n * (fig.forward + fig.backward + fig.tp) + of + ob + sum(o.tp for o in outer))
        host = per_op * max(0, m * (n * fig.ops + sum(o.ops for o in outer)) - fig.ops)
        last = min((reduce[s] for s in mine), default=0.0)
        # without data parallelism the role's actions hold the host's waits whole (module docstring)
        floor = host if c.dp * c.cp == 1 else 0.0      # under context parallel FSDP shards over cp
        out.append(_Role(lf, lb, max(lf + lb, total / big_m, floor / big_m), max(total + last, host, stream),
                         opt[r]))
    return out


def _held(path: list[int], g, roles: list[_Role], pp: int, big_m: int) -> float:
    """The least seconds of ``path`` (action indices of ``g``, the last on the rank it ends on) over every
    value the constraints allow (module docstring)."""
    a, b = [0] * pp, [0] * pp
    for i in path:
        act = g.actions[i]
        c = act.stage % pp                 # whose seconds a stage's actions take (assemble: stage st on st % pp)
        if act.kind == "F":
            a[c] += 1
        elif act.kind != "W":              # a whole backward, or zero bubble's input gradient
            b[c] += 1
    end = g.rank_of[path[-1]]
    total = roles[end].opt
    for c, ro in enumerate(roles):
        z = 1 if c == end else 0
        if not (a[c] or b[c] or z):
            continue

        def part(u: float) -> float:
            return (a[c] * ro.lf + b[c] * ro.lb + min(a[c], b[c]) * (u - ro.lf - ro.lb)
                    + z * max(0.0, ro.end - big_m * u))
        total += min(part(ro.u0), part(max(ro.u0, ro.end / big_m)))
    return total


def _critical(g, points: list[tuple[list[float], list[float], list[float]]]) -> list[list[int]]:
    """The schedule's critical path at each point (each stage's forward and backward seconds, each rank's
    seconds after its last action) with no sends: from the rank that ends last back through whichever of
    its previous action and the action it needs ended later. One evaluation of the graph for them all."""
    d = torch.float64
    k = len(points[0][0])
    ends = g.ends(torch.tensor([p[0] for p in points], dtype=d), torch.tensor([p[1] for p in points], dtype=d),
                  torch.zeros(len(points), k - 1, dtype=d)).tolist()
    pos = {i: n for order in g.orders for n, i in enumerate(order)}
    paths = []
    for row, (_, _, tail) in zip(ends, points):
        rank = max(range(g.ranks), key=lambda r: row[g.orders[r][-1]] + tail[r])
        i = g.orders[rank][-1]
        path = []
        while i >= 0:
            path.append(i)
            order = g.orders[g.rank_of[i]]
            prev = order[pos[i] - 1] if pos[i] else -1
            dep = g.dep[i]
            i = prev if dep < 0 or (prev >= 0 and row[prev] >= row[dep]) else dep
        paths.append(path[::-1])
    return paths


def step_bound(c: ParallelConfig, fig, full: list[int], opt: list[float], f, reduce: list[float] | None = None,
               stream: float = 0.0) -> float:
    """The least step of candidate ``c`` (module docstring) from ``fig`` (BlockFigures), ``full`` (the
    model's blocks in each stage), ``opt`` (each pipeline coordinate's least optimizer seconds),
    ``reduce`` (each stage's least final reduce-scatter seconds, ``reduce_seconds``; None: none) and
    ``stream`` (without a pipeline, the least seconds of FSDP2's communication stream, ``stream_seconds``,
    or of the compute stream it holds back, ``chain_seconds``, the larger)."""
    k = c.stages
    spr = k // c.pp
    m = c.microbatches if c.pp > 1 else c.accumulation
    g = graph(c.schedule, k, m, spr)
    roles = _roles(c, fig, full, m, f, reduce or [0.0] * k, opt, list(g.where), stream if c.pp == 1 else 0.0)
    big_m = m * spr
    paths = []
    index = {(a.stage, a.kind, a.microbatch): i for i, a in enumerate(g.actions)}
    for r in range(g.ranks):      # micro-batch 0's forwards up to the rank, then all of the rank's actions
        first = g.actions[g.orders[r][0]].stage
        paths.append([index[(s, "F", 0)] for s in range(first)] + list(g.orders[r]))
    points = []
    for share in (None, 0.0, 1.0):   # the critical path at three points the constraints allow
        fw, bw, tail = [0.0] * k, [0.0] * k, [0.0] * g.ranks
        for r, ro in enumerate(roles):
            extra = ro.u0 - ro.lf - ro.lb
            w = share if share is not None else (ro.lf / (ro.lf + ro.lb) if ro.lf + ro.lb > 0 else 0.5)
            for st in range(r, k, c.pp):
                fw[st], bw[st] = ro.lf + w * extra, ro.lb + (1 - w) * extra
            tail[r] = max(0.0, ro.end - big_m * ro.u0) + ro.opt
        points.append((fw, bw, tail))
    paths += _critical(g, points)
    return max(_held(p, g, roles, c.pp, big_m) for p in paths)
