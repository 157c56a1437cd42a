"""Which kernel ``F.scaled_dot_product_attention`` runs on a CUDA GPU: torch's own selection rules.

A meta or fake run picks no kernel the way a GPU does (meta decomposes SDPA into the math kernel, fake
CPU tensors take the CPU rules), so an analysis for a GPU target applies these rules itself and prices,
and in memory() saves for backward, what that kernel does. The rules are those of
``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` (``select_sdp_backend``) as torch 2.14.1's
CUDA 13.0 wheel runs them with the cuDNN it ships (9.24, ``CUDNN_VERSION`` below); their messages were
checked against that wheel's ``libtorch_cuda.so``. What they read:

* order: cuDNN first on sm 9.x/10.x (cuDNN > 9.15 on CUDA 13: ``check_prefer_cudnn_attention``), else
  flash, memory-efficient, math (cuDNN last);
* every fused kernel: q, k, v 4-D [B, H, S, D], the same batch, the same heads or (``enable_gqa``)
  query heads a multiple of equal key/value heads, no zero-length sequence, last dims of stride 1;
* flash: no ``attn_mask``; fp16/bf16 (sm >= 8.0); sm 8.0-12.1; one head dim <= 256; ``is_causal`` only
  with Sq == Sk; training with head dim in (192, 224] (or (224, 256] with dropout) not on sm 8.6-8.9/12.x;
* memory-efficient: sm 5.0-12.1; fp16/fp32/bf16 (fp16/fp32 below sm 8.0); Dq == Dk and both head dims
  multiples of the GEMM alignment (8 for fp16/bf16, 4 for fp32 on sm >= 8.0); storage offsets aligned
  the same way (sm >= 8.0); a mask's last dim of stride 1;
* cuDNN: fp16/bf16 (sm >= 8.0); sm 8.0-12.1; dropout a multiple of 1/16; a 2-D or 4-D broadcastable mask
  without grad; B, H <= 65,535; head dims multiples of 8 up to 256 on sm 9.0/10.x (128 elsewhere), and
  for training <= 128, 192/128 or 256/256 there; Sk != 1; no Sq == 1 with dropout;
* math: always (the fallback);
* a kernel switched off in this thread's settings (``sdpa_kernel(...)``, ``torch.backends.cuda.enable_*_sdp``)
  is passed over, and cuDNN under ``torch.use_deterministic_algorithms(True)``;
* cuDNN 9.19-9.25.0 (but 9.24.1) refuses one-token queries (decode) on sm 10.x/11.x.

What changed in torch 2.14 (pytorch#191085) follows the torch that runs: from 2.14 memory-efficient
attention takes grouped-query heads, and every fused kernel takes a single key/value head without
``enable_gqa`` (multi-query broadcast); on 2.13 neither. Nested (jagged) inputs are not routed: torch's
own rules run on them.
"""

from __future__ import annotations

from typing import Literal

import torch

from .gpus import GPU

__all__ = ["CUDNN_VERSION", "KERNELS", "KERNEL_NAMES", "Kernel", "RULES", "TORCH", "choose", "order", "switched_off",
           "unusable"]

Kernel = Literal["math", "flash", "efficient", "cudnn"]
KERNELS: tuple[str, ...] = ("math", "flash", "efficient", "cudnn")
KERNEL_NAMES = {"math": "the math kernel", "flash": "flash attention", "efficient": "memory-efficient attention",
                "cudnn": "cuDNN attention"}
CUDNN_VERSION = 92400      # torch 2.14.1's CUDA 13.0 wheel ships cuDNN 9.24 (nvidia-cudnn-cu13 9.24.0.43)

_HALF = (torch.float16, torch.bfloat16)
TORCH = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
# From torch 2.14 (pytorch#191085) memory-efficient attention takes grouped-query heads (its meta backward
# before that returns the key's gradient with the query's heads), and every fused kernel takes one key
# and value head without enable_gqa (multi-query attention broadcast); the running torch's rule applies.
_2_14 = TORCH >= (2, 14)
RULES = "torch 2.14's" if _2_14 else f"torch 2.14's (with {TORCH[0]}.{TORCH[1]}'s GQA limits)"


def _sm(cap: tuple[int, int], lo: tuple[int, int], hi: tuple[int, int]) -> bool:
    return lo <= tuple(cap) <= hi


