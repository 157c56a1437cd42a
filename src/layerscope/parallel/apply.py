"""Sharding applied with torch's own code (interim: FSDP2 only; tensor parallel and checkpointing come
with the full version of this module)."""

from __future__ import annotations

import torch
from torch import nn

from ..errors import InputError
from ..options import ParallelConfig

__all__ = ["build_mesh", "find_blocks", "parallelize"]


def build_mesh(config: ParallelConfig, device_type: str):
    """The ranks' mesh over the default process group, dimensions named as ``config.mesh_shape``."""
    if config.world == 1:
        return None
    from torch.distributed.device_mesh import init_device_mesh
    names, sizes = zip(*config.mesh_shape)
    return init_device_mesh(device_type, tuple(sizes), mesh_dim_names=tuple(names))


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The repeated blocks: the longest ModuleList of children of one class."""
    best: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) > len(best) and len({type(c) for c in m}) == 1:
            best = [(f"{name}.{i}", c) for i, c in enumerate(m)]
    if not best:
        raise InputError(f"{type(model).__name__} has no list of repeated blocks to shard")
    return best


def parallelize(model: nn.Module, config: ParallelConfig, mesh) -> nn.Module:
    if config.world == 1:
        return model
    if config.tp > 1 or config.pp > 1 or config.ac != "none":
        raise InputError("tensor parallel, pipeline and checkpointing are not applied yet")
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    dp = mesh["dp_replicate", "dp_shard"] if config.replicate > 1 else mesh["dp_shard"]
    kw = {}
    if config.mixed_precision == "bf16":
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=config.reduce_dtype)
    for _, block in find_blocks(model):
        fully_shard(block, mesh=dp, reshard_after_forward=config.reshard_after_forward, **kw)
    fully_shard(model, mesh=dp, reshard_after_forward=False, **kw)
    return model
