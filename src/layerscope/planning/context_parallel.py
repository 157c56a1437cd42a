"""Context parallel (``cp``): each sequence split across ``cp`` ranks, attention as torch's ring.

What runs is torch's own code (torch 2.13, ``torch.distributed.tensor.experimental._context_parallel``):

* the inputs: every tensor of the step laid out ``[batch, sequence, ...]`` (token ids, the labels, the
  position ids, input embeddings) is reordered by torch's head-tail load balancer (``_HeadTailLoadBalancer``:
  the sequence cut into ``2 x cp`` chunks, rank r keeping chunks r and ``2 cp - 1 - r``, so that each rank
  has as many unmasked scores of a causal mask as the others) and sharded on the sequence dimension
  (``_context_parallel_shard``), as torchtitan's ``prepare_context_parallel_input`` does at commit
  b5bcd76c66d0acb1a08b176d9639425bc55e0b2a (``torchtitan/distributed/context_parallel/api.py``: inputs,
  labels and positions, load balancer "headtail"). Position ids the caller gave are sharded with them; none
  are made here: a transformers model reads head-tail positions (0..k-1, then a jump) as packed sequences and
  builds a mask tensor from them, which the ring refuses, and the positions it makes itself (0..S/cp-1,
  int64, [1, S/cp]) have the shape and dtype of the rank's true ones, so its rotary embeddings hold the
  same bytes (their values, which a simulation does not compute, would differ: a real run gives positions,
  as torchtitan's trainer does);
* attention: ``F.scaled_dot_product_attention`` is torch's CP wrapper while the step runs
  (``context_parallel``'s monkey-patch mode: q, k and v become DTensors sharded on the sequence), and
  DTensor's dispatcher sends the flash, memory-efficient and cuDNN kernels' ops to torch's ring
  (``_templated_ring_attention`` and its backward). Its default rotation is ``ALL_GATHER`` (``_cp_options``):
  the forward all-gathers each layer's local K and V (concatenated, flattened) once over the cp ranks and
  reads the other ranks' chunks from the gathered buffer; the backward all-gathers them again and passes
  the K/V gradients round the ring with ``cp`` all-to-alls (``permute_tensor``, fp32: ``convert_to_f32``).
  CPU's SDPA (the math kernel) has no ring: a CP rank is simulated as a CUDA rank (the SDPA router picks
  the CUDA kernel; the tensors are fake), and a run of the ring on this CPU build is not possible.

What is assumed, and said in the notes: a causal mask and no attention-mask tensor (the ring takes
``is_causal`` only; a mask tensor is refused: torch's efficient and cuDNN ring raise on one, flash has
none); the cp ranks see the same samples (``data_parallel_rank`` unchanged) and FSDP shards over
``dp_shard x cp`` (torchtitan's ``fsdp`` mesh dimension). The labels are sharded as the ids are: a
model's own loss shifts its shard of them by one position (torchtitan's dataloader shifts them before);
the loss's bytes are those of the rank's tokens either way.

Deliberate departure from "no process-wide switch": torch's CP is process-wide by its design (the patched
``F.scaled_dot_product_attention``, DTensor's custom op handlers, ``_cp_options``); a simulation sets them
only inside its fake world (planning/simulate/sharded_rank.py holds a lock while one lives) and puts every
one back when the step ends, whatever happens.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from .. import _compat
from ..errors import InputError
from .config import ParallelConfig

__all__ = ["check_context_parallel", "check_ring", "fsdp_mesh", "ring_attention", "RingCount", "sequence_length",
           "shard_sequence"]

_FEATURE = "context parallel's ring attention"
# the ring's forward ops (torch's call_maps): one call a layer's attention
_RING_FORWARD = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention")


def sequence_length(args: tuple, kwargs: dict) -> int | None:
    """The sequence length of a step's inputs: dim 1 of its token ids (the first integer tensor of two
    dimensions), else of its first tensor of two or more dimensions."""
    leaves = [t for t in _compat.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    ids = next((t for t in leaves if t.dim() == 2 and not t.is_floating_point() and not t.is_complex()), None)
    first = ids if ids is not None else next((t for t in leaves if t.dim() >= 2), None)
    return None if first is None else int(first.shape[1])


def check_context_parallel(model, args: tuple, kwargs: dict, config: ParallelConfig, device_type: str = "cuda"
                           ) -> None:
    """That ``model`` on these inputs can run torch's ring under ``config.cp``: CUDA ranks (``device_type``),
    SDPA attention (a transformers model's ``_attn_implementation``), no attention-mask tensor, and a
    sequence of ``2 x cp`` equal chunks (the head-tail load balancer). One clear line otherwise; nothing
    with cp 1."""
    cp = config.cp
    if cp == 1:
        return
    if config.pp > 1:
        raise InputError(f"context parallel (cp {cp}) with a pipeline (pp {config.pp}) is not simulated yet: "
                         "leave pp at 1 with cp")
    if device_type != "cuda":
        raise InputError(f"context parallel (cp {cp}) runs torch's ring attention, which takes CUDA's SDPA kernels "
                         "(flash, memory-efficient, cuDNN) and not CPU's: plan for CUDA ranks (device cuda)")
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if impl is not None and impl != "sdpa":
        raise InputError(f"context parallel (cp {cp}) runs attention as torch's ring over "
                         f"scaled_dot_product_attention, and the model's attention is {impl!r}: build it with "
                         "attn_implementation='sdpa'")
    if isinstance(kwargs.get("attention_mask"), torch.Tensor):
        raise InputError(f"context parallel (cp {cp}) runs causal attention without a mask tensor (torch's ring "
                         "takes is_causal only): drop attention_mask (pack sequences without padding)")
    s = sequence_length(args, kwargs)
    if s is None:
        raise InputError(f"context parallel (cp {cp}) splits the inputs on their sequence dimension, and none "
                         "of them is [batch, sequence, ...]")
    if s % (2 * cp):
        fit = 2 * cp * max(1, round(s / (2 * cp)))
        raise InputError(f"context parallel (cp {cp}) cuts each sequence into 2 x cp = {2 * cp} equal chunks "
                         f"(torch's head-tail load balancing), and the sequence length {s} is not a multiple of "
                         f"{2 * cp}: use e.g. {fit}")


def fsdp_mesh(mesh):
    """The mesh FSDP shards over under context parallel: ``dp_shard`` and ``cp`` flattened into one
    dimension, ``dp_shard_cp`` (torchtitan's ``fsdp = dp_shard x cp``), after ``dp_replicate`` under
    HSDP. The cp ranks hold different tokens of the same samples: their gradients are reduced over the
    same group as the data-parallel ranks' (FSDP2's reduce-scatter over dp_shard x cp)."""
    names = mesh.mesh_dim_names or ()
    shard = tuple(n for n in ("dp_shard", "cp") if n in names)
    flat = _compat.mesh_flatten(mesh[shard], "dp_shard_cp") if len(shard) > 1 else mesh[shard[0]]
    if "dp_replicate" not in names:
        return flat
    both = tuple(n for n in ("dp_replicate", "dp_shard_cp" if len(shard) > 1 else shard[0]))
    return mesh[both]


def shard_sequence(model, args: tuple, kwargs: dict, mesh, config: ParallelConfig) -> tuple[tuple, dict]:
    """This rank's shard of the step's inputs (the module docstring): every tensor whose dim 1 is the
    sequence, head-tail reordered and cut on the ``cp`` mesh dimension. torch's ``_context_parallel_shard``
    sets its process-wide options as it shards; they are put back."""
    s = sequence_length(args, kwargs)
    if config.cp == 1 or s is None:
        return args, kwargs
    first = next(t for t in _compat.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.dim() >= 2)
    leaves, spec = _compat.tree_flatten((args, kwargs))
    at = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[1] == s]
    cpm = _compat.context_parallel(_FEATURE)
    saved = (cpm._dispatch_mode, cpm._cp_options.enable_load_balance)
    try:
        balancer = _compat.head_tail_balancer(s, config.cp, first.device)
        with torch.no_grad():
            shards = cpm._context_parallel_shard(mesh["cp"], [leaves[i] for i in at], [1] * len(at), balancer)
    finally:
        cpm._dispatch_mode, cpm._cp_options.enable_load_balance = saved
    for i, t in zip(at, shards):
        leaves[i] = t.contiguous()
    return _compat.tree_unflatten(leaves, spec)


@dataclass
class RingCount:
    """What the ring ran on a rank: its forward calls (one per attention layer and forward pass) and
    backward calls; ``tracker``: the rank's tracker, told while the ring runs (its collectives are the
    cp group's, RankTracker.ring_ops)."""

    tracker: object = None
    forward: int = 0
    backward: int = 0
    shapes: list = field(default_factory=list)      # (q, k, v) global shapes of the first forward call (DTensors)


@contextlib.contextmanager
def ring_attention(mesh, config: ParallelConfig, count: RingCount | None = None, router=None):
    """While the step runs, SDPA as torch's ring over the ``cp`` mesh dimension, with torch's load
    balancing of a causal mask and its default rotation; ``count`` (a RingCount) counts the ring's calls
    and tells its tracker (``in_ring``) while each runs; ``router`` (the rank's SdpaRouter): a call it
    gives CPU's math kernel, which has no ring (an fp32 GQA call on an H100: the efficient kernel takes no
    GQA there), fails inside DTensor's dispatch, and is one line instead. Nothing with cp 1."""
    if config.cp == 1:
        yield count
        return
    if router is not None:
        router = _MathRefused(router, config)
    cpm = _compat.context_parallel(_FEATURE)
    saved = (cpm._dispatch_mode, cpm._cp_options.enable_load_balance)
    count = count if count is not None else RingCount()

    def wrap(handler):
        def counted(op_call, args, kwargs):
            fwd = op_call._opname in _RING_FORWARD
            if fwd and not _compat.in_recompute():     # a checkpointed block's recompute is not a forward
                count.forward += 1
                if not count.shapes:
                    count.shapes.append(tuple(tuple(a.shape) for a in args[:3]))
            else:
                count.backward += 1
            tracker = count.tracker
            if tracker is not None:
                tracker.in_ring = True
            try:
                return handler(op_call, args, kwargs)
            finally:
                if tracker is not None:
                    tracker.in_ring = False
        return counted

    cpm._dispatch_mode = cpm._DispatchMode.MONKEY_PATCH
    cpm._cp_options.enable_load_balance = True
    restore = None
    try:
        cpm._enable_context_parallel_dispatcher_impl(seq_dim=2, mesh=mesh["cp"])
        restore = _compat.wrap_cp_handlers(wrap)
        yield count
    finally:
        if router is not None:
            router.undo()
        if restore is not None:
            restore()
        cpm._disable_context_parallel_dispatcher_impl()
        cpm._dispatch_mode, cpm._cp_options.enable_load_balance = saved


def check_ring(count: RingCount, config: ParallelConfig, router) -> None:
    """After a cp rank's step: that torch's ring ran the model's attention. A rank whose attention is not
    ``scaled_dot_product_attention`` (its own matmuls and softmax) would attend only to its own tokens,
    and one whose SDPA took CPU's math kernel is outside the ring: both a figure that is not context
    parallel's, so one clear line instead."""
    if config.cp == 1:
        return
    math = router.picked.get("math", 0) if router is not None else 0
    if math:
        passed = router.reasons.get("math")
        raise InputError(f"context parallel (cp {config.cp}) runs attention as torch's ring, which takes the flash, "
                         "memory-efficient and cuDNN kernels, and an SDPA call took the math kernel"
                         + (f" ({passed})" if passed else "") + ": compute in bf16 (mixed_precision bf16) or give "
                         "a GPU and shapes a fused kernel takes")
    if count.forward == 0:
        raise InputError(f"context parallel (cp {config.cp}) runs attention as torch's ring, and the model ran no "
                         "scaled_dot_product_attention, so each rank would attend to its own tokens only: use a "
                         "model whose attention is SDPA (transformers: attn_implementation='sdpa')")


class _MathRefused:
    """The router's ``call`` replaced on that one instance while the ring is on: a call it routed to the
    math kernel that then fails is the refusal check_ring words, raised at once."""

    def __init__(self, router, config: ParallelConfig) -> None:
        self.router, self.config = router, config
        call = router.call

        def guarded(args, kwargs):
            before = router.picked.get("math", 0)
            try:
                return call(args, kwargs)
            except RuntimeError:
                if router.picked.get("math", 0) > before:
                    check_ring(RingCount(forward=1), config, router)
                raise
        router.call = guarded

    def undo(self) -> None:
        del self.router.call      # the class's own method again
