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

import math

from ._util import numel, prod, shape
from .registry import OpCall, OpCost, register


def contraction(macs: int, adds: int = 0) -> OpCost:
    """The cost of a contraction: its MACs, and FLOPs = 2 * MACs + the other adds (a bias: one per
    output element). Every contraction formula (matmul family, conv, attention, recurrent layers; aten
    ops and ONNX op types alike) counts through here."""
    return OpCost(macs, 2 * macs + adds)


def matmul_macs(a, b) -> int:
    """MACs of a matmul of shapes a and b with numpy semantics: batch dims broadcast, a 1-D operand is
    promoted (a: [k] -> [1, k], b: [k] -> [k, 1]) and the added dim removed again."""
    a, b = [int(d) for d in a], [int(d) for d in b]
    if len(a) == 1:
        a = [1] + a
    if len(b) == 1:
        b = b + [1]
    m, k, n = a[-2], a[-1], b[-1]
    batch_a, batch_b = a[:-2], b[:-2]
    nd = max(len(batch_a), len(batch_b))
    batch_a = [1] * (nd - len(batch_a)) + batch_a
    batch_b = [1] * (nd - len(batch_b)) + batch_b
    return math.prod(max(x, y) for x, y in zip(batch_a, batch_b)) * m * k * n


def einsum_macs(equation: str, shapes) -> int | None:
    """MACs of an einsum of two or more operands: the product of every index's size (each output
    element is a sum over the contracted indices). None where it cannot tell (ellipsis, a rank that
    does not match its term)."""
    lhs = equation.replace(" ", "").split("->")[0]
    terms = lhs.split(",")
    if len(terms) < 2 or any("..." in t for t in terms):
        return None
    size: dict[str, int] = {}
    for t, s in zip(terms, shapes):
        if len(t) != len(s):
            return None
        for ch, d in zip(t, s):
            size[ch] = max(size.get(ch, 1), d)
    return math.prod(size.values())


@register("mm", "_int_mm")
def mm(c: OpCall) -> OpCost:
    (m, k), n = shape(c.args[0]), shape(c.args[1])[1]
    return contraction(m * k * n)


@register("addmm", "addmm_")
def addmm(c: OpCall) -> OpCost:
    (m, k), n = shape(c.args[1]), shape(c.args[2])[1]
    return contraction(m * k * n, m * n)


@register("bmm")
def bmm(c: OpCall) -> OpCost:
    b, m, k = shape(c.args[0])
    n = shape(c.args[1])[2]
    return contraction(b * m * k * n)


@register("baddbmm", "baddbmm_")
def baddbmm(c: OpCall) -> OpCost:
    b, m, k = shape(c.args[1])
    n = shape(c.args[2])[2]
    return contraction(b * m * k * n, b * m * n)


@register("addbmm", "addbmm_")
def addbmm(c: OpCall) -> OpCost:
    b, m, k = shape(c.args[1])
    n = shape(c.args[2])[2]
    return contraction(b * m * k * n, m * n)


@register("mv")
def mv(c: OpCall) -> OpCost:
    m, k = shape(c.args[0])
    return contraction(m * k)


@register("addmv", "addmv_")
def addmv(c: OpCall) -> OpCost:
    m, k = shape(c.args[1])
    return contraction(m * k, m)


@register("dot", "vdot")
def dot(c: OpCall) -> OpCost:
    return contraction(numel(c.args[0]))


@register("_scaled_mm", "_scaled_mm_v2")
def scaled_mm(c: OpCall) -> OpCost:
    (m, k), n = shape(c.args[0]), shape(c.args[1])[1]
    return contraction(m * k * n, m * n if c.arg("bias") is not None else 0)


@register("_weight_int8pack_mm", "_weight_int4pack_mm", "_weight_int4pack_mm_for_cpu",
          "_weight_int4pack_mm_with_scales_and_zeros")
def weight_packed_mm(c: OpCall) -> OpCost:
    return contraction(numel(c.outs[0]) * shape(c.args[0])[-1])


@register("_foreach_mm")
def foreach_mm(c: OpCall) -> OpCost:
    return contraction(sum(shape(a)[0] * shape(a)[1] * shape(b)[1] for a, b in zip(c.args[0], c.args[1])))


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
    bias = c.args[2] if len(c.args) > 2 else c.kwargs.get("bias")
    return contraction(rows * k * n, rows * n if bias is not None else 0)
