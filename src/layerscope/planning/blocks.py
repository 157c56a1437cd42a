"""The pieces of a model the parallelisms work on: its repeated blocks (``find_blocks``), no KV cache in
training, and the names and tensors of a parallelized model as in the model itself (checkpoint_wrapper's
level removed, DTensors' local shards, GPT-2's split q/k/v fused back)."""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from .. import _compat
from ..errors import InputError

__all__ = ["find_blocks", "no_kv_cache", "local_tensor", "canonical_name", "canonical_tensors"]


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's repeated blocks, as (path, module), in module order: the children of every
    ``nn.ModuleList`` of two or more children of one class that hold parameters, outermost lists only
    (``model.model.layers`` in Llama, ``transformer.h`` in GPT-2, both of T5's stacks; not the experts
    inside a block). FSDP2 and checkpointing wrap each block; tensor parallel plans name them."""
    lists: list[tuple[str, nn.ModuleList]] = []
    for path, m in model.named_modules():
        if isinstance(m, nn.ModuleList) and len(m) > 1 and len({type(c) for c in m}) == 1 and \
                any(True for _ in m.parameters()) and \
                not any(path.startswith(f"{q}." if q else "") for q, _ in lists):
            lists.append((path, m))
    if not lists:
        raise InputError(f"{type(model).__name__} has no nn.ModuleList of repeated blocks (same class): "
                         "sharding and checkpointing apply per block")
    return [(f"{q}.{i}" if q else str(i), c) for q, m in lists for i, c in enumerate(m)]


def _parent(model: nn.Module, path: str) -> tuple[nn.Module, str]:
    head, _, leaf = path.rpartition(".")
    return (model.get_submodule(head) if head else model), leaf


def no_kv_cache(model: nn.Module) -> bool:
    """No KV cache in training (transformers' models build one when ``config.use_cache``; a checkpointed
    block's recompute would then find the forward's keys in it and run other ops). True if it was on."""
    cfg = getattr(model, "config", None)
    if cfg is not None and getattr(cfg, "use_cache", False):
        cfg.use_cache = False
        return True
    return False


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor (torch's ``to_local_if_dtensor``), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def canonical_name(name: str) -> str:
    """A parameter's (or module's) name in the unwrapped model (checkpoint_wrapper's level removed)."""
    prefix = _compat.checkpoint_prefix()
    return name.replace(prefix, "").removesuffix("." + prefix.rstrip("."))


def canonical_tensors(named: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full tensors named as in the unparallelized model: checkpoint_wrapper's prefix removed, GPT-2's
    split ``c_attn.q/k/v`` fused back (weight on dim 1, bias on dim 0, q k v order)."""
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, dict] = defaultdict(dict)
    for name, t in named.items():
        name = canonical_name(name)
        head, _, leaf = name.rpartition(".")
        base, _, part = head.rpartition(".")
        if part in ("q", "k", "v") and base.endswith("c_attn"):
            parts[f"{base}.{leaf}"][part] = t
        else:
            out[name] = t
    for name, p in parts.items():
        out[name] = torch.cat([p["q"], p["k"], p["v"]], dim=1 if name.endswith("weight") else 0)
    return out
