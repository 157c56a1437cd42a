"""The fastest configuration that fits: a search over data parallel (FSDP2, HSDP) x tensor parallel x
pipeline parallel x checkpointing x batch splits, each candidate's memory simulated and its step time
predicted (planning/steptime/sharded_time.py).

The space. For ``gpus`` ranks and a global batch of ``G`` samples: every ``tp`` that divides a node's
GPUs and ``pp`` (at most the model's blocks) with ``dp = gpus / (tp x pp)`` dividing ``G``; the data
parallel degree as FSDP over all of it, or as HSDP (FSDP within a node, replicas across nodes) where
that differs; ``reshard_after_forward`` on and off; each checkpointing mode (``none``, ``selective-op``,
``full``); the local batch ``G / dp`` split into micro-batches of every size that divides it (without a
pipeline the rest is gradient accumulation; with one, at least ``pp`` micro-batches); each pipeline
schedule whose entry of the table is ``searched`` (planning/config.py). What the caller fixes is not searched.
Context parallel (``cp``), for token ids ``[B, S]``: every degree dividing ``gpus / tp`` whose ``2 x cp``
divides ``S`` (torch's load-balanced ring cuts a sequence into ``2 x cp`` chunks, two a rank); it takes its
ranks from the data-parallel ones (``dp = gpus / (tp x pp x cp)``). Expert parallel (``ep``), for a model
with routed experts (planning/moe.py, found from the structure): every degree dividing ``fsdp x cp x tp``
(the ranks EP borrows in torchtitan b5bcd76's mesh) and the experts' count (whole experts a rank); ep
takes no ranks of its own, so it multiplies the candidates of each data-parallel layout.

A candidate using a dimension ``parallelize`` refuses (not applied by this build:
planning/search/refusals.py asks it once a dimension), or a combination the simulation's own check
refuses on these inputs (context parallel with a pipeline: ``simulation_refuses``), is neither simulated
nor dropped: it is listed ``refused`` with that line and what is exact about it
(planning/search/sparse.py), after the ranked ones, and the walk below runs on the rest. Where
``parallelize`` applies it, such a candidate is walked as any other: under expert parallel its lower
bound (3) is the exact state alone (sparse.py: no activations, no step bound: a block's figures come
from a rank without the dimension, whose dispatch rests on the routing); under context parallel (3) and
(4) come from a block of a rank of the same degree (its ring's collectives on the critical path).

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

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from torch import nn

from ...capture.inputs import iter_tensors
from ...errors import InputError
from ..blocks import find_blocks
from ..moe import routed_experts
from ..steptime.sharded_time import FRACTIONS
from ..config import ParallelConfig
from .candidates import Candidate, SearchResult, space
from .refusals import refusals, refused_candidate, simulation_refuses, uses
from .sparse import sparse_model, stage_split
from .copies import _Evaluator
from .pool import search_pool
from .walk import walk_space

__all__ = ["SearchTask", "search"]


@dataclass(frozen=True)
class SearchTask:
    """What the search looks for: configurations of ``gpus`` GPUs training ``global_batch`` samples a step,
    within ``limit`` bytes a rank on ``gpu``; ``fixed``: the searched degrees held, ``base``: the other
    configuration fields every candidate takes; ``fractions``: the achievable fractions (None: the
    model's); ``tokens_per_sample``: for tokens/s; ``max_passes``: the simulation work after which no new
    candidate is simulated (module docstring: each left is reported as such); None: no limit; ``jobs``: the
    worker processes that simulate candidates ahead of the walk (planning/search/pool.py; None: the cores
    this process may use; 1: none), which change nothing in the answer."""

    gpus: int
    global_batch: int
    limit: int
    gpu: Any
    fixed: Mapping[str, Any] | None = None
    base: Mapping[str, Any] | None = None
    gpus_per_node: int = 8
    fractions: Mapping[str, float] | None = None
    tokens_per_sample: int | None = None
    max_passes: int | None = None
    jobs: int | None = 1


def search(model: nn.Module, args: tuple, kwargs: dict, task: SearchTask, simulate: Callable,
           progress: bool = False) -> SearchResult:
    """The search (module docstring) for ``task`` (SearchTask). ``args``/``kwargs``: a template of the inputs
    (their first dimension is replaced by each candidate's local batch); ``simulate(model, args, kwargs,
    config)`` runs planning/simulate/world.simulate_world for one configuration. The clock is read only
    to report the search's seconds: nothing it decides depends on the machine's speed."""
    gpus, global_batch, limit, gpu, max_passes = (task.gpus, task.global_batch, task.limit, task.gpu,
                                                  task.max_passes)
    gpus_per_node, fixed, base, fractions, tokens_per_sample = (task.gpus_per_node, task.fixed, task.base,
                                                                task.fractions, task.tokens_per_sample)
    t0 = time.perf_counter()
    first = next(iter(iter_tensors((args, kwargs))), None)
    if first is None or not first.dim():
        raise InputError("the search needs an input with a batch dimension (token ids [B, S], images [B, C, H, W])")
    batch0 = int(first.shape[0])
    blocks = len(find_blocks(model))
    # the expert dimension for a model with routed experts (found from its structure), the context dimension
    # for token ids [B, S] (a sequence to split)
    seq = int(first.shape[1]) if first.dim() == 2 and not first.is_floating_point() else None
    cands = space(gpus, blocks, global_batch, gpus_per_node=gpus_per_node, fixed=fixed, base=base,
                  experts=routed_experts(model), seq=seq)
    if not cands:
        raise InputError(f"no configuration of {gpus} GPUs splits a global batch of {global_batch} (every "
                         "data-parallel degree must divide it) with what was fixed")
    cands, refused = _gate(model, args, kwargs, cands, blocks, seq, limit)
    if not cands:
        raise InputError(f"no configuration of {gpus} GPUs splits a global batch of {global_batch} that this build "
                         f"can simulate: every one left uses {refused[0].why.partition('; ')[0]}")
    f = fractions or FRACTIONS
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    ev = _Evaluator(model, args, kwargs, batch0=batch0, simulate=simulate, gpu=gpu, limit=limit, fracs=f,
                    tokens_of=lambda c: tokens_per_sample * global_batch if tokens_per_sample else None)
    pool = search_pool(ev, task.jobs)
    with pool if pool is not None else contextlib.nullcontext():
        ranked, why, count, passes = walk_space(cands, pool.evaluate if pool is not None else ev, limit=limit,
                                                params=params, max_passes=max_passes, progress=progress,
                                                bounds=ev.bounds, for_bounds=lambda: ev.proxies, ahead=pool)
    ranked = ranked + tuple(refused)
    return SearchResult(ranked, why, count, time.perf_counter() - t0, global_batch, limit, ev.proxies, passes,
                        max_passes, used=tuple(sorted(getattr(ev, "used", {}).items())))


def _gate(model: nn.Module, args: tuple, kwargs: dict, cands: list[ParallelConfig], blocks: int, seq: int | None,
          limit: int) -> tuple[list[ParallelConfig], list[Candidate]]:
    """The candidates this build can simulate, and the others listed as refused with their exact figures
    (planning/search/refusals.py): with parallelize's line where it refuses a dimension, with the
    simulation's own where it refuses a combination on these inputs (``simulation_refuses``: context
    parallel with a pipeline, say), before the walk rather than as each family's error; none left: that
    line, as an InputError."""
    refused = refusals(cands)
    facts = None
    splits: dict[int, list[tuple[int, int]]] = {}
    keep, out = [], []
    for c in cands:
        d = uses(c, refused)
        why = refused[d] if d is not None else simulation_refuses(model, args, kwargs, c)
        if why is None:
            keep.append(c)
            continue
        if facts is None:
            facts = sparse_model(model, blocks)
        if c.stages not in splits:
            splits[c.stages] = stage_split(model, c.stages)
        out.append(refused_candidate(c, why, facts, splits[c.stages], seq, limit))
    return keep, out
