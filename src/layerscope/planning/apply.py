"""Sharded training applied to a model with torch's own code: tensor parallel (``parallelize_module``),
activation checkpointing (``checkpoint_wrapper``, selective checkpointing contexts) and FSDP2
(``fully_shard``), in torchtitan's order.

Used alike by the simulation (a model on the meta device, a fake process group) and by real runs
under torchrun (``planning/real/sharded_run.py``). What torchtitan does is followed from its commit
1e8f9acd194a896efeb5f417894c305783c7b138 (2026-01-20; ``torchtitan/models/llama3/infra/parallelize.py``
``parallelize_llama``/``apply_tp``/``apply_fsdp`` and ``torchtitan/distributed/activation_checkpoint.py``),
the last one with per-model TP plans and the op save list ``_op_sac_save_list`` before torchtitan
moved both into its own module protocol. Where this departs from it, the comment says why.

TP plans are derived from the config's ``base_model_tp_plan`` (planning/tp_plans.py), or hand-written for
GPT-2 (``Conv1D``, fused ``c_attn``: see ``_FusedQKV``) and Llama-shaped blocks without one; any other model
with ``tp > 1`` is refused with one line naming the module no plan covers. FSDP and checkpointing work on any model
whose repeated blocks ``find_blocks`` finds. Pipeline stages are not applied here (pipeline/).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Callable

import torch
from torch import nn

from .. import _compat
from ..errors import InputError
from .config import ParallelConfig
from .blocks import _parent, find_blocks
from .context_parallel import fsdp_mesh
from .tensor_parallel import _apply_tp
from .expert_parallel import apply_ep, shard_experts_fsdp, sparse_mesh

# find_blocks is public here: docs/parallel.md imports it from layerscope.planning.apply
__all__ = ["build_mesh", "find_blocks", "parallelize", "loss_context", "amp_context", "data_parallel_rank",
           "checkpoint_blocks"]


def build_mesh(config: ParallelConfig, device_type: str):
    """The device mesh of ``config`` over the default process group (already initialised: gloo,
    nccl or torch's ``fake`` backend), its dimensions named and ordered as ``config.mesh_shape``
    (``pp``, ``dp_replicate``, ``dp_shard``, ``tp``: torchtitan's order, tensor parallel innermost).
    None when the configuration is one rank. One exception to "sizes > 1 only": HSDP without
    sharding (``replicate`` > 1, ``fsdp`` 1) keeps a ``dp_shard`` dimension of size 1, so that
    ``fully_shard`` gets its 2-D (replicate, shard) mesh and replicates, as DDP would."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if config.world == 1:
        return None
    if not dist.is_initialized():
        raise InputError("build_mesh needs the default process group initialised first "
                         "(torch.distributed.init_process_group)")
    if dist.get_world_size() != config.world:
        raise InputError(f"the process group has {dist.get_world_size()} ranks, the configuration "
                         f"{config.world} ({config.label()})")
    dims = list(config.mesh_shape)
    if config.replicate > 1 and config.fsdp == 1:
        at = [n for n, _ in dims].index("dp_replicate") + 1
        dims.insert(at, ("dp_shard", 1))
    return init_device_mesh(device_type, tuple(s for _, s in dims), mesh_dim_names=tuple(n for n, _ in dims))


def data_parallel_rank(config: ParallelConfig, mesh) -> int:
    """This rank's index among the data-parallel ranks (which slice of the global batch it takes):
    its coordinate on (dp_replicate, dp_shard), row-major; 0 without a mesh."""
    if mesh is None:
        return 0
    names = mesh.mesh_dim_names or ()
    index = 0
    for name in ("dp_replicate", "dp_shard"):
        if name in names:
            index = index * mesh.size(names.index(name)) + mesh.get_local_rank(name)
    return index


def _dp_mesh(mesh):
    names = mesh.mesh_dim_names or ()
    dp = tuple(n for n in ("dp_replicate", "dp_shard") if n in names)
    return mesh[dp] if dp else None


def _sac_context_fn(save_ops: set) -> Callable:
    """torchtitan's ``_apply_op_sac`` policy: the outputs of the ops in ``save_ops`` are saved, except
    every second ``mm`` (counted separately in the forward and the recompute, so both choose the same
    ones), and a CUDA-to-CPU copy; everything else is recomputed."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    mm = torch.ops.aten.mm.default
    to_copy = torch.ops.aten._to_copy.default

    def context_fn():
        meta: dict = defaultdict(int)

        def policy(ctx, func, *args, **kwargs):
            if func == to_copy and args and "cuda" in str(args[0].device) and str(kwargs.get("device")) == "cpu":
                return CheckpointPolicy.MUST_SAVE
            key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
            if func == mm:
                meta[key] += 1
            save = func in save_ops and not (func == mm and meta[key] % 2 == 0)
            return CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE

        return create_selective_checkpoint_contexts(policy)

    return context_fn


def _apply_ac(model: nn.Module, blocks: list[tuple[str, nn.Module]], config: ParallelConfig) -> list:
    """Each chosen block replaced by torch's checkpoint_wrapper of it (non-reentrant, as torchtitan:
    preserve_rng_state True, early_stop False). ``selective-layer``: torchtitan counts blocks from 1
    and wraps those whose count is a multiple of ``ac_every`` (blocks K-1, 2K-1, ... from 0)."""
    out = []
    if config.ac == "selective-layer" and config.ac_every > len(blocks):
        raise InputError(f"selective-layer:{config.ac_every} checkpoints every {config.ac_every}th block, and the "
                         f"model has {len(blocks)}: none would be (use a smaller K, or full)")
    save_ops = _compat.sac_save_ops() if config.ac == "selective-op" else None
    for i, (path, block) in enumerate(blocks):
        wrap = config.ac in ("full", "selective-op") or (config.ac == "selective-layer" and (i + 1) % config.ac_every == 0)
        if wrap:
            kwargs = {"preserve_rng_state": True, "early_stop": False}
            if save_ops is not None:
                kwargs["context_fn"] = _sac_context_fn(save_ops)
            wrapped = _compat.checkpoint_wrapper(block, **kwargs)
            parent, leaf = _parent(model, path)
            parent.register_module(leaf, wrapped)
            block = wrapped
        out.append((path, block))
    return out


def _apply_fsdp(model: nn.Module, blocks: list[tuple[str, nn.Module]], dp_mesh, config: ParallelConfig,
                experts: tuple | None = None) -> None:
    """fully_shard on every block, then on the root (torchtitan's apply_fsdp without its separate
    groups for the embeddings and for norm + head: those stay in the root's group, which also holds
    tied embeddings, as FSDP2 allows a parameter in one group only). The root is not resharded after
    the forward (torchtitan: its parameters are needed first in the backward)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    kwargs: dict = {"mesh": dp_mesh}
    if config.mixed_precision == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=config.param_dtype, reduce_dtype=config.reduce_dtype)
    # pinned host memory needs an accelerator: a CPU rank's offload (a no-op there) pins nothing
    kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=dp_mesh.device_type != "cpu") if config.offload \
        else OffloadPolicy()
    if experts is not None:           # expert parallel: the experts first, over the sparse mesh's efsdp
        shard_experts_fsdp(*experts, config, kwargs)
    for _, block in blocks:
        fully_shard(block, reshard_after_forward=config.reshard_after_forward, **kwargs)
    fully_shard(model, reshard_after_forward=False, **kwargs)


