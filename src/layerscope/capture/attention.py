"""SDPA run as the target GPU runs it, in meta and fake runs (issue 34).

``F.scaled_dot_product_attention`` picks its kernel inside C++ (no aten op to intercept below
autograd): meta decomposes it into the math kernel, fake CPU tensors take CPU's rules. For a GPU
target, a TorchFunctionMode (thread-local, entered only for the forward of such a run) takes each
SDPA call, picks the kernel with torch's CUDA rules for the target GPU (costs/sdpa.py) or the one
forced, and calls that kernel's own aten op with the inputs torch's dispatcher would hand it
(attention.cpp's ``scaled_dot_product_attention``):

* autocast: SDPA is in CUDA autocast's lower-precision list, so floating q, k, v and mask are cast to
  the autocast dtype first (the op called here is below that list);
* a boolean mask becomes an additive one (0 / -inf) in q's dtype;
* flash: head dims padded to a multiple of 8 (and the output sliced back);
* memory-efficient: the mask's last dim padded to a multiple of 8 when its strides are not aligned,
  then expanded to [B, H, Sq, Sk]; a single key/value head (multi-query, torch 2.14) expanded to the
  query's heads; the log-sum-exp kept when an input requires grad;
* math: ``_scaled_dot_product_attention_math`` (its fp16/bf16 inputs computed in fp32).

The kernel's op carries its registered formula (costs/attention.py: flash's backward recomputes the
scores, 2.5x the forward's contractions where math's backward is 2x) and its meta kernel's outputs
are what autograd saves (q, k, v, the output and a [B, H, Sq] fp32 log-sum-exp, not math's [B, H, Sq,
Sk] probabilities), so costs and memory follow the kernel. Each call's choice is counted for the
report's notes.
"""

from __future__ import annotations

import inspect
import math as _math
from collections import Counter

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..costs.gpus import GPU, gpu as gpu_row
from .. import _compat
from ..costs.sdpa import KERNEL_NAMES, RULES, choose, switched_off, unusable
from ..errors import InputError
from .notes import Note

__all__ = ["SdpaRouter", "router_for", "resolve_gpu"]

aten = torch.ops.aten
_SDPA = F.scaled_dot_product_attention
_UNROUTED = object()     # an autograd call the router leaves to torch
_NAMES = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_DEFAULTS = (None, None, None, None, 0.0, False, None, False)


def _bind(args: tuple, kwargs: dict) -> dict:
    call = dict(zip(_NAMES, _DEFAULTS))
    call.update(zip(_NAMES, args))
    call.update(kwargs)
    return call


