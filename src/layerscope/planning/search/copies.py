"""One candidate simulated on copies of the model with ``BLOCKS`` blocks per pipeline stage (more where the
model's first blocks are unlike the rest: ``copy_points``), its per-rank
memory, seconds and collectives extended linearly to the model's blocks (planning/search/space.py's
docstring: the blocks of a transformer repeat)."""

from __future__ import annotations

import copy
import dataclasses
from typing import Callable

import torch
from torch import nn

from ... import _compat
from ...capture.regions import NotComposable
from ...errors import ForwardError, InputError
from ..config import ParallelConfig
from ..blocks import find_blocks
from .bounds import (BlockFigures, PipelineBounds, block_figures, figures_at, one_role, outer_paths, pipeline_bounds,
                     least_block, proxy_config, regathered, stage_numels)
from ..simulate.results import ESTIMATES, ParallelPlan, RankMemory, collectives_of
from ..simulate.uniform_stages import stage_blocks
from ..steptime.sharded_time import RankSeconds, assemble, rank_seconds, send_bytes
from ..simulate.world import plan_of
from .candidates import BLOCKS, _mbs
from .sparse import sparse_state_bytes, stage_split

__all__ = []


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


def _signature(block: nn.Module) -> tuple:
    """What a block is made of: its type and its parameters' names and shapes."""
    return type(block).__name__, tuple((n, tuple(p.shape)) for n, p in block.named_parameters())


def alike_from(model: nn.Module) -> int:
    """The first block from which every block is alike (``_signature``): 0 for a Llama; 3 for DeepSeek-V3,
    whose first three blocks (``first_k_dense_replace``) have a dense MLP and the rest routed experts."""
    sigs = [_signature(b) for _, b in find_blocks(model)]
    f = len(sigs) - 1
    while f > 0 and sigs[f - 1] == sigs[-1]:
        f -= 1
    return f