def parallelize(model: nn.Module, config: ParallelConfig, mesh, *, blocks: list | None = None,
                tp_root: str = "") -> nn.Module:
    """Apply ``config`` to ``model`` in place, in torchtitan's order: 1) tensor parallel on the
    ``tp`` mesh dimension, 2) activation checkpointing per block, 3) FSDP2 on the data-parallel
    dimensions (``dp_shard``, or ``(dp_replicate, dp_shard)`` for HSDP; under context parallel ``dp_shard``
    and ``cp`` flattened, as torchtitan's: the ring itself is entered around the step,
    planning/context_parallel.py). With one rank
    (``config.world == 1``) nothing is done. Returns the model.

    A pipeline stage (planning/simulate/pipeline_rank.py) is parallelized with a configuration whose ``pp`` is 1 on
    the mesh without its ``pp`` dimension: ``blocks`` are then the stage's own (path, module) pairs
    (default: ``find_blocks(model)``), and ``tp_root`` the path, inside ``model``, of the model the
    TP plans name (a stage module wraps it); FSDP's root is ``model`` itself."""
    if not isinstance(config, ParallelConfig):
        raise InputError(f"parallelize takes a ParallelConfig, got {type(config).__name__}")
    if config.world == 1:
        return model
    if mesh is None:
        raise InputError(f"{config.label()} needs a device mesh (build_mesh)")
    if config.cp > 1 and _compat.process_group_backend() != "fake":
        # the ring runs CUDA's SDPA kernels only, and layerscope's real runs neither shard the inputs on the
        # sequence nor enter the ring (context_parallel.py): a real run would train something else
        raise InputError(f"context parallel (cp {config.cp}) is simulated, not run: layerscope's real runs do not "
                         "shard sequences (and torch's ring needs CUDA's SDPA kernels)")
    if config.pp > 1:
        raise InputError("parallelize does not split pipeline stages (pp > 1): the stages come from "
                         "layerscope's pipeline split, each parallelized on its own mesh without pp")
    blocks = find_blocks(model) if blocks is None else list(blocks)
    names = mesh.mesh_dim_names or ()
    if config.tp > 1:
        inner, cut = (model.get_submodule(tp_root), len(tp_root) + 1) if tp_root else (model, 0)
        _apply_tp(inner, [(p[cut:], m) for p, m in blocks], mesh["tp"], config)
    # expert parallel (planning/expert_parallel.py) after TP and before checkpointing, as torchtitan orders them
    experts = apply_ep(model, config, smesh := sparse_mesh(config, mesh.device_type)) if config.ep > 1 else ()
    if config.ac != "none":
        blocks = _apply_ac(model, blocks, config)
    # under context parallel FSDP shards over dp_shard x cp (torchtitan's fsdp dimension): context_parallel.py
    dp_mesh = fsdp_mesh(mesh) if "cp" in names else \
        _dp_mesh(mesh) if any(n in names for n in ("dp_replicate", "dp_shard")) else None
    if dp_mesh is not None:
        _apply_fsdp(model, blocks, dp_mesh, config, experts=(experts, smesh) if experts else None)
    return model


