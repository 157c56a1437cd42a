"""What is exact about a candidate with expert (``ep``) or context (``cp``) parallel before either is
simulated: the figures the search shows beside such a candidate and the lower bound it rules one out
with (planning/search/space.py). Each is derived below from the model's structure and torchtitan's mesh
at b5bcd76c66d0acb1a08b176d9639425bc55e0b2a (``parallel_dims.py``: FSDP shards the dense parameters over
``dp_shard x cp``, ep borrows its ranks from ``dp_shard x cp x tp``, the experts' FSDP degree ``efsdp`` is
what is left).

Memory (``sparse_state_bytes``), at the moment a rank's peak is reached it holds at least:

* its shard of every parameter: a dense parameter is split by TP (``tp``, or replicated across it: no
  smaller) and FSDP over ``fsdp x cp``, at least ``numel / (tp x fsdp x cp)`` elements; a routed expert's
  by EP (whole experts: ``E / ep`` a rank) and FSDP over ``efsdp``, ``numel / (ep x efsdp)`` =
  ``numel / (fsdp x cp x tp)`` elements. So EP moves no parameter bytes: every rank holds ``numel /
  (tp x fsdp x cp)`` of a pipeline stage's elements either way, in the model's dtype (the fp32 master
  weights under bf16 mixed precision), unless offloaded;
* the optimizer's state of those shards, ``ratio`` times their bytes (AdamW's two moments: 2; the ratio a
  simulated rank of the same model held, planning/search/bounds.py's ``optimizer_ratio``; 0 where none
  is known);
* with FSDP and ``reshard_after_forward`` off, the stage's parameters gathered from the first forward to
  the last backward, in the compute dtype: a dense one at least ``numel / tp``, a routed expert's
  ``numel / ep`` (the rank's whole experts), each only where its FSDP degree (``fsdp x cp``, ``efsdp``)
  is above 1 (otherwise nothing is gathered: the shard is the parameter).

Activations are not counted: under context parallel the ring's kernels (flash, efficient, cuDNN) keep
``S / cp`` of a sequence's activations a rank, but the search's figures of a block come from a rank
without it, whose attention may run the math kernel and save ``S x S`` scores that ``/ cp`` does not
bound; under expert parallel the dispatched tokens depend on the routing. Both are left to the
dimension's own simulation, so the bound is the state alone: low, never above.

Communication (``alltoall_bytes``, ``ring_bytes``), per rank and step, the bytes each collective sends:

* expert parallel: a rank's ``T`` tokens (``micro-batch x S / (cp x tp)`` a micro-batch: CP splits the
  sequence, and TP's sequence parallel splits what reaches the MoE block) each go to ``k`` experts; under
  the ``even`` routing assumption each copy's expert is on any of the ``ep`` ranks alike, so
  ``(ep - 1) / ep`` of the ``T x k`` copies leave the rank: the dispatch sends ``T k (ep - 1) / ep`` rows
  of ``H`` elements in the compute dtype, the combine as many back, and the backward each again (the
  gradients of the combine and of the dispatch): ``4 T k H b (ep - 1) / ep`` bytes a MoE block and
  micro-batch. Under ``skew:F`` the hottest expert receives ``F`` times its share: what a rank sends is
  the same ``T x k`` copies, what the hottest expert's rank receives is up to ``F`` times its share
  (shown apart, ``hottest_share``);
* context parallel: torch's ring attention passes each rank's K and V around the ring, ``cp - 1`` hops
  in the forward and as many in the backward (which passes them once more with their gradients: at
  least K and V again), each ``micro-batch x S / cp`` positions of ``kv_heads x (k_dim + v_dim)``
  elements (``kv_heads / tp`` of them under tensor parallel): at least ``2 (cp - 1) x micro-batch x
  (S / cp) x kv_heads x (k_dim + v_dim) x b / tp`` bytes an attention layer and micro-batch.

Under a pipeline the rank counted is one holding ``floor(blocks / pp)`` of them: the busiest holds no
fewer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..config import ParallelConfig
from ..moe import experts_per_token, find_experts
from ..simulate.uniform_stages import stage_params

__all__ = ["SparseModel", "sparse_model", "sparse_state_bytes", "alltoall_bytes", "ring_bytes", "hottest_share",
           "attention_dims"]


@dataclass(frozen=True)
class SparseModel:
    """The model's facts the figures take (module docstring)."""

    moe_blocks: int                 # MoE blocks (routed experts)
    hidden: int | None              # H: the router's input width
    top_k: int | None               # experts a token goes to (the config's)
    experts: int | None             # routed experts a block
    attention: tuple[int, int, int] | None   # (kv heads, K head dim, V head dim), from the config
    layers: int                     # attention layers (the model's blocks)