def _dense(q, k, v, mask, enable_gqa: bool, ignore_singleton: bool, same_kv_heads: bool = True) -> str | None:
    """The checks every fused kernel makes of dense inputs (sdp_utils_cpp.h); cuDNN lets key and value
    head counts differ under GQA when each divides the query's (requires_same_num_heads=false)."""
    if not (q.dim() == k.dim() == v.dim() == 4):
        return f"q, k and v must be 4-D (got {q.dim()}-D, {k.dim()}-D, {v.dim()}-D)"
    if not (q.shape[0] == k.shape[0] == v.shape[0]):
        return "q, k and v have different batch sizes"
    hq, hk, hv = q.shape[1], k.shape[1], v.shape[1]
    if _2_14 and hk == hv == 1 and hq != 1:
        pass                                  # one key/value head broadcast (multi-query), any enable_gqa
    elif enable_gqa:
        if (same_kv_heads and hk != hv) or hq % hk or hq % hv:
            return f"grouped-query heads must divide: {hq} query heads, {hk} key, {hv} value"
    elif not (hq == hk == hv):
        return f"q, k and v have different head counts ({hq}, {hk}, {hv})"
    if q.shape[2] == 0 or k.shape[2] == 0:
        return "a sequence has length 0"
    strides_ok = q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    if ignore_singleton:
        strides_ok = strides_ok or q.shape[-1] == 1
    if not strides_ok or (mask is not None and mask.stride(-1) != 1):
        return "a last dimension does not have stride 1"
    return None


def _dtype(q, k, v, allowed) -> str | None:
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in allowed:
        names = "/".join(str(d).replace("torch.", "") for d in allowed)
        return f"{str(q.dtype).replace('torch.', '')} inputs (it takes {names})"
    return None


def _flash(g: GPU, q, k, v, mask, dropout, causal, gqa, grad) -> str | None:
    cap = g.capability
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return _dense(q, k, v, mask, gqa, True)
    if mask is not None:
        return "it takes no attn_mask"
    d = q.shape[-1]
    if not (d == k.shape[-1] == v.shape[-1]) or d > 256:
        return f"it needs one head dim <= 256 (got q {d}, k {k.shape[-1]}, v {v.shape[-1]})"
    if not _sm(cap, (8, 0), (12, 1)):
        return f"it needs sm 8.0-12.1 (the {g.name} is sm {cap[0]}.{cap[1]})"
    if grad and (_sm(cap, (8, 6), (8, 9)) or _sm(cap, (12, 0), (12, 1))) and \
            not (d <= 192 or (not dropout and d > 224)):
        return f"training with head dim {d} is not supported on sm {cap[0]}.{cap[1]}"
    if causal and q.shape[2] != k.shape[2]:
        return "is_causal needs Sq == Sk"
    return _dtype(q, k, v, _HALF) or _dense(q, k, v, None, gqa, True)