def checkpoint_blocks(model: nn.Module, config: ParallelConfig, blocks: list | None = None) -> nn.Module:
    """Only the activation checkpointing of ``config`` (its ``ac``), in place: what one device runs when
    every degree is 1 (or a pipeline stage's ``blocks`` when only ``pp`` > 1)."""
    if config.ac != "none":
        _apply_ac(model, find_blocks(model) if blocks is None else list(blocks), config)
    return model


def loss_context(config: ParallelConfig):
    """torch's ``loss_parallel()`` (cross-entropy on logits sharded on the vocabulary, no gather)
    when tensor parallel shards the head's output (``tp > 1`` and ``loss_parallel``), else a
    context that does nothing. The loss and its backward both run inside it."""
    if config.tp > 1 and config.loss_parallel:
        from torch.distributed.tensor.parallel import loss_parallel
        return loss_parallel()
    return contextlib.nullcontext()


def amp_context(config: ParallelConfig, device_type: str):
    """bf16 compute without FSDP (no data parallelism to carry a MixedPrecisionPolicy): torch.autocast,
    as torchtitan's ``maybe_enable_amp`` does; with FSDP (or ``mixed_precision="off"``) nothing."""
    if config.mixed_precision == "bf16" and config.dp * config.cp == 1 and config.world > 1:   # cp: FSDP over it
        return torch.autocast(device_type, dtype=config.param_dtype)
    return contextlib.nullcontext()
