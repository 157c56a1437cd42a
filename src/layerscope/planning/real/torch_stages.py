"""A real pipeline rank's stages under torch's own ``PipelineStage`` and schedule: each stage cut from the
model (the uniform split, planning/simulate/uniform_stages.py), parallelized without its ``pp`` dimension,
given every boundary's metadata; the schedule of the configuration's entry over them; the gradients of
weights tied across stages summed; one step."""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ... import _compat
from ...errors import InputError
from ..config import SCHEDULES, ParallelConfig, schedule_of
from ..blocks import canonical_name, local_tensor as _local, no_kv_cache

__all__ = ["pipeline_stage", "pipeline_schedule", "pipeline_step", "tie_groups", "sum_tied_grads",
           "PIPELINE_SCHEDULES"]


# what torch's PipelineStage and schedule run here: every schedule of the table (one stage per rank, or
# several), as the table has it at import (for the launcher's check of a name)
PIPELINE_SCHEDULES = tuple(SCHEDULES)


def _micro_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of ``logits`` against ``target``, in fp32: ``training_loss``'s, and a
    micro-batch's on a pipeline's last stage."""
    return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(0, 1))


def pipeline_stage(model: nn.Module, config: ParallelConfig, mesh, stage: int, ids: torch.Tensor, *,
                   static: bool = False):
    """``model`` (real, built alike on every rank) cut down in place to ``stage`` of the uniform split
    (planning/simulate/pipeline_rank.py), parallelized on ``mesh`` without its ``pp`` dimension, and given to torch's
    ``PipelineStage`` and schedule (``ScheduleGPipe`` or ``Schedule1F1B``, ``training_loss``'s
    cross-entropy per micro-batch, torch's default gradient scaling by the number of micro-batches) on
    the ``pp`` group; ``ids``: the rank's local batch (its first micro-batch records the stage), on the
    stage's device.
    Every stage is given every boundary's metadata (``input_args``/``output_args``); ``static``: also
    without the stages' P2P vote on it (``_compat.pipeline_stage_static``: a fake backend carries no
    data). Returns (stage module, PipelineStage, schedule)."""
    if config.stages != config.pp:
        single = " or ".join(n for n, s in SCHEDULES.items() if not s.multi)
        raise InputError(f"pipeline_stage builds one stage per rank ({single}), not {config.schedule}: a rank "
                         "of its schedule holds several (planning/simulate/pipeline_rank.py rank_stages)")
    mod, pipe = _stage_pipe(model, config, mesh, stage, ids, static=static)
    return mod, pipe, pipeline_schedule(config, [pipe])


def pipeline_schedule(config: ParallelConfig, pipes: list):
    """torch's schedule of ``config.schedule`` over this rank's PipelineStages (one, or several under a
    schedule that puts several on a rank), ``training_loss``'s cross-entropy per micro-batch."""
    cls = schedule_of(config.schedule).torch_schedule()
    return cls(pipes if len(pipes) > 1 or schedule_of(config.schedule).multi else pipes[0], config.microbatches,
               loss_fn=_micro_loss)


def _rank_pipeline(build: Callable[[], nn.Module], config: ParallelConfig, mesh, stages: list[int],
                   ids: torch.Tensor, *, seed: int, model: nn.Module | None = None, device=None,
                   static: bool = False):
    """This rank's ``stages``, each cut from a model built alike (``build()`` after seeding with ``seed``;
    ``model``: the first one, built already), moved to ``device`` when given, each given to torch's
    PipelineStage; and the schedule over them. Returns (stage modules, PipelineStages, schedule)."""
    mods, pipes = [], []
    for stage in stages:
        if model is None:
            torch.manual_seed(seed)
            model = build()
            no_kv_cache(model)
            model.train()
            if device is not None:
                model.to(device)
        m, p = _stage_pipe(model, config, mesh, stage, ids, static=static)
        mods.append(m)
        pipes.append(p)
        model = None
    return mods, pipes, pipeline_schedule(config, pipes)


