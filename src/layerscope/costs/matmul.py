"""Matrix products. MACs = multiply-accumulates of the contraction; bias adds are FLOPs, not MACs.

mm      [m,k]@[k,n]                  MACs m*k*n           FLOPs 2*MACs
addmm   bias + [m,k]@[k,n]           MACs m*k*n           FLOPs 2*MACs + m*n (bias add)
bmm     [b,m,k]@[b,k,n]              MACs b*m*k*n         FLOPs 2*MACs
baddbmm bias + bmm                   MACs b*m*k*n         FLOPs 2*MACs + b*m*n
mv      [m,k]@[k]                    MACs m*k             FLOPs 2*MACs
addmv   bias + mv                    MACs m*k             FLOPs 2*MACs + m
dot     [k].[k]                      MACs k               FLOPs 2*MACs
addbmm  bias + sum_b bmm             MACs b*m*k*n         FLOPs 2*MACs + m*n
linear  x[..., k] W[n, k] (+bias)    MACs rows*k*n        FLOPs 2*MACs (+ rows*n)
_grouped_mm (mixture-of-experts)     a[M,k] @ b[G,k,n] (each row meets one group): M*k*n;
        a[G,m,k] @ b[G,k,n]: G*m*k*n; a[m,K] @ b[K,n] with groups over K: m*K*n   FLOPs 2*MACs (+ bias)
_scaled_mm, _scaled_mm_v2 (FP8/MX)  [m,k]@[k,n] like mm: MACs m*k*n  FLOPs 2*MACs (+ m*n bias)
_scaled_grouped_mm                  as _grouped_mm
_weight_int8pack_mm, _weight_int4pack_mm* (weight-only quantized LLM kernels)  x[m,k] @ W: MACs
        m*k*n (n from the output: the int4 weight is packed); FLOPs 2*MACs (dequantizing not counted)
_foreach_mm                         the sum of its mm's
matmul  (arrives whole only for nested tensors, whose matmul is its own kernel, and where composites are
        not decomposed) MACs = numel(out) * k, per component of a nested tensor   FLOPs 2*MACs
alpha/beta scaling is not counted, nor are the dequantizing scales of the scaled (FP8) products.
matmul/einsum/linear usually decompose into these before dispatch.
"""

from __future__ import annotations

from ._util import numel, prod, shape
from .registry import OpCall, OpCost, register


@register("mm", "_int_mm")
def mm(c: OpCall) -> OpCost:
    (m, k), n = shape(c.args[0]), shape(c.args[1])[1]
    macs = m * k * n
    return OpCost(macs, 2 * macs)


@register("addmm", "addmm_")
def addmm(c: OpCall) -> OpCost:
    (m, k), n = shape(c.args[1]), shape(c.args[2])[1]
    macs = m * k * n
    return OpCost(macs, 2 * macs + m * n)


@register("bmm")
def bmm(c: OpCall) -> OpCost:
    b, m, k = shape(c.args[0])
    n = shape(c.args[1])[2]
    macs = b * m * k * n
    return OpCost(macs, 2 * macs)


@register("baddbmm", "baddbmm_")
def baddbmm(c: OpCall) -> OpCost:
    b, m, k = shape(c.args[1])
    n = shape(c.args[2])[2]
    macs = b * m * k * n
    return OpCost(macs, 2 * macs + b * m * n)


@register("addbmm", "addbmm_")
def addbmm(c: OpCall) -> OpCost:
    b, m, k = shape(c.args[1])
    n = shape(c.args[2])[2]
    macs = b * m * k * n
    return OpCost(macs, 2 * macs + m * n)


@register("mv")
def mv(c: OpCall) -> OpCost:
    m, k = shape(c.args[0])
    return OpCost(m * k, 2 * m * k)


@register("addmv", "addmv_")
def addmv(c: OpCall) -> OpCost:
    m, k = shape(c.args[1])
    return OpCost(m * k, 2 * m * k + m)


@register("dot", "vdot")
def dot(c: OpCall) -> OpCost:
    k = numel(c.args[0])
    return OpCost(k, 2 * k)


@register("_scaled_mm", "_scaled_mm_v2")
def scaled_mm(c: OpCall) -> OpCost:
    (m, k), n = shape(c.args[0]), shape(c.args[1])[1]
    macs = m * k * n
    return OpCost(macs, 2 * macs + (m * n if c.arg("bias") is not None else 0))


@register("_weight_int8pack_mm", "_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu",
          "_weight_int4pack_mm_with_scales_and_zeros")
def weight_packed_mm(c: OpCall) -> OpCost:
    macs = numel(c.outs[0]) * shape(c.args[0])[-1]
    return OpCost(macs, 2 * macs)


@register("_foreach_mm")
def foreach_mm(c: OpCall) -> OpCost:
    macs = sum(shape(a)[0] * shape(a)[1] * shape(b)[1] for a, b in zip(c.args[0], c.args[1]))
    return OpCost(macs, 2 * macs)


@register("_grouped_mm", "_scaled_grouped_mm")
def grouped_mm(c: OpCall) -> OpCost:
    a, b = c.args[0], c.args[1]
    out = c.outs[0]
    if a.dim() == 2 and b.dim() == 2:       # the groups split the contraction: each k once
        macs = shape(a)[0] * shape(a)[1] * shape(b)[1]
    else:                                   # every output element is one dot product of length k
        macs = numel(out) * shape(a)[-1]
    bias = c.arg("bias")
    return OpCost(macs, 2 * macs + (numel(out) if bias is not None else 0))


@register("matmul")
def matmul(c: OpCall) -> OpCost:
    """Every output element is one dot product of length k (a's last dim): broadcast batches and
    1-D operands included. A nested tensor's components have their own sizes (P.V of attention over
    sequences of different lengths contracts over each one's length): summed per component."""
    a, out = c.args[0], c.outs[0]
    if a.is_nested:
        ka = a._nested_tensor_size().tolist()
        kout = out._nested_tensor_size().tolist()
        macs = sum(prod(o) * s[-1] for s, o in zip(ka, kout))
    else:
        macs = numel(out) * shape(a)[-1]
    return OpCost(macs, 2 * macs)


@register("linear")
def linear(c: OpCall) -> OpCost:
    x, w = c.args[0], c.args[1]
    k = shape(x)[-1]
    rows = prod(shape(x)[:-1])
    n = shape(w)[0]
    macs = rows * k * n
    bias = c.args[2] if len(c.args) > 2 else c.kwargs.get("bias")
    return OpCost(macs, 2 * macs + (rows * n if bias is not None else 0))
