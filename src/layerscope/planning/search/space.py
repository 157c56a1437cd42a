"""The fastest configuration that fits: a search over data parallel (FSDP2, HSDP) x tensor parallel x
pipeline parallel x checkpointing x batch splits, each candidate's memory simulated and its step time
predicted (planning/steptime/sharded_time.py).

The space. For ``gpus`` ranks and a global batch of ``G`` samples: every ``tp`` that divides a node's
GPUs and ``pp`` (at most the model's blocks) with ``dp = gpus / (tp x pp)`` dividing ``G``; the data
parallel degree as FSDP over all of it, or as HSDP (FSDP within a node, replicas across nodes) where
that differs; ``reshard_after_forward`` on and off; each checkpointing mode (``none``, ``selective-op``,
``full``); the local batch ``G / dp`` split into micro-batches of every size that divides it (without a
pipeline the rest is gradient accumulation; with one, at least ``pp`` micro-batches); each pipeline
schedule searched (1F1B, interleaved 1F1B). What the caller fixes is not searched.

A family is the candidates that share ``tp``, ``pp``, the data-parallel layout and the schedule. Its
members differ in ``reshard_after_forward``, checkpointing and micro-batch size, and both models are
monotone in those three (argued where each bound is used):

* memory. Checkpointing less (``full`` < ``selective-op`` < ``none``), a larger micro-batch, and keeping
  the gathered parameters (``reshard_after_forward`` off) each only add tensors a rank holds at once:
  activations saved instead of recomputed, larger activations, parameters held from the forward to the
  backward. So a member at least as large in all three as one that does not fit does not fit either
  (``dominated``: it is reported with the one that proves it, not simulated), provided it accumulates
  gradients if that one does: a second micro-step's forward runs beside the gradients of the first,
  which a step of one micro-step never holds (so a smaller micro-batch with accumulation can peak above
  a larger one without);
* step time. Checkpointing more adds recompute ops to the compute stream; resharding adds the
  backward's all-gathers to the communication stream; without a pipeline, a smaller micro-batch runs the
  same ops more often on smaller shapes, each op's roofline time ``max(a b + c, d b + e, launch)`` being
  no less for ``n`` calls on ``b / n`` than for one on ``b``, and FSDP2 gathers and reduces once per
  micro-batch. Neither stream's work gets smaller and program order is fixed, so the predicted step
  cannot get shorter. A member at least as slow in all three as one that fits is not simulated
  (``slower``). With a pipeline the micro-batch size changes the bubble both ways, so there only
  members of the same micro-batch size dominate each other.

Bounds across families. (1) Sharded state: every rank holds its shard of the parameters and of their
gradients, at least ``P x (4 + 4) / gpus`` bytes on the average rank under bf16 mixed precision (fp32
master weights and gradients; the model's dtype twice without it), so a configuration over the limit
by that alone cannot fit (``oom``, "at least"), whatever the optimizer adds. (2) Step time: without a
pipeline a family's first member is its fastest (no checkpointing, no resharding, the largest
micro-batch), and its predicted step time bounds every member's from below; such a family whose first
member is no faster than the best fitting plan found is not searched further (``slower``); within any
family, a member no faster than one whose step is no faster than the best is not simulated; the head's
lower bound (4) serves as well as its predicted step. (3) and (4), every candidate before it is
simulated (planning/search/bounds.py, where each is argued; without a pipeline, as one stage): a lower bound
on the peak of a rank (its parameter shards and their optimizer state, with FSDP and no resharding its
gathered stage, in a pipeline its unsharded gradients once it has run a backward, and the activations
of the micro-batches the schedule holds in flight), over the limit (``oom-bound``, "at least"); a
lower bound on its predicted step (its blocks' compute and tensor-parallel collectives through the
schedule's own simulation and its optimizer step, or the host's issue of their ops), no shorter than
the best found (``slower``). Both
come from one block's figures without a pipeline on the same micro-batch: those of a candidate the
search simulated, else the line through those of two smaller micro-batches, else micro-batches 1 and 2
simulated for them alone on a copy with two blocks (while the search's limit lasts).
A candidate whose bounds rule nothing out is simulated, the families in the order of their heads'
predicted steps or bounds. Nothing else is pruned. When the bounds rule out every candidate (all
options held, say), the one with the least excess is simulated anyway, to show it with its own.

The limit. Nothing the search decides depends on the clock (the machine's speed): its one limit,
``max_passes`` (``--search-limit``), counts simulation work, in passes of one micro-batch through one
stage (``_passes``: a candidate without a pipeline takes 1, 2 with accumulation, whose first two
micro-steps are simulated; a pipeline of S stages and M micro-batches S x M; each copy simulated for the
bounds, 1). A candidate whose passes are more than what is left is not simulated (``unsearched``, with
its lower bound where one was made: the bounds make their copies only while two passes are left); the
walk goes on with cheaper ones. When nothing has been simulated by the end, the best-bounded candidate (the least
step lower bound, else the least work) is simulated anyway, past the limit, so a search always has a
plan to show. An unsearched candidate whose step bound is no faster than the best found is ``slower``
after all; the answer is proven best when none is left unsearched (``SearchResult.proven``).

Each candidate is simulated on a copy of the model with few blocks: ``k`` and ``k + 1`` blocks per
pipeline stage (``BLOCKS``), and its per-rank memory (every part of the breakdown, every collective)
and its ranks' step seconds are extended linearly to the model's blocks. The blocks of a transformer
repeat, so every figure past the first blocks grows by the same amount per block: checked on the
70B Llama at 2 to 8 blocks (tp 8, full checkpointing: 213,942,272 B per block from 3 blocks on;
selective-op: 1,185,943,552 B from 3 on), and against the simulation of the whole model in
tests/planning/sharded/test_search.py. A model whose blocks are not one list is simulated whole.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ... import _compat
from ...capture.inputs import iter_tensors
from ...errors import ForwardError, InputError
from ..sizes import iec
from ..config import ParallelConfig
from ...progress import ProgressBar
from ..apply import find_blocks
from .bounds import (BlockFigures, PipelineBounds, block_figures, figures_at, pipeline_bounds, proxy_config, stage_numels)
from ..simulate.results import ESTIMATES, ParallelPlan, RankMemory, collectives_of
from ..simulate.pipeline_rank import stage_blocks
from ..steptime.sharded_time import FRACTIONS, RankSeconds, assemble, rank_seconds, send_bytes
from ..simulate.world import plan_of

__all__ = ["BLOCKS", "AC_SEARCHED", "SCHEDULES_SEARCHED", "Candidate", "SearchResult", "family_of", "label", "search",
           "space", "walk_space"]

BLOCKS = (3, 4)                          # blocks per stage of the two simulated copies
AC_SEARCHED = ("none", "selective-op", "full")
SCHEDULES_SEARCHED = ("1f1b", "interleaved")
_AC_MEMORY = {"full": 0, "selective-layer": 1, "selective-op": 1, "none": 2}   # more: more activations held


@dataclass(frozen=True)
class Candidate:
    """One configuration of the space and what became of it. ``status``: "fits"; "oom" (simulated, over
    the limit by ``over_bytes``); "oom-bound" (its sharded state alone is over: ``over_bytes`` at
    least); "dominated" (holds at least what ``by`` held, which did not fit); "slower" (cannot be faster
    than ``by``, which fits); "error" (the configuration cannot be built: ``why``)."""

    config: ParallelConfig
    status: str
    why: str
    plan: ParallelPlan | None = None      # simulated: per-rank memory and predicted step time
    over_bytes: int | None = None
    by: str | None = None                 # the candidate that proved a bound, by its label
    bound: float | None = None            # not simulated: its step is no shorter (seconds; planning/search/bounds.py)

    @property
    def step_time(self) -> float | None:
        return self.plan.step_time if self.plan is not None else None

    @property
    def peak_bytes(self) -> int | None:
        return self.plan.peak_bytes if self.plan is not None else None


@dataclass(frozen=True)
class SearchResult:
    candidates: tuple[Candidate, ...]     # fitting by step time, then the misses by excess, then the rest
    families: tuple[tuple[str, str], ...]  # (family, one line why it lost) for each family but the best's
    simulated: int                        # candidates simulated
    seconds: float
    global_batch: int
    limit_bytes: int
    for_bounds: int = 0                   # configurations simulated on two blocks for the bounds alone
    passes: int = 0                       # the limit's work done (_passes of the candidates simulated)
    max_passes: int | None = None         # the limit (None: none)

    @property
    def best(self) -> Candidate | None:
        return next((c for c in self.candidates if c.status == "fits"), None)

    @property
    def unsearched(self) -> tuple[Candidate, ...]:
        """The candidates the limit left that might be faster than the best (each not ruled out by a
        bound; with its step's lower bound where one was made)."""
        return tuple(c for c in self.candidates if c.status == "unsearched")

    @property
    def proven(self) -> bool:
        """The answer is the best of every configuration of the space: each other one was simulated, or
        ruled out by a bound or a dominance (what could not be built aside)."""
        return not self.unsearched and self.best is not None

    @property
    def least_bound(self) -> float | None:
        """The least step lower bound among the unsearched (seconds); None where none has one."""
        return min((c.bound for c in self.unsearched if c.bound is not None), default=None)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def family_of(c: ParallelConfig) -> str:
    """The family a candidate belongs to: its degrees, data-parallel layout and schedule."""
    dp = f"fsdp {c.fsdp}" + (f" x replicate {c.replicate}" if c.replicate > 1 else "")
    return f"tp {c.tp}, {dp}, pp {c.pp}" + (f" {c.schedule}" if c.pp > 1 else "")


def label(c: ParallelConfig) -> str:
    """A candidate's configuration in one line (its family, checkpointing, batches, resharding)."""
    batches = f"mbs {_mbs(c)}" + (f" x {c.microbatches} micro" if c.pp > 1 else f" x {c.accumulation} acc")
    return f"{family_of(c)}, ac {c.ac}, {batches}" + ("" if c.reshard_after_forward else ", no reshard")


def space(gpus: int, blocks: int, global_batch: int, *, gpus_per_node: int = 8, fixed: Mapping[str, Any] | None = None,
          base: Mapping[str, Any] | None = None) -> list[ParallelConfig]:
    """Every configuration of the space (module docstring), with ``fixed`` fields held; ``base``: the
    other fields every candidate takes (precision, dtypes, offload). A combination ParallelConfig
    refuses is left out."""
    fixed = dict(fixed or {})
    base = dict(base or {})
    out = []
    tps = [fixed["tp"]] if "tp" in fixed else [t for t in _divisors(gpus_per_node) if gpus % t == 0]
    for tp in tps:
        pps = [fixed["pp"]] if "pp" in fixed else [p for p in _divisors(gpus // tp) if p <= blocks]
        for pp in pps:
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            if global_batch % dp:
                continue
            local = global_batch // dp
            node = max(1, gpus_per_node // tp)
            layouts = [1] if dp <= node or dp % node else [1, dp // node]
            if "replicate" in fixed:
                layouts = [fixed["replicate"]]
            if "fsdp" in fixed:
                layouts = [r for r in layouts if dp // r == fixed["fsdp"]] or \
                    ([dp // fixed["fsdp"]] if dp % fixed["fsdp"] == 0 else [])
            schedules = [fixed.get("schedule", "1f1b")] if pp == 1 or "schedule" in fixed else list(SCHEDULES_SEARCHED)
            for rep in layouts:
                for sched in schedules:
                    for reshard in ([fixed["reshard_after_forward"]] if "reshard_after_forward" in fixed
                                    else [False, True]):
                        for ac in [fixed["ac"]] if "ac" in fixed else list(AC_SEARCHED):
                            for mbs in sorted(_divisors(local), reverse=True):
                                m = local // mbs
                                if pp > 1:
                                    if m < pp or fixed.get("microbatches", m) != m:
                                        continue
                                    acc = 1
                                else:
                                    m, acc = 1, local // mbs
                                    if fixed.get("accumulation", acc) != acc:
                                        continue
                                try:
                                    cfg = ParallelConfig(gpus=gpus, gpus_per_node=gpus_per_node, tp=tp, pp=pp,
                                                         replicate=rep, fsdp=dp // rep, schedule=sched, ac=ac,
                                                         microbatches=m, accumulation=acc,
                                                         local_batch=mbs * m, global_batch=global_batch,
                                                         reshard_after_forward=reshard, **base)
                                except InputError:
                                    continue
                                if pp > 1 and not _simulable(cfg.stages, blocks):
                                    continue
                                out.append(cfg)
    return out


WHOLE_BLOCKS = 8       # a model of at most this many blocks is simulated whole in any pipeline


def _simulable(stages: int, blocks: int) -> bool:
    """A pipeline whose every stage holds more than the copies' blocks (so its figures can be extended
    from them), or a small model (simulated whole): a deep pipeline of a large model with a block or two
    per stage would be simulated whole, stage by stage and micro-batch by micro-batch (minutes each)."""
    return stages <= blocks and (stages * BLOCKS[1] < blocks or blocks <= WHOLE_BLOCKS)


def _passes(c: ParallelConfig) -> int:
    """What simulating ``c`` costs in the search's limit: passes of one micro-batch through one stage
    (an accumulation is simulated with two micro-steps, _Evaluator). Each pass runs on the copies with
    ``BLOCKS`` blocks a stage, so its seconds vary within a few times with the configuration: on the 70B
    Llama on a loaded 2-core machine, 15-35 s a pass without a pipeline, 21-29 s with one (interleaved,
    8 passes), 4-15 s a two-block copy for the bounds."""
    return c.stages * max(c.microbatches, min(c.accumulation, 2))


def _resized(args: tuple, kwargs: dict, batch0: int, batch: int) -> tuple[tuple, dict]:
    """The example inputs with every tensor whose first dimension is the given batch resized to ``batch``
    (meta tensors: shapes only)."""
    def one(t):
        if t.dim() and t.shape[0] == batch0:
            return torch.empty((batch, *t.shape[1:]), dtype=t.dtype, device="meta")
        return t
    return _compat.tree_map_only(torch.Tensor, one, args), _compat.tree_map_only(torch.Tensor, one, kwargs)


def _shrunk(model: nn.Module, n: int) -> nn.Module:
    """A copy of ``model`` (its parameters shared, nothing copied: they are meta) with the first ``n`` of
    its blocks; the config's layer count follows where the model has one."""
    blocks = find_blocks(model)
    path = blocks[0][0].rpartition(".")[0]
    memo = {id(t): t for t in model.parameters()}
    memo.update({id(t): t for t in model.buffers()})
    for _, b in blocks[n:]:
        memo[id(b)] = None
    small = copy.deepcopy(model, memo)
    parent = small.get_submodule(path)
    kept = [m for m in parent if m is not None][:n]
    parent_of, _, name = path.rpartition(".")
    holder = small.get_submodule(parent_of) if parent_of else small
    setattr(holder, name, nn.ModuleList(kept))
    cfg = getattr(small, "config", None)       # the copy's own (deepcopy made it; its modules share it)
    if cfg is not None and hasattr(cfg, "num_hidden_layers"):
        cfg.num_hidden_layers = n
    return small


def _rank_blocks(config: ParallelConfig, rank: int, per_stage_blocks: list[int]) -> int:
    """Blocks the pipeline rank of global ``rank`` holds (its stages' sum)."""
    c = rank // (config.world // config.pp)
    return sum(per_stage_blocks[s] for s in range(c, config.stages, config.pp))


def _line(a: float, b: float, x1: float, x2: float, x: float) -> float:
    return a + (b - a) * (x - x1) / (x2 - x1)


def _extend_int(a: int, b: int, x1: int, x2: int, x: int) -> int:
    return max(0, round(_line(a, b, x1, x2, x)))


def _extend_memory(r1: RankMemory, r2: RankMemory, x1: int, x2: int, x: int) -> RankMemory:
    def e(a, b):
        return _extend_int(a, b, x1, x2, x)
    return dataclasses.replace(r2, peak_bytes=e(r1.peak_bytes, r2.peak_bytes),
                               simulated_peak_bytes=e(r1.simulated_peak_bytes, r2.simulated_peak_bytes),
                               peak_layer=None,
                               breakdown={k: e(r1.breakdown.get(k, 0), v) for k, v in r2.breakdown.items()},
                               collectives=_extend_collectives(r1.collectives, r2.collectives, x1, x2, x),
                               host_bytes=e(r1.host_bytes, r2.host_bytes))


def _extend_seconds(s1: RankSeconds, s2: RankSeconds, x1: int, x2: int, x: int) -> RankSeconds:
    vals = {f.name: _line(getattr(s1, f.name), getattr(s2, f.name), x1, x2, x) for f in dataclasses.fields(RankSeconds)}
    for k in ("uncounted_ops", "forward_flops"):
        vals[k] = _extend_int(getattr(s1, k), getattr(s2, k), x1, x2, x)
    return RankSeconds(**vals)


def _extend_collectives(c1: tuple, c2: tuple, x1: int, x2: int, x: int) -> tuple:
    if [c.op for c in c1] != [c.op for c in c2]:
        return c2

    def e(a, b):
        return _extend_int(a, b, x1, x2, x)
    return tuple(dataclasses.replace(b, calls=e(a.calls, b.calls), bytes_read=e(a.bytes_read, b.bytes_read),
                                     bytes_written=e(a.bytes_written, b.bytes_written),
                                     ring_bytes=e(a.ring_bytes, b.ring_bytes)) for a, b in zip(c1, c2))


class _Evaluator:
    """Simulates one candidate on the shrunk copies and extends its figures to the whole model; an
    accumulation of ``A`` micro-steps is simulated with ``min(A, 2)``: from the second micro-step on, a
    rank holds what it held in the second (FSDP2 reduce-scatters each micro-step's gradients into the
    same sharded ones), and each further micro-step adds what the second added to the step's seconds and
    collectives."""

    def __init__(self, model, args, kwargs, *, batch0: int, simulate: Callable, gpu, limit: int, fracs, tokens_of):
        self.model, self.args, self.kwargs, self.batch0 = model, args, kwargs, batch0
        self.simulate, self.gpu, self.limit, self.f, self.tokens_of = simulate, gpu, limit, fracs, tokens_of
        blocks = find_blocks(model)
        self.blocks = len(blocks)
        self.shrinkable = len({p.rpartition(".")[0] for p, _ in blocks}) == 1
        self._models: dict[int, nn.Module] = {}
        self.figures: dict[tuple, BlockFigures | None] = {}    # block figures by _figure_key
        self._numels: dict[int, tuple[list[int], list[int]]] = {}
        self.proxies = 0                                        # configurations simulated for bounds alone

    def _model(self, n: int) -> nn.Module:
        if n >= self.blocks or not self.shrinkable:
            return self.model
        if n not in self._models:
            self._models[n] = _shrunk(self.model, n)
        return self._models[n]

    def _one(self, model: nn.Module, c: ParallelConfig, args, kwargs):
        """(per-rank memory, per-role seconds, a pipeline transfer's bytes) of ``c`` on ``model``; without a
        pipeline, its blocks' figures kept for the pipelines' bounds (planning/search/bounds.py)."""
        acc = c.accumulation
        sim = dataclasses.replace(c, accumulation=min(acc, 2), global_batch=None)
        ranks, _, groups, _, runs = self.simulate(model, args, kwargs, sim)
        if c.pp == 1:
            self._keep_figures(model, sim, ranks, groups, runs)
        secs = {r: rank_seconds(rr, sim, self.gpu, self.f) for r, rr in runs.items()}
        if acc > 2:
            one = {r: rank_seconds(rr, sim, self.gpu, self.f, micro=1) for r, rr in runs.items()}
            secs = {r: _extend_seconds(one[r], secs[r], 1, 2, acc) for r in secs}
            colls = {r: _extend_collectives(collectives_of(rr, sim, micro=1), collectives_of(rr, sim), 1, 2, acc)
                     for r, rr in runs.items()}
            ranks = tuple(dataclasses.replace(m, collectives=colls.get(m.simulated_as, m.collectives)) for m in ranks)
        return ranks, secs, send_bytes(runs)

    @staticmethod
    def _figure_key(c: ParallelConfig) -> tuple:
        return c.tp, c.cp, c.ac, c.ac_every, _mbs(c), c.dp > 1

    def _keep_figures(self, model, c: ParallelConfig, ranks, groups, runs) -> None:
        key = self._figure_key(c)
        if self.figures.get(key) is not None or 0 not in runs or c.reshard_after_forward:
            return          # resharding adds ops to a block (the host's bound counts them): as the stand-ins, none
        paths = [p for p, _ in find_blocks(model)]
        fig = block_figures(runs[0], c, self.gpu, self.f, paths, nccl=ranks[0].breakdown.get(ESTIMATES[0], 0) > 0,
                            one_role=len(groups) == 1)
        if fig is not None:
            self.figures[key] = fig

    def bounds(self, c: ParallelConfig, simulate: bool = True) -> PipelineBounds | None:
        """Candidate ``c``'s lower bounds (planning/search/bounds.py), from the block figures of a
        configuration without a pipeline on its micro-batch (the same tensor parallel degree, checkpointing
        and data parallelism or none): one the search simulated; or else the line through those of the two
        largest smaller micro-batches (``figures_at``: a block's seconds and bytes are convex in the batch,
        and near linear where its ops are compute-bound), with ``simulate`` first simulating, on a copy with
        two blocks, micro-batches 1 and 2 where fewer than two are known; or else those of one smaller
        micro-batch. None: no figures, or their simulations failed."""
        if c.ac == "selective-layer" or c.cp > 1:   # selective-layer: its blocks are not alike;
            return None                             # context parallel: not checked
        mbs = _mbs(c)
        q = proxy_config(c, mbs)
        if q is None:
            return None
        key = self._figure_key(q)

        def known() -> list:       # (micro-batch, figures) of this key's kind, up to this micro-batch
            return sorted((k[4], f) for k, f in self.figures.items() if f is not None and k[:4] == key[:4]
                          and k[5] == key[5] and k[4] <= mbs)
        have = known()
        if not (have and have[-1][0] == mbs) and len(have) < 2 and simulate:
            for b in sorted({1, min(2, mbs)}):     # the two least micro-batches: their line bounds the rest
                kb = key[:4] + (b,) + key[5:]
                if kb in self.figures:
                    continue
                self.figures[kb] = None
                args, kwargs = _resized(self.args, self.kwargs, self.batch0, b)
                try:
                    self._one(self._model(2), proxy_config(c, b), args, kwargs)
                except (InputError, ForwardError):
                    pass
                self.proxies += 1
            have = known()
        return self._bounds_from(c, figures_at(have, mbs)) if have else None

    def _bounds_from(self, c: ParallelConfig, fig: BlockFigures) -> PipelineBounds:
        if self._numels.get(c.stages) is None:
            self._numels[c.stages] = (stage_numels(self.model, c.stages),
                                      stage_numels(self.model, c.stages, trainable=True))
        numels, trainable = self._numels[c.stages]
        return pipeline_bounds(c, fig, numels, self.blocks, self.f, trainable)

    def __call__(self, c: ParallelConfig) -> ParallelPlan:
        args, kwargs = _resized(self.args, self.kwargs, self.batch0, c.local_batch)
        counts = [len(r) for r in stage_blocks(self.blocks, c.stages)]
        points = [k for k in BLOCKS if k * c.stages < self.blocks] if self.shrinkable else []
        if len(points) < 2:                 # small enough to simulate whole
            ranks, secs, send = self._one(self.model, c, args, kwargs)
        else:
            (ra, sa, send), (rb, sb, _) = (self._one(self._model(k * c.stages), c, args, kwargs) for k in points)
            spr = c.stages // c.pp
            x1, x2 = points[0] * spr, points[1] * spr
            ranks = tuple(_extend_memory(a, b, x1, x2, _rank_blocks(c, a.rank, counts)) for a, b in zip(ra, rb))
            secs = {r: _extend_seconds(sa[r], sb[r], x1, x2, _rank_blocks(c, r, counts)) for r in sb if r in sa}
        st = assemble(secs, send, c, self.gpu, tokens=self.tokens_of(c), f=self.f)
        plan = plan_of(c, ranks)
        over = max(0, plan.peak_bytes - self.limit)
        return dataclasses.replace(plan, limit_bytes=self.limit, fits=over == 0, over_bytes=over,
                                   step_time=st.step_time,
                                   tokens_per_s=st.tokens_per_s / c.world if st.tokens_per_s else None,
                                   mfu=st.mfu, timing=st.to_dict())


def _mem_ge(v: ParallelConfig, u: ParallelConfig) -> bool:
    """v holds at least what u holds (same family): as much or less checkpointing, as large or larger
    micro-batches, as much or more resharding off; and accumulating if u accumulates (from its second
    micro-step on a rank holds the gradients the first left while it runs the next forward, which one
    micro-step never does: a tiny Llama's 2 x 1 peaked 89,088 B under its 1 x 2)."""
    return (_AC_MEMORY[v.ac] >= _AC_MEMORY[u.ac] and _mbs(v) >= _mbs(u)
            and (not v.reshard_after_forward or u.reshard_after_forward)
            and (v.accumulation > 1 or u.accumulation == 1))


def _time_ge(v: ParallelConfig, u: ParallelConfig) -> bool:
    """v's predicted step is no shorter than u's (same family; module docstring)."""
    mbs_ok = _mbs(v) <= _mbs(u) if v.pp == 1 else _mbs(v) == _mbs(u)
    return (_AC_MEMORY[v.ac] <= _AC_MEMORY[u.ac] and mbs_ok
            and (v.reshard_after_forward or not u.reshard_after_forward))


def _seconds(c: Candidate) -> float | None:
    """A candidate's predicted step, or else its lower bound (a pipeline not simulated whole)."""
    return c.plan.step_time if c.plan is not None else c.bound


def _mbs(c: ParallelConfig) -> int:
    return (c.local_batch or 0) // c.microbatches


def _state_bound(params: int, c: ParallelConfig) -> int:
    """Bytes the average rank holds in parameter and gradient shards alone (bound 1)."""
    per = 8 if c.mixed_precision == "bf16" else 2 * torch.empty((), dtype=c.model_dtype).element_size()
    return params * per // c.world


def _why(plan: ParallelPlan, best: ParallelPlan) -> str:
    t = getattr(plan, "timing", None) or {}
    slower = plan.step_time / best.step_time - 1 if best.step_time else 0.0
    parts = {"communication-bound (TP collectives on the critical path)": t.get("tp_comm", 0.0),
             "communication-bound (exposed data-parallel/pipeline communication)": t.get("exposed_comm", 0.0),
             "pipeline bubble": (t.get("bubble", 0.0) or 0.0) * plan.step_time,
             "host-bound (the GPU waits for eager dispatch)": t.get("host_wait", 0.0),
             "compute (recompute included)":
                 t.get("compute", 0.0) - (getattr(best, "timing", None) or {}).get("compute", 0.0)}
    reason = max(parts, key=parts.get)
    return f"{slower:+.0%} step time; {reason}"


class _Walk:
    """The search through one family after another, sharing the best plan found (module docstring)."""

    def __init__(self, ev: Callable[[ParallelConfig], ParallelPlan], limit: int, params: int,
                 max_passes: int | None, result: dict[int, Candidate],
                 bounds: Callable[[ParallelConfig, bool], PipelineBounds | None] | None = None,
                 for_bounds: Callable[[], int] | None = None) -> None:
        self.ev, self.limit, self.params, self.max_passes, self.result = ev, limit, params, max_passes, result
        self.bounds, self.for_bounds = bounds, for_bounds
        self.best: Candidate | None = None
        self.timed: list[Candidate] = []        # every simulated candidate (a predicted step time)
        self.passes = 0                         # _passes of each candidate simulated
        self.fits: dict[str, list[Candidate]] = {}
        self.ooms: dict[str, list[Candidate]] = {}

    @property
    def spent(self) -> int:
        """The limit's work done: the candidates' passes and a pass for each copy simulated for the bounds."""
        return self.passes + (self.for_bounds() if self.for_bounds is not None else 0)

    def _left(self) -> int | None:
        return None if self.max_passes is None else self.max_passes - self.spent

    def _judge(self, c: ParallelConfig, fits: list, ooms: list) -> Candidate:
        """Bound 1, then the family's dominance, then a simulation (within the search's limit)."""
        bound = _state_bound(self.params, c)
        if bound > self.limit:
            return Candidate(c, "oom-bound", f"its parameter and gradient shards alone take {iec(bound)} on the "
                             "average rank", over_bytes=bound - self.limit)
        dom = next((o for o in ooms if _mem_ge(c, o.config)), None)
        if dom is not None:
            return Candidate(c, "dominated", f"holds at least what {label(dom.config)} holds, which does not fit",
                             by=label(dom.config), over_bytes=dom.over_bytes)
        slow = next((x for x in fits if _time_ge(c, x.config)), None)
        if slow is not None:
            return Candidate(c, "slower", f"no faster than {label(slow.config)}, which fits", by=label(slow.config))
        best = self.best.plan.step_time if self.best is not None else None
        left = self._left()      # a bound may simulate two copies (micro-batches 1 and 2): only with room for both
        b = self.bounds(c, left is None or left >= 2) if self.bounds is not None else None
        if b is not None:         # bounds 3 and 4 (planning/search/bounds.py): a candidate not simulated
            if b.peak_bytes > self.limit:
                where = f"a rank at pipeline coordinate {b.rank}" if c.pp > 1 else "a rank"
                held = ("gradients and the activations of the micro-batches in flight" if c.pp > 1 else
                        "and the activations of one micro-batch")
                return Candidate(c, "oom-bound", f"{where} holds at least {iec(b.peak_bytes)} (parameter shards, "
                                 f"optimizer state, gathered parameters, {held})",
                                 over_bytes=b.peak_bytes - self.limit, bound=b.step_time)
            if best is not None and b.step_time is not None and b.step_time >= best:
                return Candidate(c, "slower", f"its step takes at least {b.step_time * 1e3:,.1f} ms (its blocks' "
                                 "compute through the schedule, or the host's issue of their kernels), no faster "
                                 "than the best found", by=label(self.best.config), bound=b.step_time)
        fam = family_of(c)
        slow = next((x for x in self.timed if best is not None and x.plan.step_time >= best
                     and family_of(x.config) == fam and _time_ge(c, x.config)), None)
        if slow is not None:          # bound 2: no faster than a member that is no faster than the best
            return Candidate(c, "slower", f"no faster than {label(slow.config)}, which predicts "
                             f"{slow.plan.step_time * 1e3:,.1f} ms, no faster than the best found",
                             by=label(self.best.config))
        left = self._left()
        if left is not None:
            if _passes(c) > left:
                at_least = f"; its step takes at least {b.step_time * 1e3:,.1f} ms" if b and b.step_time else ""
                return Candidate(c, "unsearched", ("the search's limit was spent before it" if left <= 0 else
                                 f"its simulation takes {_passes(c):,} passes, more than the {left:,} left of the "
                                 "search's limit") + at_least, bound=b.step_time if b else None)
        return self.simulate(c)

    def simulate(self, c: ParallelConfig) -> Candidate:
        self.passes += _passes(c)
        try:
            plan = self.ev(c)
        except (InputError, ForwardError) as e:
            return Candidate(c, "error", str(e).splitlines()[0])
        if plan.fits:
            return Candidate(c, "fits", "", plan=plan)
        return Candidate(c, "oom", f"over the limit by {iec(plan.over_bytes)}", plan=plan, over_bytes=plan.over_bytes)

    def _take(self, c: ParallelConfig, fits: list, ooms: list) -> Candidate:
        if id(c) in self.result:
            return self.result[id(c)]
        cand = self._judge(c, fits, ooms)
        self.result[id(c)] = cand
        if cand.plan is not None:
            self.timed.append(cand)
        if cand.status == "fits":
            fits.append(cand)
            if self.best is None or cand.plan.step_time < self.best.plan.step_time:
                self.best = cand
        elif cand.status in ("oom", "oom-bound"):
            ooms.append(cand)
        return cand

    def simulate_anyway(self) -> None:
        """Nothing simulated: the best-bounded candidate the limit left (the least step bound, else the
        least work) simulated past it, or, all ruled out by bounds, the nearest miss, to show it with its
        own figures and excess."""
        left = [c for c in self.result.values() if c.status == "unsearched"]
        pick = min(left, key=lambda c: (c.bound is None, c.bound or 0.0, _passes(c.config)), default=None)
        if pick is None:
            pick = min((c for c in self.result.values() if c.status == "oom-bound"), key=lambda c: c.over_bytes,
                       default=None)
        if pick is None:
            return
        got = self.simulate(pick.config)
        if got.plan is None and pick.status != "unsearched":
            return
        self.result[id(pick.config)] = got
        if got.plan is not None:
            self.timed.append(got)
        if got.status == "fits":
            self.best = got

    def lists(self, fam: list[ParallelConfig]) -> tuple[list, list]:
        key = family_of(fam[0])
        return self.fits.setdefault(key, []), self.ooms.setdefault(key, [])

    def head(self, fam: list[ParallelConfig]) -> Candidate:
        """The family's fastest member (no checkpointing, no resharding, the largest micro-batch)."""
        return self._take(fam[0], *self.lists(fam))

    def family(self, fam: list[ParallelConfig]) -> None:
        """After its head: bound 2 on the head (without a pipeline), its leanest member (does anything
        fit?), then per checkpointing mode and resharding, fastest first, the largest micro-batch that fits,
        found by bisection (memory grows with the micro-batch); with a pipeline every smaller micro-batch
        that fits too (its bubble shrinks)."""
        fits, ooms = self.lists(fam)
        first = self.result[id(fam[0])]
        if first.status == "error":
            for c in fam[1:]:
                self.result[id(c)] = Candidate(c, "error", first.why)
            return
        head = _seconds(first)
        if head is not None and self.best is not None and self.best is not first and fam[0].pp == 1 and \
                head >= self.best.plan.step_time:
            # bound 2: nothing in the family is faster than its fastest member (without a pipeline: with one,
            # more micro-batches may shrink the bubble more than they cost, so the head bounds nothing); the
            # head's predicted step, or else its lower bound
            what = "predicts" if first.plan is not None else "takes at least"
            for c in fam[1:]:
                self.result.setdefault(id(c), Candidate(
                    c, "slower", f"its family's fastest member ({label(fam[0])}) {what} "
                    f"{head * 1e3:,.1f} ms, no faster than the best found", by=label(self.best.config)))
            return
        lean = min(fam, key=lambda c: (_AC_MEMORY[c.ac], not c.reshard_after_forward, _mbs(c)))
        if self._take(lean, fits, ooms).status in ("oom", "oom-bound"):
            for c in fam:           # every member holds at least what the leanest holds
                self._take(c, fits, ooms)
            return
        combos: dict[tuple, list[ParallelConfig]] = {}
        for c in fam:               # fam is fastest first: so are the combinations and their members
            combos.setdefault((c.ac, c.reshard_after_forward), []).append(c)
        for members in combos.values():
            head = self._take(members[0], fits, ooms)
            if head.status in ("fits", "slower") or len(members) == 1:
                continue
            lo, hi = 1, len(members) - 1          # members[hi] is the smallest micro-batch
            while lo < hi:                        # the first (largest micro-batch) that fits
                mid = (lo + hi) // 2
                st = self._take(members[mid], fits, ooms).status
                if st == "fits":
                    hi = mid
                elif st in ("oom", "oom-bound", "dominated"):
                    lo = mid + 1
                else:
                    break
            got = self._take(members[lo], fits, ooms)
            if got.status == "fits" and members[lo].pp > 1:
                for c in members[lo + 1:]:        # a smaller micro-batch: a smaller bubble, maybe faster
                    self._take(c, fits, ooms)
        for c in fam:
            self._take(c, fits, ooms)


def walk_space(cands: list[ParallelConfig], evaluate: Callable[[ParallelConfig], ParallelPlan], *, limit: int,
               params: int, max_passes: int | None = None, progress: bool = False,
               bounds: Callable[[ParallelConfig, bool], PipelineBounds | None] | None = None,
               for_bounds: Callable[[], int] | None = None):
    """The search over ``cands`` with ``evaluate(config) -> plan`` (fits, over_bytes, step_time) and
    ``bounds(config, may_simulate)``, a pipeline's lower bounds or None (``for_bounds()``: how many
    configurations it simulated so far), simulating at most ``max_passes`` (module docstring; None: no
    limit): the candidates ranked (fitting by step time, the misses by excess, the rest), each family's line
    why it lost, how many were evaluated and the limit's work done."""
    count = [0]

    def ev(c):
        count[0] += 1
        return evaluate(c)
    families: dict[str, list[ParallelConfig]] = {}
    for c in cands:
        families.setdefault(family_of(c), []).append(c)
    # each family fastest first (no checkpointing, no resharding, the largest micro-batch): its first is its bound
    for fam in families.values():
        fam.sort(key=lambda c: (-_AC_MEMORY[c.ac], c.reshard_after_forward, -_mbs(c)))
    # without a pipeline first, then the pipelines cheapest to simulate first (the limit's order)
    order = sorted(families, key=lambda k: (families[k][0].pp > 1, _passes(families[k][0]), families[k][0].tp,
                                            families[k][0].replicate))
    result: dict[int, Candidate] = {}
    fam_why: dict[str, str] = {}
    walk = _Walk(ev, limit, params, max_passes, result, bounds, for_bounds)
    bar = ProgressBar(len(order), "searching configurations") if progress else None
    try:
        # every family's head first (its lower bound, memory aside), then the families in the order of
        # their heads' step times: the best plan is found early and bound 2 cuts the rest
        # (without a pipeline, then the pipelines: their simulations cost the most, so the limit
        # reaches them last)
        for group in ([k for k in order if families[k][0].pp == 1], [k for k in order if families[k][0].pp > 1]):
            heads = {key: walk.head(families[key]) for key in group}
            timed = sorted(group, key=lambda k: (_seconds(heads[k]) is None, _seconds(heads[k]) or 0.0))
            for key in timed:
                walk.family(families[key])
                if bar is not None:
                    bar.advance()
        if not walk.timed:
            walk.simulate_anyway()
    finally:
        if bar is not None:
            bar.close()
    best = walk.best
    if best is not None:      # the limit left these, but their bounds are no faster than the best found
        for k, c in list(result.items()):
            if c.status == "unsearched" and c.bound is not None and c.bound >= best.plan.step_time:
                result[k] = Candidate(c.config, "slower", f"its step takes at least {c.bound * 1e3:,.1f} ms, no "
                                      "faster than the best found", by=label(best.config), bound=c.bound)
    out = [result.get(id(c)) or Candidate(c, "unsearched", "not reached") for c in cands]
    fitting = sorted((c for c in out if c.status == "fits"), key=lambda c: c.plan.step_time)
    misses = sorted((c for c in out if c.status in ("oom", "oom-bound", "dominated")),
                    key=lambda c: (c.over_bytes is None, c.over_bytes or 0))
    rest = [c for c in out if c.status not in ("fits", "oom", "oom-bound", "dominated")]
    for key, fam in families.items():
        if best is not None and family_of(best.config) == key:
            continue
        mine = [result.get(id(c)) or Candidate(c, "unsearched", "not reached") for c in fam]
        fit = [c for c in mine if c.status == "fits"]
        if fit and best is not None:
            fam_why[key] = _why(min(fit, key=lambda c: c.plan.step_time).plan, best.plan)
        elif mine and all(c.status in ("oom", "oom-bound", "dominated") for c in mine):
            least = min((c for c in mine if c.status == "oom"), key=lambda c: c.over_bytes, default=None)
            bound = min((c for c in mine if c.status == "oom-bound"), key=lambda c: c.over_bytes, default=None)
            fam_why[key] = (f"out of memory: its leanest simulated member ({label(least.config)}) is over by "
                            f"{iec(least.over_bytes)}" if least is not None else
                            f"out of memory: every member over by at least {iec(bound.over_bytes)} (the lower "
                            f"bound of {label(bound.config)})" if bound is not None else "out of memory")
        elif any(c.status == "unsearched" for c in mine):
            left = [c for c in mine if c.status == "unsearched"]
            least = min((c.bound for c in left if c.bound is not None), default=None)
            fam_why[key] = (f"{len(left)} of its {len(fam)} members not simulated within the search's limit"
                            + (f" (the least of their lower bounds: {least * 1e3:,.1f} ms)" if least is not None
                               else ""))
        elif any(c.status == "slower" for c in mine) and best is not None:
            head = result.get(id(fam[0]))
            if head is not None and head.plan is not None and head.plan.step_time >= best.plan.step_time:
                fam_why[key] = "its fastest member, memory aside: " + _why(head.plan, best.plan)
            elif fam[0].pp == 1 and head is not None and head.status == "slower" and head.bound is not None and \
                    not any(c.status in ("oom", "oom-bound", "dominated") for c in mine):
                fam_why[key] = (f"no faster than the best: its fastest member's step takes at least "
                                f"{head.bound * 1e3:,.1f} ms (a lower bound)")
            else:
                over = (f" (its fastest over by {'at least ' if head.status == 'oom-bound' else ''}"
                        f"{iec(head.over_bytes)})" if head is not None and head.over_bytes else "")
                fam_why[key] = f"its members faster than the best do not fit{over}; the rest are no faster"
        elif any(c.status == "error" for c in mine):
            fam_why[key] = next(c.why for c in mine if c.status == "error")
        else:
            fam_why[key] = "not searched (the search's limit)"
    return tuple(fitting + misses + rest), tuple(fam_why.items()), count[0], walk.spent


def search(model: nn.Module, args: tuple, kwargs: dict, *, gpus: int, global_batch: int, limit: int, gpu,
           simulate: Callable, fixed: Mapping[str, Any] | None = None, base: Mapping[str, Any] | None = None,
           gpus_per_node: int = 8, fractions: Mapping[str, float] | None = None, tokens_per_sample: int | None = None,
           progress: bool = False, max_passes: int | None = None) -> SearchResult:
    """The search (module docstring). ``args``/``kwargs``: a template of the inputs (their first dimension
    is replaced by each candidate's local batch); ``simulate(model, args, kwargs, config)`` runs
    parallel.world.simulate_world for one configuration; ``limit``: a rank's memory in bytes;
    ``tokens_per_sample``: for tokens/s. ``max_passes``: the simulation work after which no new candidate
    is simulated (module docstring: each left is reported as such); None: no limit. The clock is read only
    to report the search's seconds: nothing it decides depends on the machine's speed."""
    t0 = time.perf_counter()
    first = next(iter(iter_tensors((args, kwargs))), None)
    if first is None or not first.dim():
        raise InputError("the search needs an input with a batch dimension (token ids [B, S], images [B, C, H, W])")
    batch0 = int(first.shape[0])
    blocks = len(find_blocks(model))
    cands = space(gpus, blocks, global_batch, gpus_per_node=gpus_per_node, fixed=fixed, base=base)
    if not cands:
        raise InputError(f"no configuration of {gpus} GPUs splits a global batch of {global_batch} (every "
                         "data-parallel degree must divide it) with what was fixed")
    f = fractions or FRACTIONS
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    ev = _Evaluator(model, args, kwargs, batch0=batch0, simulate=simulate, gpu=gpu, limit=limit, fracs=f,
                    tokens_of=lambda c: tokens_per_sample * global_batch if tokens_per_sample else None)
    ranked, why, count, passes = walk_space(cands, ev, limit=limit, params=params, max_passes=max_passes,
                                            progress=progress, bounds=ev.bounds, for_bounds=lambda: ev.proxies)
    return SearchResult(ranked, why, count, time.perf_counter() - t0, global_batch, limit, ev.proxies, passes,
                        max_passes)