def _additive(mask, dtype):
    """convert_boolean_attn_mask: a boolean mask as 0 where kept and -inf where masked."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.where(mask.logical_not(), mask.new_full((), -_math.inf, dtype=dtype),
                       mask.new_full((), 0.0, dtype=dtype))


def _pad_last(t, multiple: int):
    d = t.shape[-1]
    return t if d % multiple == 0 else F.pad(t, (0, multiple - d % multiple))


_MASK_ALIGN = 8   # attention.cpp preprocess_mask's mem_eff_alignment (torch 2.13 and 2.14: 8)


def _efficient_mask(mask, q, k):
    """preprocess_mask: pad the last dim to 8 when the strides are not aligned, expand to 4-D."""
    a = _MASK_ALIGN
    aligned = all(mask.stride(i) % a == 0 for i in range(mask.dim() - 1)) and mask.stride(-1) == 1
    if not aligned:
        n = mask.shape[-1]
        mask = F.pad(mask, (0, a - n % a))[..., :n]
    return mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])


def _run(kernel: str, q, k, v, mask, dropout, causal, scale, gqa, grad):
    if kernel == "flash":
        d = q.shape[-1]
        scale = scale if scale is not None else 1.0 / _math.sqrt(d)
        out = aten._scaled_dot_product_flash_attention(_pad_last(q, 8), _pad_last(k, 8), _pad_last(v, 8),
                                                       dropout, causal, False, scale=scale)[0]
        return out if out.shape[-1] == d else out[..., :d]
    mask = _additive(mask, q.dtype)
    if kernel == "efficient":
        mask = _efficient_mask(mask, q, k) if mask is not None else None
        if not gqa and q.dim() == 4 and k.shape[1] == v.shape[1] == 1 != q.shape[1]:
            k, v = k.expand(-1, q.shape[1], -1, -1), v.expand(-1, q.shape[1], -1, -1)   # multi-query
        return aten._scaled_dot_product_efficient_attention(q, k, v, mask, grad, dropout, causal, scale=scale)[0]
    if kernel == "cudnn":
        return aten._scaled_dot_product_cudnn_attention(q, k, v, mask, grad, dropout, causal, False,
                                                        scale=scale)[0]
    return aten._scaled_dot_product_attention_math(q, k, v, mask, dropout, causal, None, scale=scale,
                                                   enable_gqa=gqa)[0]


def _in_backward():
    return _compat.current_autograd_node("counting SDPA calls outside recomputation")()


def _describe(q, k) -> str:
    return f"{str(q.dtype).replace('torch.', '')} q {list(q.shape)}, k {list(k.shape)}"


class SdpaRouter:
    """One run's SDPA routing for a GPU target: ``gpu`` (a costs.gpus.GPU row) and ``forced`` ("auto":
    torch's rules; or "math", "flash", "efficient", "cudnn"). ``mode()`` is entered around each forward;
    ``picked`` counts the kernels chosen, ``notes()`` says what was priced."""

    def __init__(self, gpu: GPU, forced: str = "auto", autocast_device: str = "cpu") -> None:
        self.gpu = gpu
        self.forced = forced
        self.autocast_device = autocast_device
        self.picked: Counter = Counter()
        self.reasons: dict[str, str] = {}     # kernel -> why a kernel before it was passed over (first call)
        self.example: dict[str, str] = {}     # kernel -> the first call's shapes
        # the op clock at each kernel counted in ``picked`` (capture/compose.py): when ``clock`` is set
        self.clock = None
        self.ticks: list[tuple[int, str]] = []

    def mode(self) -> TorchFunctionMode:
        return _Mode(self)

    def backward(self, outputs, seeds) -> None:
        """``torch.autograd.backward(outputs, seeds)`` with the routing active in the backward too: a
        checkpointed block recomputes its forward there, and must take the kernel its forward took.
        torch.autograd.backward is itself overridable, so a mode pops itself while it runs and the
        engine would start without it; the engine is called directly instead, under a mode."""
        engine = _compat.engine_backward("routing SDPA in a checkpointed block's recompute")
        with self.mode():
            engine(tuple(outputs), tuple(seeds), False, False, (), allow_unreachable=True, accumulate_grad=True)

    def autograd(self, func, args: tuple, kwargs: dict):
        """``torch.autograd.grad`` or ``torch.autograd.backward`` (a call the mode saw) run by the engine
        directly under the mode; ``_UNROUTED`` for a form this does not take (batched gradients,
        materialized ones, a graph created, a backward to chosen inputs), which runs as torch runs it."""
        b = inspect.signature(func).bind(*args, **kwargs).arguments
        feature = "routing SDPA in a zero-bubble backward's recompute"
        if func is torch.autograd.grad:
            if b.get("is_grads_batched") or b.get("materialize_grads") or b.get("create_graph"):
                return _UNROUTED
            with self.mode():
                return _compat.engine_grad(feature, b["outputs"], b["inputs"], b.get("grad_outputs"),
                                           b.get("retain_graph"), False, b.get("allow_unused"))
        if b.get("inputs") is not None or b.get("create_graph") or b.get("grad_variables") is not None:
            return _UNROUTED
        outs = b["tensors"]
        outs = (outs,) if isinstance(outs, torch.Tensor) else tuple(outs)
        seeds = b.get("grad_tensors")
        seeds = (seeds,) if isinstance(seeds, torch.Tensor) else tuple(seeds) if seeds is not None \
            else (None,) * len(outs)
        engine = _compat.engine_backward(feature)
        with self.mode():
            engine(outs, _compat.need("make_grads", feature)(outs, seeds, is_grads_batched=False),
                   bool(b.get("retain_graph")), False, (), allow_unreachable=True, accumulate_grad=True)
        return None

    def call(self, args: tuple, kwargs: dict):
        c = _bind(args, kwargs)
        q, k, v, mask = c["query"], c["key"], c["value"], c["attn_mask"]
        if any(isinstance(t, torch.Tensor) and t.is_nested for t in (q, k, v)):
            return _SDPA(*args, **kwargs)     # jagged inputs: torch's own rules
        if torch.is_autocast_enabled(self.autocast_device):
            low = torch.get_autocast_dtype(self.autocast_device)
            q, k, v, mask = (t.to(low) if isinstance(t, torch.Tensor) and t.is_floating_point() and
                             t.dtype != torch.float64 else t for t in (q, k, v, mask))
        dropout, causal, scale, gqa = float(c["dropout_p"]), bool(c["is_causal"]), c["scale"], bool(c["enable_gqa"])
        grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
        if self.forced == "auto":
            kernel, passed = choose(self.gpu, q, k, v, mask, dropout, causal, gqa, grad, switched_off())
            why = "; ".join(f"{KERNEL_NAMES[k]}: {w}" for k, w in passed.items())
            if kernel is None:   # as torch's "No available kernel. Aborting execution."
                raise RuntimeError(f"no SDPA kernel can run {_describe(q, k)} on the {self.gpu.name}: {why}")
            if passed and kernel not in self.reasons:
                self.reasons[kernel] = why
        else:
            kernel = self.forced
            why = unusable(kernel, self.gpu, q, k, v, mask, dropout, causal, gqa, grad)
            if why is not None:
                raise InputError(f"attention={kernel!r}: {KERNEL_NAMES[kernel]} cannot run the SDPA call with "
                                 f"{_describe(q, k)} on the {self.gpu.name}: {why}")
        if _in_backward() is None:   # not a checkpointed block's recompute
            self.picked[kernel] += 1
            self.example.setdefault(kernel, _describe(q, k))
            if self.clock is not None:
                self.ticks.append((self.clock(), kernel))
        return _run(kernel, q, k, v, mask, dropout, causal, scale, gqa, grad)

    def notes(self, passes: int = 1) -> list[Note]:
        """One record per kernel used: how many SDPA calls were priced as it (per forward, over ``passes``
        forwards), and why (reports/notes.py words them)."""
        g = self.gpu
        out = []
        for kernel, n in self.picked.most_common():
            each = passes > 1 and n % passes == 0
            out.append(Note("attention-kernel", {
                "calls": n // passes if each else n, "per_forward": each, "kernel": KERNEL_NAMES[kernel],
                "forced": self.forced != "auto", "rules": RULES, "gpu": g.name, "capability": tuple(g.capability),
                "example": self.example[kernel], "passed_over": self.reasons.get(kernel)}))
        return out


class _Mode(TorchFunctionMode):
    def __init__(self, router: SdpaRouter) -> None:
        super().__init__()
        self.router = router

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is _SDPA:
            return self.router.call(args, kwargs or {})
        if func is torch.autograd.grad or func is torch.autograd.backward:
            # called under the mode (torch's zero-bubble stage backward): the engine runs with the mode still
            # active, where torch would have popped it, so that a checkpointed block's recompute is routed
            done = self.router.autograd(func, args, kwargs or {})
            if done is not _UNROUTED:
                return done
        return func(*args, **(kwargs or {}))


def resolve_gpu(spec) -> GPU:
    """A GPU row from ``gpu=``: a GPU (costs.gpus.gpu(name, **overrides)), a name of the table, or None
    (the table's newest datacenter GPU)."""
    if isinstance(spec, GPU):
        return spec
    if spec is not None and not isinstance(spec, str):
        raise InputError(f"gpu must be a GPU name (H100, A100, ...) or layerscope.gpu(...), got {type(spec).__name__}")
    return gpu_row(spec)


def router_for(gpu, attention: str, *, simulated: bool, cuda_target: bool,
               autocast_device: str = "cpu") -> SdpaRouter | None:
    """The SDPA router a run needs, or None (torch picks the kernel itself).

    A simulated run (meta or fake tensors) routes when a GPU or a kernel is named, or when it predicts
    for CUDA without one here (then the table's newest datacenter GPU's rules). A run on real tensors
    runs the kernels of its own device, so naming either there is an InputError.
    """
    named = gpu is not None or attention != "auto"
    if not simulated:
        if named:
            raise InputError("gpu= and attention= price attention as a GPU would run it, in a run without "
                             "values (device='meta', or memory()'s simulated step); this run computes on real "
                             "tensors, which run their own device's kernels")
        return None
    if not named and not (cuda_target and not torch.cuda.is_available()):
        return None
    return SdpaRouter(resolve_gpu(gpu), attention, autocast_device)