def _stage_pipe(model: nn.Module, config: ParallelConfig, mesh, stage: int, ids: torch.Tensor, *,
                static: bool = False):
    """pipeline_stage's module and PipelineStage, without the schedule."""
    from torch.distributed.pipelining import PipelineStage

    from ..simulate.stage_run import _Tp
    from ..simulate.uniform_stages import parallelize_stage, split_micro, stage_module

    (mid,), _ = split_micro((ids,), {}, 0, config.microbatches)
    mod, own = stage_module(model, config, stage, (mid,), {})
    mod.full_output = False                    # torch's stage hands the logits to the loss
    parallelize_stage(mod, own, config, mesh)
    dt = config.param_dtype if config.mixed_precision == "bf16" and config.dp > 1 else None
    # tensor parallel keeps the hidden states between blocks a DTensor (sequence-sharded with sequence
    # parallel): the boundaries are declared as such, and torch's stage sends their local shards and
    # makes DTensors of what it receives
    tp = _Tp(config, mesh) if config.tp > 1 else None

    def example(metas):
        # floating activations carry gradients both ways: the static metadata says so
        out = []
        for s, d in metas:
            dtype = dt if dt is not None and d.is_floating_point else d
            if tp is not None and d.is_floating_point:
                t = tp.wrap(torch.zeros(tp.local_shape(s), dtype=dtype, device=ids.device), s)
            else:
                t = torch.zeros(s, dtype=dtype, device=ids.device)
            out.append(t.requires_grad_(d.is_floating_point))
        return tuple(out)
    first, last = stage == 0, stage == config.stages - 1
    inputs = (mid,) if first else example(mod.received_metas)
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
    # the logits: in the compute dtype (FSDP's bf16 parameters, or autocast's without FSDP), else the model's;
    # sharded on the vocabulary for loss parallel
    logits = config.param_dtype if config.mixed_precision == "bf16" else config.model_dtype
    shape = (*mid.shape, vocab)
    head = torch.zeros(shape, dtype=logits, device=ids.device)
    if tp is not None and config.loss_parallel:
        from torch.distributed.tensor import DTensor, Shard
        local = torch.zeros(*mid.shape, -(-vocab // config.tp), dtype=logits, device=ids.device)
        head = DTensor.from_local(local, tp.mesh, [Shard(2)], shape=torch.Size(shape), stride=head.stride(),
                                  run_check=False)
    outputs = example(mod.sent_metas) if not last else (head,)
    grads = {}
    if static and tp is not None:
        # without the vote, torch cannot tell a DTensor gradient's metadata from the activation's: given as
        # the activation's (what the simulation assumes)
        grads = dict(input_grads=None if first else inputs, output_grads=None if last else outputs)
    pipe = PipelineStage(mod, stage, config.stages, ids.device, input_args=inputs, output_args=outputs,
                         group=mesh["pp"].get_group(), **grads)
    if static:
        _compat.pipeline_stage_static(pipe)
    return mod, pipe


def tie_groups(model: nn.Module, config: ParallelConfig, mesh,
               stages: list[int]) -> dict[int, list[tuple[str, object]]]:
    """For each of this rank's ``stages``, each weight tied across stages that it holds (planning/simulate/pipeline_rank.py
    ``stage_ties``): (its name in the model, the process group of the ranks that hold a copy at this
    rank's data- and tensor-parallel coordinates, the tie's index). Call once, on the whole model, before a
    stage is cut: every rank makes every group once, in the same order (a group made again would be
    another)."""
    import torch.distributed as dist

    from ..simulate.uniform_stages import stage_coords, stage_ties
    grid = mesh.mesh.reshape(config.pp, -1)       # [pp coordinate, the rank's other coordinates]
    coord = stage_coords(config)
    column = int((grid[coord[stages[0]]] == dist.get_rank()).nonzero()[0, 0])
    out: dict[int, list] = {s: [] for s in stages}
    for k, held in enumerate(stage_ties(model, config)):
        mine = None
        for c in range(grid.shape[1]):
            group = dist.new_group(sorted({int(grid[coord[s], c]) for s in held}))
            if c == column:
                mine = group
        for stage in stages:
            if stage in held:
                out[stage].append((held[stage], mine, k))
    return out


def sum_tied_grads(ties: list[tuple[nn.Module, list[tuple[str, object, int]]]]) -> None:
    """After a step's backward: each tied weight's gradient summed over the stages that hold it (the
    local shards: every copy is sharded alike, FSDP on dim 0 and TP's vocabulary split on dim 0; a
    gradient placed otherwise than its parameter, as tensor parallel leaves the vocabulary-parallel
    embedding's, replicated, is put in the parameter's placement first). ``ties``: each of this rank's
    stage modules with its ``tie_groups`` entry. The copies this rank holds itself (zbv's V puts the first
    and the last stage on one rank) are summed on the rank, then over the group, and each takes the sum."""
    import torch.distributed as dist
    by_tie: dict[int, tuple[object, list]] = {}      # tie index -> (its group, this rank's copies)
    for mod, tied in ties:
        params = {canonical_name(k): v for k, v in mod.named_parameters()}
        for name, group, k in tied:
            by_tie.setdefault(k, (group, []))[1].append(params[f"model.{name}"])
    for group, copies in by_tie.values():
        copies = [p for p in copies if p.grad is not None]
        if not copies:
            continue
        for p in copies:
            if hasattr(p.grad, "placements") and tuple(p.grad.placements) != tuple(p.placements):
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        total = _local(copies[0].grad)
        for p in copies[1:]:
            total.add_(_local(p.grad))
        dist.all_reduce(total, group=group)
        for p in copies[1:]:
            _local(p.grad).copy_(total)


def pipeline_step(sched, pipe, ids: torch.Tensor, labels: torch.Tensor, losses: list | None = None) -> None:
    """One step of the schedule on this rank's stage (or list of stages): the first stage feeds ``ids``,
    the last takes ``labels`` as the target (and puts each micro-batch's loss in ``losses``); outputs not
    returned (``return_outputs=False``, as torchtitan steps)."""
    pipes = pipe if isinstance(pipe, (list, tuple)) else [pipe]
    args = (ids,) if any(p.is_first for p in pipes) else ()
    kw = dict(target=labels, losses=losses) if any(p.is_last for p in pipes) else {}
    sched.step(*args, return_outputs=False, **kw)


def _stage_buffers(pipe) -> list[torch.Tensor]:
    """What a PipelineStage keeps from step to step beside its module: the receive buffers of every
    micro-batch's activations and gradients (made at its first step), and the gradients the last
    step's backward accumulated on the activation buffers (cleared when the next step begins)."""
    out = []
    for infos in (*pipe.args_recv_info.values(), *getattr(pipe, "grad_recv_info", {}).values()):
        for info in infos if isinstance(infos, (tuple, list)) else ():
            buf = getattr(info, "buffer", None)
            if isinstance(buf, torch.Tensor):
                out.append(buf)
                if buf.grad is not None:
                    out.append(buf.grad)
    return out
