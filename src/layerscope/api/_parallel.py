"""parallel(): the per-rank memory of a sharded-training configuration (FSDP2, HSDP, tensor parallel,
checkpointing, mixed precision), simulated with torch's own distributed code on a fake process group
(parallel/simulate.py)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch
from torch import nn

from ..capture.attention import resolve_gpu, router_for
from ..capture.guard import gc_paused
from ..capture.prepare import check_model, example_inputs, materialize_lazy
from ..capture.storage import cuda_block_size
from ..costs.cublas import workspace_rule
from ..capture.inputs import iter_tensors
from ..errors import ForwardError, InputError
from ..formats.exported import refuse_exported
from ..options import MemoryOptions, ParallelConfig, dtype_short, optimizer_factory, optimizer_name
from ..parallel.results import ESTIMATES, ParallelPlan, RankMemory, mesh_coords, rank_memory, roles
from ..parallel.apply import checkpoint_blocks, no_kv_cache
from ..parallel.simulate import meta_copy, simulate_rank
from ..parallel.stages import simulate_stage_rank
from ..progress import ProgressBar
from ..render.units import parse_bytes
from ..render.views import ParallelReport
from ._memory import memory_with

__all__ = ["parallel"]



def _local_batch(args: tuple, kwargs: dict) -> int | None:
    first = next(iter(iter_tensors((args, kwargs))), None)
    return int(first.shape[0]) if first is not None and first.dim() else None


_RUN_OPTIONS = {"steps": 2, "loss_fn": None, "target": None, "input_size": None, "dtypes": None, "device": "cuda",
                "progress": False, "forward_kwargs": None, "backend": None}
_BACKENDS = {"cuda": ("nccl", "fake"), "cpu": ("gloo", "fake")}


def parallel(model: nn.Module, *args: Any, gpus: int = 1, fsdp: int | None = None, tp: int = 1, pp: int = 1,
             ac: str = "none", optimizer="adamw", gpu=None, memory_limit=None, config: ParallelConfig | None = None,
             **kwargs: Any) -> ParallelReport:
    """What each of ``gpus`` ranks holds when they train ``model`` sharded: its peak, when, and by part
    (parameter shards, gathered parameters, gradients, optimizer state, activations, recompute,
    communication buffers, temporaries, and estimates of what a CPU cannot show), and the bytes of
    each collective. ``args``/``kwargs``: one data-parallel rank's local batch (``input_ids`` of
    [B, S] is B samples per rank and step).

    The configuration: ``config=ParallelConfig(...)``, or its fields as keywords: ``fsdp`` (default:
    the ranks the other degrees leave), ``replicate`` (HSDP), ``tp``, ``pp``, ``ac``,
    ``mixed_precision`` ("bf16", the default: fp32 master weights and optimizer state, bf16 compute,
    gradients reduced in ``reduce_dtype``; "off": all in ``model_dtype``), ``reshard_after_forward``,
    ``accumulation``, ``global_batch``, ``gpus_per_node``; with ``pp`` > 1, ``schedule`` ("gpipe" or
    "1f1b") and ``microbatches`` (default ``pp``): each pipeline stage (the uniform split of the
    model's blocks, parallel/stages.py) is simulated on its first rank, its micro-batches in the
    schedule's order, as torch's PipelineStage runs them. The run: ``steps`` (2), ``loss_fn``
    (``loss_fn(output)``; with ``pp`` > 1 the output of one micro-batch), ``target`` (a tensor of the
    local batch: then ``loss_fn(output, target)``, split into micro-batches with the inputs as torch's
    schedule splits it), ``input_size``/``dtypes`` (example inputs built as analyze() does), ``device`` (the ranks' device:
    "cuda", the default, rounds to 512-byte allocator blocks, holds cuBLAS's two workspaces and adds
    the estimate of NCCL's buffers; "cpu": gloo ranks, as on this machine), ``backend`` (default nccl
    for cuda, gloo for cpu: gloo's all-gathers copy through a flat buffer of their own; "fake": no
    backend buffers, to compare with a real step on torch's fake backend), ``progress``. ``gpu`` names the GPU
    (its memory is the limit unless ``memory_limit`` is given). Other keywords go to the forward (a
    forward argument named like an option: ``forward_kwargs={...}``). Every rank lets go of the model's
    output once the loss is computed, as torchtitan's train step does. With every degree 1 nothing is
    wrapped, and the figures are ``memory(..., keep_output=False)``'s for the same model, dtypes and
    options.
    """
    run = {k: kwargs.pop(k, v) for k, v in _RUN_OPTIONS.items()}
    fields = {f.name for f in dataclasses.fields(ParallelConfig)} - {"local_batch"}
    given = {k: kwargs.pop(k) for k in list(kwargs) if k in fields}
    kwargs = {**kwargs, **(run["forward_kwargs"] or {})}
    if config is None:
        config = ParallelConfig(gpus=gpus, fsdp=fsdp, tp=tp, pp=pp, ac=ac, **given)
    elif given or gpus != 1 or fsdp is not None or tp != 1 or pp != 1 or ac != "none":
        raise InputError("give the configuration either as config= or as keywords, not both")
    steps, loss_fn, input_size, dtypes, device, progress, backend, target = (
        run[k] for k in ("steps", "loss_fn", "input_size", "dtypes", "device", "progress", "backend", "target"))
    if target is not None:
        if loss_fn is None or not isinstance(target, torch.Tensor):
            raise InputError("target= is a tensor of the local batch for a loss_fn(output, target)")
        if config.pp == 1:
            loss_fn = functools.partial(_with_target, loss_fn, target)
    check_model(model)
    refuse_exported(model, "parallel")
    if device not in ("cuda", "cpu"):
        raise InputError(f"device is the ranks' device, cuda or cpu, got {device!r}")
    backend = backend or _BACKENDS.get(device, ("",))[0]
    if backend not in _BACKENDS.get(device, ()):
        raise InputError(f"backend for {device} ranks is {' or '.join(_BACKENDS.get(device, ()))}, got {backend!r}")
    if gpu is not None and device != "cuda":
        raise InputError("gpu= names a CUDA GPU: leave device at 'cuda'")
    args = example_inputs(args, kwargs, input_size, dtypes, None, torch.device("meta"), "parallel")
    materialize_lazy(model, args, kwargs)
    local = _local_batch(args, kwargs)
    config = dataclasses.replace(config, local_batch=local) if local is not None and config.local_batch is None \
        else config
    factory = optimizer_factory(optimizer)
    cuda = device == "cuda"
    named = resolve_gpu(gpu) if gpu is not None else None

    def new_router():      # one per simulated rank: each counts its own SDPA calls
        # the ranks run on fake CPU tensors here, also where CUDA is at hand: CUDA ranks are always routed
        return router_for(named or resolve_gpu(None) if cuda else None, "auto", simulated=True, cuda_target=cuda,
                          autocast_device="cpu")
    limit = parse_bytes(memory_limit) if memory_limit is not None else (named.memory if named is not None else None)
    options = {"device": device, "backend": backend, "gpu": named.name if named is not None else None,
               "optimizer": optimizer_name(factory), "steps": steps, "allocation_block": 512 if cuda else 1}
    notes: list[str] = []
    if config.trivial:
        plan, notes = _one_device(model, args, kwargs, config, factory, steps, loss_fn, cuda, gpu)
    else:
        ranks, rr, roles_of, router = _simulate(model, args, kwargs, config, factory, steps, loss_fn, cuda,
                                                backend, new_router, progress, target)
        plan = _plan(config, ranks)
        if len(roles_of) == 1:
            notes.append(f"every rank holds the same shard sizes: rank 0 was simulated for all {config.world}")
        elif config.pp > 1:
            notes.append(f"{len(roles_of)} roles (the pipeline stages of each of the {config.pp} pipeline ranks, the "
                         "uniform split of the blocks, and within them ranks whose shards differ in size): ranks "
                         + ", ".join(str(r) for r in roles_of) + " were simulated")
        else:
            notes.append(f"{len(roles_of)} roles (ranks whose shards differ in size, where a dimension does not "
                         "divide evenly): ranks " + ", ".join(str(r) for r in roles_of) + " were simulated")
        if rr.run.log is not None:
            notes += [n.replace("Use simulate=False to track the real step", "--run trains it for real")
                      .replace("Use simulate=False to track a real step", "--run trains it for real")
                      for n in rr.run.log.notes()]
        if rr.run.known is not None:
            notes += rr.run.known.notes()
        if router is not None:
            notes += router.notes(passes=len(rr.run.passes) or 1)
        if cuda and gpu is None:
            notes.append(f"no GPU named: attention is priced with the {router.gpu.name}'s rules and there is no "
                         "memory limit to fit (give gpu= / --gpu, or memory_limit=)")
        if cuda:
            notes.append("the CUDA caching allocator's fragmentation is not estimated (its 512-byte rounding is "
                         "simulated); NCCL's buffers are an estimate, on a line of its own")
        if config.offload:
            host = max(r.host_bytes for r in plan.ranks)
            notes.append(f"CPU offload: the sharded parameters, their reduced gradients and the optimizer's step and "
                         f"state live in the host's memory, {host:,} B per rank at most, not in the peak"
                         if cuda else "CPU offload changes nothing on CPU ranks: the host's memory is their device's")
        late = max(r.breakdown.get(ESTIMATES[1], 0) for r in plan.ranks)
        if late:
            notes.append(f"gloo's reduce-scatter all-reduces a clone of its input that its worker thread may free "
                         f"after the step has gone on: up to {late:,} B more, an estimate on a line of its own")
    if limit is not None:
        over = max(0, plan.peak_bytes - limit)
        plan = dataclasses.replace(plan, limit_bytes=limit, fits=over == 0, over_bytes=over)
    return ParallelReport(model_name=type(model).__name__, options=options, plans=(plan,), notes=tuple(notes))


def _with_target(loss_fn, target, output):
    return loss_fn(output, target)


def _simulate(model, args, kwargs, config: ParallelConfig, factory, steps, loss_fn, cuda: bool, backend: str,
              new_router, progress, target=None):
    """Rank 0, then one rank for each other role its shard layouts reveal; every global rank's memory,
    rank 0's run, the roles, and rank 0's SDPA router (what its notes say)."""
    routers = []

    def one(rank: int, bar):
        routers.append(new_router())
        simulate = simulate_rank if config.pp == 1 else functools.partial(simulate_stage_rank, target=target)
        try:
            return simulate(model, args, kwargs, config, rank, optimizer=factory, steps=steps, loss_fn=loss_fn,
                            block_size=cuda_block_size if cuda else None, gloo=backend == "gloo",
                            # torch's optimizers default to foreach on CUDA tensors only (offloaded: host ones)
                            foreach_default=cuda and not config.offload, device_type="cuda" if cuda else "cpu",
                            probe=not cuda, workspace=workspace_rule(routers[-1].gpu.capability) if cuda else None,
                            attention=routers[-1], rng_state=0 if cuda else torch.get_rng_state().nbytes,
                            on_step=(lambda s, w: bar.advance() if w == "end" else None) if bar else None)
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
        for s in range(config.pp):
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
            if rep not in runs:
                runs[rep] = one(rep, None)
    memories = {rep: rank_memory(rr, config, rep, nccl=backend == "nccl") for rep, rr in runs.items()}
    ranks: list = [None] * config.world
    for rep, members in groups.items():
        for r in members:
            ranks[r] = memories[rep] if r == rep else \
                dataclasses.replace(memories[rep], rank=r, coords=mesh_coords(config, r))
    return tuple(ranks), first, groups, routers[0]


def _plan(config: ParallelConfig, ranks: tuple[RankMemory, ...]) -> ParallelPlan:
    peak = max(r.peak_bytes for r in ranks)
    return ParallelPlan(
        gpus=config.gpus, fsdp=config.fsdp, replicate=config.replicate, tp=config.tp, pp=config.pp,
        ac=config.ac + (f":{config.ac_every}" if config.ac == "selective-layer" else ""),
        microbatches=config.microbatches, accumulation=config.accumulation, local_batch=config.local_batch,
        global_batch=config.global_batch, mixed_precision=config.mixed_precision,
        reduce_dtype=dtype_short(config.reduce_dtype), model_dtype=dtype_short(config.model_dtype),
        reshard_after_forward=config.reshard_after_forward, offload=config.offload, schedule=config.schedule,
        stages=config.stages if config.pp > 1 else 1, fits=None, limit_bytes=None, peak_bytes=peak,
        over_bytes=0, ranks=ranks)


def _one_device(model, args, kwargs, config: ParallelConfig, factory, steps, loss_fn, cuda: bool, gpu):
    """Every degree 1: no wrapping at all; memory()'s step of the model in the configuration's dtypes
    (mixed precision bf16 there is autocast over fp32 weights, as one device trains)."""
    dtype = torch.float32 if config.mixed_precision == "bf16" else config.model_dtype
    copy = meta_copy(model, dtype)
    no_kv_cache(copy)
    checkpoint_blocks(copy, config)
    opts = MemoryOptions(optimizer=factory, autocast_dtype=torch.bfloat16 if config.mixed_precision == "bf16" else None,
                         device="cuda" if cuda else "cpu", steps=steps, accumulation=config.accumulation,
                         loss_fn=loss_fn, gpu=gpu, keep_output=False)
    rep = memory_with(copy, args, kwargs, opts)
    step = rep.peak_step
    parts = {"sharded parameters": step.breakdown["parameter"], "gathered parameters": 0,
             "gradients": step.breakdown["gradient"], "optimizer state": step.breakdown["optimizer_state"],
             "activations": step.breakdown["activation"], "recompute": 0, "communication buffers": 0,
             "inputs, outputs and buffers": step.breakdown["input"] + step.breakdown["output"]
             + step.breakdown["buffer"], "workspaces": step.breakdown["workspace"],
             "temporary": step.breakdown["temporary"], **dict.fromkeys(ESTIMATES, 0)}
    r = RankMemory(rank=0, coords=mesh_coords(config, 0), simulated_as=0,
                   peak_bytes=rep.peak_bytes, simulated_peak_bytes=rep.peak_bytes, peak_step=step.step + 1,
                   peak_phase=step.peak_phase, peak_layer=step.peak_layer, breakdown=parts)
    notes = ["every degree is 1: one device, no sharding; these are memory()'s figures"
             + (f" with the blocks checkpointed ({config.ac})" if config.ac != "none" else "")
             + (" (mixed precision bf16 as autocast over fp32 weights)" if config.mixed_precision == "bf16" else "")]
    return _plan(config, (r,)), notes + list(rep.notes)