def _gemm_alignment(g: GPU, dtype) -> int:
    # minimum_gemm_alignment: tensor cores from sm 8.0 (and for fp16/bf16 from sm 7.0)
    half = dtype in _HALF
    major = g.capability[0]
    tc = major >= 8 or (major >= 7 and half)
    mn = 4 if major >= 8 else 1
    return max(mn, 128 // (16 if half else 32)) if tc else mn


def _efficient(g: GPU, q, k, v, mask, dropout, causal, gqa, grad) -> str | None:
    cap = g.capability
    if not _sm(cap, (5, 0), (12, 1)):
        return f"it needs sm 5.0-12.1 (the {g.name} is sm {cap[0]}.{cap[1]})"
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return _dense(q, k, v, mask, gqa, False)
    align = _gemm_alignment(g, q.dtype)
    dq, dk, dv = q.shape[-1], k.shape[-1], v.shape[-1]
    if dq != dk or dq % align or dv % align or not dq or not dv:
        return f"head dims must be equal multiples of {align} (got q {dq}, k {dk}, v {dv})"
    if cap[0] >= 8:
        size = align * q.element_size()
        if any(t.numel() and (t.storage_offset() * t.element_size()) % size for t in (q, k, v)):
            return f"q, k and v must start at multiples of {size} bytes"
    allowed = (torch.float16, torch.float32, torch.bfloat16) if cap[0] >= 8 else (torch.float16, torch.float32)
    if gqa and not _2_14 and q.shape[1] != k.shape[1]:
        return "grouped-query heads (it takes them from torch 2.14)"
    return _dense(q, k, v, mask, gqa, False) or _dtype(q, k, v, allowed)


def _cudnn(g: GPU, q, k, v, mask, dropout, causal, gqa, grad) -> str | None:
    cap = g.capability
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        return _dense(q, k, v, mask, gqa, True)
    bad = _dtype(q, k, v, _HALF if cap[0] >= 8 else (torch.float16,))
    if bad:
        return bad
    if mask is not None:
        b, h, sq, sk = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
        ok = not mask.requires_grad and mask.shape[-2] in (sq, 1) and mask.shape[-1] in (sk, 1) and \
            (mask.dim() == 2 or (mask.dim() == 4 and mask.shape[0] in (1, b) and mask.shape[1] in (1, h)))
        if not ok:
            return f"its mask must be 2-D or 4-D and broadcast to [B, H, Sq, Sk] (got {list(mask.shape)})"
    if not _sm(cap, (8, 0), (12, 1)):
        return f"it needs sm 8.0-12.1 (the {g.name} is sm {cap[0]}.{cap[1]})"
    if dropout * 16 != int(dropout * 16):
        return f"its dropout must be a multiple of 1/16 (got {dropout})"
    bad = _dense(q, k, v, mask, gqa, True, same_kv_heads=False)
    if bad:
        return bad
    if q.shape[0] > 65535 or q.shape[1] > 65535:
        return "batch or heads over 65,535"
    dqk, dv = q.shape[-1], v.shape[-1]
    sm90_10x = tuple(cap) == (9, 0) or cap[0] == 10
    d256 = sm90_10x and not (tuple(cap) == (10, 7) and CUDNN_VERSION <= 92500) and CUDNN_VERSION > 92200
    limit = 256 if d256 else 192 if (sm90_10x and CUDNN_VERSION >= 91100 and (dqk, dv) == (192, 128)) else 128
    if dqk > limit or dv > limit:
        return f"head dims over {limit}"
    if dqk % 8 or dv % 8:
        return "head dims must be multiples of 8"
    if q.shape[2] == 1 and cap[0] in (10, 11) and 91900 <= CUDNN_VERSION <= 92500 and CUDNN_VERSION != 92401:
        return "query length 1 (decode) is disabled on sm 10.x/11.x for cuDNN 9.19-9.25.0"
    if k.shape[2] == 1:
        return "key length 1"
    if dropout and q.shape[2] == 1:
        return "query length 1 with dropout"
    if grad and d256 and not (dqk <= 128 and dv <= 128 or (dqk, dv) in ((192, 128), (256, 256))):
        return f"no backward for head dims {dqk}/{dv}"
    return None


_CHECKS = {"flash": _flash, "efficient": _efficient, "cudnn": _cudnn}


def switched_off() -> dict[str, str]:
    """The kernels the user turned off in this thread's torch settings: ``sdpa_kernel(...)`` contexts and
    ``torch.backends.cuda.enable_*_sdp(False)`` (check_runtime_disabled_*), and cuDNN under
    ``torch.use_deterministic_algorithms(True)`` without warn_only (check_cudnn_deterministic)."""
    cuda = torch.backends.cuda
    off = {name: "turned off (torch.backends.cuda / sdpa_kernel)" for name, on in (
        ("flash", cuda.flash_sdp_enabled()), ("efficient", cuda.mem_efficient_sdp_enabled()),
        ("cudnn", cuda.cudnn_sdp_enabled()), ("math", cuda.math_sdp_enabled())) if not on}
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        off.setdefault("cudnn", "not deterministic (torch.use_deterministic_algorithms)")
    return off


def unusable(kernel: str, g: GPU, q, k, v, mask, dropout: float, causal: bool, gqa: bool,
             grad: bool, off: dict | None = None) -> str | None:
    """Why ``kernel`` cannot run this call on ``g`` (a short reason), or None when it can. ``off``: the
    kernels switched off (``switched_off()``), kernel -> why."""
    if off and kernel in off:
        return off[kernel]
    if kernel == "math":
        return None
    return _CHECKS[kernel](g, q, k, v, mask, dropout, causal, gqa, grad)


def order(g: GPU) -> tuple[str, ...]:
    """The order torch tries the kernels in on ``g`` (priority_order)."""
    if g.capability[0] in (9, 10):     # check_prefer_cudnn_attention: cuDNN > 9.15 on CUDA 13
        return ("cudnn", "flash", "efficient", "math")
    return ("flash", "efficient", "math", "cudnn")


def choose(g: GPU, q, k, v, mask, dropout: float, causal: bool, gqa: bool, grad: bool,
           off: dict | None = None) -> tuple[str | None, dict]:
    """The kernel torch picks for this call on ``g`` (None: none can run it, as when every usable kernel
    is switched off), and why each kernel before it was passed over."""
    passed = {}
    for kernel in order(g):
        why = unusable(kernel, g, q, k, v, mask, dropout, causal, gqa, grad, off)
        if why is None:
            return kernel, passed
        passed[kernel] = why
    return None, passed
