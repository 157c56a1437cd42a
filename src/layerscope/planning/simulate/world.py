"""Every rank of a configuration simulated (one per role), and the plan their memories make: what
``layerscope.parallel`` and the search (planning/search/space.py) both run."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...capture.guard import gc_paused
from ...capture.inputs import iter_tensors
from ...capture.loss import StepLoss
from ...capture.storage import cuda_block_size
from ...costs.cublas import workspace_rule
from ...errors import ForwardError
from ...options import dtype_short
from ..config import ParallelConfig
from ...progress import ProgressBar
from .results import ParallelPlan, RankMemory, mesh_coords, rank_memory, roles
from .sharded_rank import RankStep, simulate_rank
from .pipeline_rank import simulate_stage_rank
from .composed_rank import composed_rank, simulate_rank_composed
from .uniform_stages import rank_stages

__all__ = ["WorldRun", "simulate_world", "plan_of", "global_tokens"]


@dataclass(frozen=True)
class WorldRun:
    """How every rank of a world runs its step: what ``parallel()`` and the search hand simulate_world as
    one object. ``optimizer``: params -> Optimizer; ``loss_fn``: a callable, or a StepLoss (capture/loss.py);
    ``cuda``: CUDA ranks (512-byte blocks, cuBLAS's workspaces, foreach optimizers) or CPU ones;
    ``backend``: "nccl", "gloo" or "fake"; ``new_router()``: a fresh SdpaRouter for each simulated rank;
    ``progress``: a bar for rank 0's steps; ``target``: a tensor of the local batch for a pipeline's
    ``loss_fn(output, target)``; ``compose``: each rank without a pipeline composed from five blocks where
    it equals the whole simulation (planning/simulate/composed_rank.py), its notes saying which."""

    optimizer: Callable | None
    steps: int
    loss_fn: Any = None
    cuda: bool = True
    backend: str = "nccl"
    new_router: Callable[[], Any] | None = None
    progress: bool = False
    target: Any = None
    # ranks without a pipeline composed from five blocks (composed_rank.py): True, else simulated whole;
    # "only": else NotComposable (the search then simulates its copies)
    compose: bool | str = False
    checks: dict | None = None     # the composition's loop checks, kept across the worlds that share it (a search)
    # rank 0 alone (its role's members filled, the other roles' ranks None): the search's stand-ins, which
    # read rank 0's blocks and the roles (planning/search/copies.py ``_proxy``; under context parallel every
    # place in the ring is a role of its own: cp simulations where the stand-in reads one)
    first_only: bool = False


def simulate_world(model, args, kwargs, config: ParallelConfig, world: WorldRun):
    """Rank 0, then one rank for each other role its shard layouts reveal; every global rank's memory,
    rank 0's run, the roles, and rank 0's SDPA router (what its notes say). ``world.loss_fn``: a callable,
    or a StepLoss (capture/loss.py): without a pipeline the forward is given its labels here; a pipeline's
    last stage takes its loss per micro-batch (planning/simulate/pipeline_rank.py)."""
    factory, steps, loss_fn, cuda, backend, new_router, progress, target = (
        world.optimizer, world.steps, world.loss_fn, world.cuda, world.backend, world.new_router, world.progress,
        world.target)
    routers = []
    if isinstance(loss_fn, StepLoss) and config.pp == 1:
        args, kwargs = loss_fn.inputs(args, kwargs)

    base = RankStep(optimizer=factory, steps=steps, loss_fn=loss_fn, block_size=cuda_block_size if cuda else None,
                    gloo=backend == "gloo",
                    # torch's optimizers default to foreach on CUDA tensors only (offloaded: host ones)
                    foreach_default=cuda and not config.offload, device_type="cuda" if cuda else "cpu",
                    probe=not cuda, rng_state=0 if cuda else torch.get_rng_state().nbytes,
                    target=target if config.pp > 1 else None)

    def one(rank: int, bar):
        routers.append(new_router())
        simulate = simulate_stage_rank if config.pp > 1 else \
            functools.partial(composed_rank, checks=world.checks) if world.compose == "only" else \
            simulate_rank_composed if world.compose else simulate_rank
        step = dataclasses.replace(base, attention=routers[-1],
                                   workspace=workspace_rule(routers[-1].gpu.capability) if cuda else None,
                                   on_step=(lambda s, w: bar.advance() if w == "end" else None) if bar else None)
        try:
            return simulate(model, args, kwargs, config, rank, step)
        except ForwardError as e:
            raise ForwardError(f"{e} (simulating rank {rank} of {config.label()})", path=e.path,
                               module_type=e.module_type, input_shapes=e.input_shapes) from e.__cause__

    with gc_paused():
        bar = ProgressBar(steps, "simulating rank 0") if progress else None
        try:
            first = one(0, bar)
        finally:
            if bar is not None:
                bar.close()
        runs = {0: first}
        per_stage = config.world // config.pp
        groups: dict[int, list[int]] = {}
        for s in range(1 if world.first_only else config.pp):
            # each pipeline stage holds other parameters: its first rank is simulated, and its roles
            # come from its own shard layouts
            head = s * per_stage
            if head not in runs:
                runs[head] = one(head, None)
            for members in roles(runs[head].layouts, config).values():
                mine = [r for r in members if r // per_stage == s]
                if mine:
                    groups[mine[0]] = mine
        for rep in groups:
            if rep not in runs and not world.first_only:
                runs[rep] = one(rep, None)
    memories = {rep: rank_memory(rr, config, rep, nccl=backend == "nccl") for rep, rr in runs.items()}
    ranks: list = [None] * config.world
    for rep, members in groups.items():
        if rep not in memories:
            continue
        for r in members:
            ranks[r] = memories[rep] if r == rep else \
                dataclasses.replace(memories[rep], rank=r, coords=mesh_coords(config, r))
    return tuple(ranks), first, groups, routers[0], runs


def global_tokens(args: tuple, kwargs: dict, config: ParallelConfig) -> int | None:
    """Tokens of the global batch per step, where the first input is token ids [B, S] of the local batch."""
    first = next(iter(iter_tensors((args, kwargs))), None)
    if first is None or first.dim() != 2 or first.is_floating_point() or first.is_complex():
        return None
    return int(first.numel()) * config.dp * config.accumulation


def plan_of(config: ParallelConfig, ranks: tuple[RankMemory, ...]) -> ParallelPlan:
    peak = max(r.peak_bytes for r in ranks)
    if config.pp > 1:     # each rank's stages (several a rank under interleaved and zero-bubble schedules)
        ranks = tuple(dataclasses.replace(r, stages=tuple(rank_stages(config, r.coords.get("pp", 0)))) for r in ranks)
    return ParallelPlan(
        gpus=config.gpus, fsdp=config.fsdp, replicate=config.replicate, tp=config.tp, pp=config.pp,
        ac=config.ac + (f":{config.ac_every}" if config.ac == "selective-layer" else ""),
        microbatches=config.microbatches, accumulation=config.accumulation, local_batch=config.local_batch,
        global_batch=config.global_batch, mixed_precision=config.mixed_precision,
        reduce_dtype=dtype_short(config.reduce_dtype), model_dtype=dtype_short(config.model_dtype),
        reshard_after_forward=config.reshard_after_forward, offload=config.offload, schedule=config.schedule,
        stages=config.stages if config.pp > 1 else 1, fits=None, limit_bytes=None, peak_bytes=peak,
        over_bytes=0, ranks=ranks)