def copy_points(head: int) -> tuple[int, int]:
    """The copies' blocks per stage: ``BLOCKS``, or past a head of ``head`` blocks unlike the rest, enough
    of the rest that a rank peaks at the same place, among blocks alike the rest, in both copies. Extending
    from ``k`` to ``k + 1`` blocks must add one block's worth of state and nothing else, and a rank's peak
    in the backward spans a block's neighbours (FSDP2 gathers the next block while one runs, and
    reduce-scatters the last one's gradients). DeepSeek-V3 671B on fsdp 512 (3 dense blocks, then MoE;
    2026-11-29), each difference extended x (61 - k): copies of 3 and 4 blocks put the first MoE block's
    transient (its experts gathered, 22.5 GB in bf16) in the difference: 6.39 TB a rank; 4 and 5: 3.98 TB;
    5 and 6: 1.51 TB (the 5-block copy peaked at block 3, beside a dense block, 189.3 GB; the 6-block one
    at block 4, 212.9 GB: the peak moved, its 23.6 GB of unsharded gradients in the difference); 6 and 7:
    both past it."""
    if head == 0:
        return BLOCKS
    k = max(BLOCKS[0], head + 3)
    return k, k + 1


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
        self.head = alike_from(model)                 # blocks unlike the rest at the front (copy_points)
        self.points = copy_points(self.head)
        self.shrinkable = len({p.rpartition(".")[0] for p, _ in blocks}) == 1
        self._models: dict[int, nn.Module] = {}
        self.figures: dict[tuple, BlockFigures | None] = {}    # block figures by _figure_key
        self._numels: dict[int, tuple[list[int], list[int]]] = {}
        self._blocks: tuple | None = None           # bounds.regathered and bounds.least_block of the model
        self._splits: dict[int, list[tuple[int, int]]] = {}     # per stage count: (dense, routed) elements
        self.proxies = 0                                        # configurations simulated for bounds alone
        self.remote = None          # the search's worker processes, where it has them (planning/search/pool.py)

    def _model(self, n: int) -> nn.Module:
        if n >= self.blocks or not self.shrinkable:
            return self.model
        if n not in self._models:
            self._models[n] = _shrunk(self.model, n)
        return self._models[n]

    def _one(self, model: nn.Module, c: ParallelConfig, args, kwargs, figures_only: bool = False):
        """(per-rank memory, per-role seconds, a pipeline transfer's bytes) of ``c`` on ``model``; without a
        pipeline, its blocks' figures kept for the pipelines' bounds (planning/search/bounds.py);
        ``figures_only``: those alone (a stand-in's), nothing returned."""
        acc = c.accumulation
        sim = dataclasses.replace(c, accumulation=min(acc, 2), global_batch=None)
        ranks, _, groups, _, runs = self.simulate(model, args, kwargs, sim)
        if c.pp == 1:
            self._keep_figures(model, sim, ranks, groups, runs)
        if figures_only:
            return None
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
        # the last: FSDP2's mixed precision rather than autocast's (FSDP shards over cp: bounds.proxy_config)
        return c.tp, c.cp, c.ac, c.ac_every, _mbs(c), c.dp > 1 or c.cp > 1

    def _keep_figures(self, model, c: ParallelConfig, ranks, groups, runs) -> None:
        key = self._figure_key(c)
        if self.figures.get(key) is not None or 0 not in runs or c.reshard_after_forward or c.ep > 1:
            # resharding adds ops to a block (the host's bound counts them): as the stand-ins, none; a rank with
            # expert parallel runs other blocks than the candidates without (sparse.py bounds those); one with
            # context parallel keeps its figures under its own degree (the key's), for candidates of that degree
            return
        paths = [p for p, _ in find_blocks(model)]
        fig = block_figures(runs[0], c, self.gpu, self.f, paths, nccl=ranks[0].breakdown.get(ESTIMATES[0], 0) > 0,
                            one_role=one_role(groups, c), outer=outer_paths(model, paths))
        if fig is not None:
            self.figures[key] = fig

    def bounds(self, c: ParallelConfig, simulate: bool = True) -> PipelineBounds | None:
        """Candidate ``c``'s lower bounds (planning/search/bounds.py), from the block figures of a
        configuration without a pipeline on its micro-batch (the same tensor parallel degree, checkpointing
        and data parallelism or none): one the search simulated; or else the line through those of the two
        largest smaller micro-batches (``figures_at``: a block's seconds and bytes are convex in the batch,
        and near linear where its ops are compute-bound), with ``simulate`` first simulating, on a copy with
        two blocks, micro-batches 1 and 2 where fewer than two are known; or else those of one smaller
        micro-batch; or else, none known (not simulated, or their simulations failed), those that need no
        block's figures (``_no_figures``: the state, and without a pipeline FSDP's collectives alone).
        None: checkpointing every few blocks, or one rank."""
        if c.ep > 1:       # no block figures of a rank with it (its dispatch rests on the routing): the state alone
            return self._sparse_bounds(c)
        if c.ac == "selective-layer":  # its blocks are not alike
            return None
        mbs = _mbs(c)
        q = proxy_config(c, mbs)
        if q is None:
            return None
        key = self._figure_key(q)

        def known() -> list:       # (micro-batch, figures) of this key's kind, up to this micro-batch
            return sorted((k[4], f) for k, f in self.figures.items() if f is not None and k[:4] == key[:4]
                          and k[5] == key[5] and k[4] <= mbs)
        for p in self.proxies_needed(c) if simulate else ():
            self.figures[self._figure_key(p)] = None
            try:
                self._proxy(p)
            except (InputError, ForwardError):
                pass
            self.proxies += 1
        have = known()
        return self._bounds_from(c, figures_at(have, mbs) if have else self._no_figures(c))

    def _no_figures(self, c: ParallelConfig) -> BlockFigures:
        """Figures that bound every block's from below before any is known: no seconds, no activations, no
        workspace, the optimizer's least state ratio any simulated rank held (as ``_sparse_bounds``). From
        them ``pipeline_bounds`` gives the state a rank holds (its shards, their optimizer state, with FSDP not
        resharded its gathered stage, in a pipeline its unsharded gradients) and, without a pipeline, a step
        no shorter than FSDP's collectives (bounds.py, step_bound.py (iii), (iv), each block's compute 0);
        the search rules a candidate out on them before it simulates stand-ins for its figures."""
        ratio = min((f.optimizer_ratio for f in self.figures.values() if f is not None), default=0.0)
        return BlockFigures(forward=0.0, backward=0.0, saved=0, ops=0, optimizer_ratio=ratio, optimizer_per_byte=0.0,
                            workspaces=0, nccl=False, one_role=c.pp == 1)

    def proxies_needed(self, c: ParallelConfig) -> list[ParallelConfig]:
        """The configurations ``bounds(c)`` would simulate now, for their figures alone: the two least
        micro-batches (their line bounds the rest) where fewer than two up to ``c``'s are known."""
        mbs = _mbs(c)
        q = proxy_config(c, mbs) if c.ep == 1 and c.ac != "selective-layer" else None
        if q is None:
            return []
        key = self._figure_key(q)
        have = sorted(k[4] for k, f in self.figures.items() if f is not None and k[:4] == key[:4]
                      and k[5] == key[5] and k[4] <= mbs)
        if (have and have[-1] == mbs) or len(have) >= 2:
            return []
        return [proxy_config(c, b) for b in sorted({1, min(2, mbs)}) if key[:4] + (b,) + key[5:] not in self.figures]

    def _proxy(self, q: ParallelConfig) -> None:
        """``q`` (a ``proxy_config``) simulated for its block figures (kept), here or in the search's worker
        processes: on a copy with two blocks alike the rest past any unlike head, whose least block covers
        both kinds."""
        if self.remote is not None:
            return self.remote.proxy(q)
        args, kwargs = _resized(self.args, self.kwargs, self.batch0, q.local_batch)
        # rank 0 alone where ``simulate`` can (``simulate.first``): its blocks' figures are rank 0's
        plain, self.simulate = self.simulate, getattr(self.simulate, "first", self.simulate)
        try:
            self._one(self._model(self.head + 2), q, args, kwargs, figures_only=True)
        finally:
            self.simulate = plain

    def _sparse_bounds(self, c: ParallelConfig) -> PipelineBounds:
        """A candidate with expert parallel: the state its ranks hold at least
        (planning/search/sparse.py), with the optimizer's least state ratio any simulated rank held; no
        step bound."""
        if c.stages not in self._splits:
            self._splits[c.stages] = stage_split(self.model, c.stages)
        ratio = min((f.optimizer_ratio for f in self.figures.values() if f is not None), default=0.0)
        return PipelineBounds(sparse_state_bytes(c, self._splits[c.stages], ratio), None, 0, activations=False)

    def _bounds_from(self, c: ParallelConfig, fig: BlockFigures) -> PipelineBounds:
        if self._numels.get(c.stages) is None:
            self._numels[c.stages] = (stage_numels(self.model, c.stages),
                                      stage_numels(self.model, c.stages, trainable=True))
        numels, trainable = self._numels[c.stages]
        if self._blocks is None:
            self._blocks = regathered(self.model), least_block(self.model)
        return pipeline_bounds(c, fig, numels, self.blocks, self.f, trainable, self.gpu, *self._blocks)

    def __call__(self, c: ParallelConfig) -> ParallelPlan:
        """Candidate ``c``'s plan. Without a pipeline, where ``simulate`` has a ``composed`` form
        (``simulate.composed(model, args, kwargs, config)``: simulate_world with WorldRun.compose "only"),
        the whole model's ranks composed from five blocks, equal to its whole simulation
        (planning/simulate/composed_rank.py); where it refuses (NotComposable), and for pipelines, the two
        copies extended linearly. ``self.used`` counts which ("composed", "copies", "whole"), for the
        search's notes."""
        args, kwargs = _resized(self.args, self.kwargs, self.batch0, c.local_batch)
        counts = [len(r) for r in stage_blocks(self.blocks, c.stages)]
        points = [k for k in self.points if k * c.stages < self.blocks] if self.shrinkable else []
        used = self.__dict__.setdefault("used", {"composed": 0, "copies": 0, "whole": 0})
        composed = getattr(self.simulate, "composed", None) if c.pp == 1 and len(points) >= 2 else None
        done = None
        if composed is not None:
            plain, self.simulate = self.simulate, composed
            try:
                done = self._one(self.model, c, args, kwargs)
            except NotComposable:
                done = None
            finally:
                self.simulate = plain
        if done is not None:
            ranks, secs, send = done
            used["composed"] += 1
        elif len(points) < 2:                 # small enough to simulate whole
            ranks, secs, send = self._one(self.model, c, args, kwargs)
            used["whole"] += 1
        else:
            used["copies"] += 1
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