def attention_dims(model: nn.Module) -> tuple[int, int, int] | None:
    """(kv heads, K's head dim, V's head dim) from a transformers config: multi-head latent attention
    (DeepSeek-V3: ``qk_nope_head_dim + qk_rope_head_dim``, ``v_head_dim``, its K/V expanded to every head)
    or grouped-query (``num_key_value_heads``, ``head_dim`` or hidden / heads); None without a config."""
    cfg = getattr(model, "config", None)
    heads = getattr(cfg, "num_attention_heads", None)
    if not isinstance(heads, int) or heads < 1:
        return None
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    if getattr(cfg, "qk_nope_head_dim", None) and getattr(cfg, "v_head_dim", None):
        return heads, cfg.qk_nope_head_dim + (getattr(cfg, "qk_rope_head_dim", 0) or 0), cfg.v_head_dim
    dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    return kv, dim, dim


def sparse_model(model: nn.Module, blocks: int) -> SparseModel:
    groups = find_experts(model)
    hidden = None
    if groups:
        hidden = int(dict(model.named_parameters())[groups[0].router].shape[1])
    return SparseModel(moe_blocks=len(groups), hidden=hidden, top_k=experts_per_token(model),
                       experts=groups[0].experts if groups else None, attention=attention_dims(model), layers=blocks)


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def stage_split(model: nn.Module, stages: int) -> list[tuple[int, int]]:
    """Per stage of the uniform split: (dense elements, routed-expert elements) it owns."""
    experts = {id(p) for g in find_experts(model) for p in model.get_submodule(g.path).parameters()}
    return [(sum(p.numel() for k, p in owned.items() if k not in experts),
             sum(p.numel() for k, p in owned.items() if k in experts)) for owned in stage_params(model, stages)]


def sparse_state_bytes(c: ParallelConfig, split: list[tuple[int, int]], ratio: float = 0.0) -> int:
    """The least a rank holds (module docstring) over the pipeline coordinates: the largest of its
    stages' sums (``split``: ``stage_split``)."""
    master = _itemsize(c.model_dtype)
    compute = _itemsize(c.param_dtype or c.model_dtype)
    spr = c.stages // c.pp
    most = 0
    for c0 in range(c.pp):
        total = 0
        for st in range(c0, c.stages, c.pp):
            dense, routed = split[st]
            if not c.offload:
                total += int((dense + routed) // (c.tp * c.fsdp * c.cp) * master * (1 + ratio))
            if not c.reshard_after_forward and spr == 1:
                total += (dense // c.tp if c.fsdp * c.cp > 1 else 0) * compute
                total += (routed // c.ep if c.efsdp > 1 else 0) * compute
        most = max(most, total)
    return most


def _tokens(c: ParallelConfig, seq: int) -> float:
    """A rank's tokens of one micro-batch reaching a MoE block (module docstring)."""
    mbs = (c.local_batch or 0) // c.microbatches
    return mbs * seq / (c.cp * c.tp)


def alltoall_bytes(c: ParallelConfig, m: SparseModel, seq: int) -> int | None:
    """Bytes a rank's expert-parallel all-to-alls send over the step under even routing (module docstring);
    None without experts or their sizes."""
    if c.ep == 1 or not m.moe_blocks or m.hidden is None or m.top_k is None:
        return 0 if c.ep == 1 else None
    b = _itemsize(c.param_dtype or c.model_dtype)
    steps = c.microbatches * c.accumulation
    per = 4 * _tokens(c, seq) * m.top_k * m.hidden * b * (c.ep - 1) / c.ep
    return int(per * (m.moe_blocks // c.pp) * steps)     # the pipeline rank with the most holds no fewer


def hottest_share(c: ParallelConfig, m: SparseModel) -> float | None:
    """The hottest expert's rank's received copies over its even share under ``c.routing`` (skew:F: the
    hottest expert gets F times its share, its rank at most F times its own: F / 1), 1.0 under even."""
    return c.routing_skew if m.moe_blocks else None


def ring_bytes(c: ParallelConfig, m: SparseModel, seq: int) -> int | None:
    """Bytes a rank's ring attention sends over the step, at least (module docstring); None without the
    attention's sizes."""
    if c.cp == 1:
        return 0
    if m.attention is None:
        return None
    kv, kd, vd = m.attention
    b = _itemsize(c.param_dtype or c.model_dtype)
    mbs = (c.local_batch or 0) // c.microbatches
    steps = c.microbatches * c.accumulation
    # tensor parallel splits the heads: kv / tp a rank (no fewer than that share where kv < tp replicates them)
    per = 2 * (c.cp - 1) * mbs * (seq // c.cp) * kv * (kd + vd) * b / c.tp
    return int(per * (m.layers // c.pp) * steps)
