"""Attention kernels: every SDPA backend, their backward, and the fused nn.MultiheadAttention op.

q [..., Sq, D], k [..., Sk, D], v [..., Sk, Dv]; batch = prod(q.shape[:-2]) (heads included; GQA keys
are broadcast to the query heads, as the kernel computes). scores = batch * Sq * Sk.
  forward  MACs = batch*Sq*Sk*D (Q.K^T) + batch*Sq*Sk*Dv (P.V)
           FLOPs = 2*MACs + scores * (1 scale + 5 softmax [+ 1 mask add])
  backward MACs = batch*Sq*Sk*(3*D + 2*Dv): the kernel recomputes Q.K^T, then dP = dO.V^T, dV = P^T.dO,
           dQ = dS.K, dK = dS^T.Q
           FLOPs = 2*MACs + scores * (1 scale + 5 softmax recompute + 4 softmax backward + 1 grad scale
           [+ 1 mask])
Causal attention: by default every score is counted (what the dense kernel computes); with
CostOptions(causal="unmasked") only the scores the top-left causal mask keeps (sum over query rows i of
min(i + 1, Sk)) are counted, and MACs and score FLOPs scale with them.

The kernels under SDPA (``_flash_attention_*``, ``_efficient_attention_*``, CUDA) take q [B, Sq, H, D],
k [B, Sk, Hk, D], v [B, Sk, Hk, Dv] (heads third; GQA keys broadcast to the H query heads), or, packed
("varlen": nested tensors, padding-free batches), q [Tq, H, D] (efficient: [1, Tq, H, D]) with
cumulative lengths cu_seqlens_q/k [B + 1]: the same formulas summed over the sequences,
scores = H * sum_b Sq_b * Sk_b (Sk_b = seqused_k[b] / seqlen_k[b] where given). The lengths are read
from the cumulative-length tensors' values; where they have none (a meta or fake run) the op is left
uncounted and named in the report's coverage rather than guessed (the shapes bound the count only
loosely: at most min(Tq * max_k, max_q * Tk) scores).
Their masks: flash ``is_causal`` and efficient ``custom_mask_type`` 2 align the causal diagonal to the
bottom right (row i keeps keys j <= i + Sk - Sq), efficient type 1 to the top left; flash
``window_size_left/right`` and efficient ``window_size`` (keys i - window_size < j <= i) restrict it
further. Like SDPA, by default every score is counted; causal="unmasked" counts the kept ones.
Counted dense, a masked op also says what share of its FLOPs a tiled kernel runs (``OpCost.executed``,
the kept scores over all): the step-time model prices that (flash, cuDNN and the efficient kernel skip
the tiles the mask drops).
An additive bias (efficient ``bias``, flash ``alibi_slopes``) is the 1 mask FLOP per score; dropout and
the FP8 descales of the quantized variants are not counted (like matmul's alpha).
"""

from __future__ import annotations

from ..trace import AttentionShape
from ._util import prod, shape
from .elementwise import SOFTMAX as SOFTMAX_FWD
from .elementwise import SOFTMAX_BACKWARD as SOFTMAX_BWD
from .matmul import contraction
from .registry import OpCall, OpCost, register


def attention_cost(scores: int, d: int, dv: int, *, bias: bool, backward: bool = False,
                   rows: int | None = None, masked: bool = False, dropout: bool = False) -> OpCost:
    """Attention over ``scores`` query-key pairs (heads and batch included) with head dims d (Q, K)
    and dv (V): the formulas above, shared by every kernel here and ONNX Attention (costs/onnx.py).
    ``rows``, the query rows (heads and batch included) of a fused kernel, goes with its head dims,
    whether it is masked and whether it drops out into ``OpCost.attention`` for the step-time model."""
    if backward:
        macs = scores * (3 * d + 2 * dv)
        per_score = 1 + SOFTMAX_FWD + SOFTMAX_BWD + 1 + int(bias)
    else:
        macs = scores * (d + dv)
        per_score = 1 + SOFTMAX_FWD + int(bias)
    cost = contraction(macs, per_score * scores)
    if rows is None:
        return cost
    return cost._replace(attention=AttentionShape(rows, d, dv, backward, masked, dropout))


def _causal_scores(sq: int, sk: int) -> int:
    """The scores the top-left causal mask keeps: sum over query rows i of min(i + 1, Sk)."""
    full_rows = max(0, sq - sk)  # rows i >= sk - 1 keep every key
    partial = min(sq, sk)
    return partial * (partial + 1) // 2 + full_rows * sk


def _sdpa(q, k, v, causal: bool, has_mask: bool, backward: bool, options, dropout: bool = False) -> OpCost:
    qs, vs = shape(q), shape(v)
    batch, sq, d = prod(qs[:-2]), qs[-2], qs[-1]
    sk, dv = shape(k)[-2], vs[-1]
    kw = dict(bias=has_mask, backward=backward, rows=batch * sq, masked=causal, dropout=dropout)
    if not causal:
        return attention_cost(batch * sq * sk, d, dv, **kw)
    kept = _causal_scores(sq, sk)
    if options.causal == "unmasked":
        return attention_cost(batch * kept, d, dv, **kw)
    # counted dense; a tiled kernel skips the masked tiles
    return attention_cost(batch * sq * sk, d, dv, **kw)._replace(executed=kept / max(sq * sk, 1))


def _dropout(c: OpCall) -> bool:
    return float(c.arg("dropout_p", 0.0) or 0.0) > 0


@register("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
          "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
          "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_attention_math_for_mps")
def sdpa_forward(c: OpCall) -> OpCost:
    return _sdpa(c.args[0], c.args[1], c.args[2], bool(c.arg("is_causal", False)), _has_mask(c), False,
                 c.options, _dropout(c))


def _has_mask(c: OpCall) -> bool:
    # backends name the additive mask attn_mask or attn_bias
    return c.arg("attn_mask", None) is not None or c.arg("attn_bias", None) is not None


@register("_scaled_dot_product_flash_attention_for_cpu_backward",
          "_scaled_dot_product_flash_attention_backward",
          "_scaled_dot_product_efficient_attention_backward",
          "_scaled_dot_product_cudnn_attention_backward",
          "_scaled_dot_product_fused_attention_overrideable_backward")
def sdpa_backward(c: OpCall) -> OpCost:
    return _sdpa(c.args[1], c.args[2], c.args[3], bool(c.arg("is_causal", False)), _has_mask(c), True,
                 c.options, _dropout(c))


@register("_native_multi_head_attention")
def native_mha(c: OpCall) -> OpCost:
    """nn.MultiheadAttention's fused fast path (eval, no grad).

    query [B, Sq, E], key/value [B, Sk, E], H heads of E/H:
      MACs = B*Sq*E*E (q proj) + 2*B*Sk*E*E (k, v proj) + 2*B*Sq*Sk*E (attention) + B*Sq*E*E (out proj)
      FLOPs = 2*MACs + bias adds (B*Sq*E + 2*B*Sk*E + B*Sq*E) + B*H*Sq*Sk*(1 + 5 [+ 1 mask])
    """
    q, k = c.args[0], c.args[1]
    b, sq, e = shape(q)
    sk = shape(k)[-2]
    heads = int(c.args[4])
    mask = c.arg("mask", None)
    macs = b * sq * e * e + 2 * b * sk * e * e + 2 * b * sq * sk * e + b * sq * e * e
    biases = (b * sq * e if c.args[6] is not None else 0) + (2 * b * sk * e if c.args[6] is not None else 0)
    biases += b * sq * e if c.args[8] is not None else 0
    # the score arithmetic as attention_cost counts it; the projections' MACs and bias adds on top
    att = attention_cost(b * heads * sq * sk, 0, 0, bias=mask is not None)
    return contraction(macs, biases + att.flops)


# ---- the kernels under SDPA: flash and memory-efficient attention (heads-third layout, varlen) ----
_NO_LIMIT = 1 << 62


def _clamped_sum(sq: int, sk: int, c: int) -> int:
    """sum over rows i in [0, sq) of clamp(i + c, 0, sk), in closed form."""
    c = max(min(c, sk + 1), -sq - 1)       # beyond these every term is already clamped
    lo = min(max(0, -c), sq)               # first row with i + c >= 0
    hi = min(max(0, sk - c), sq)           # first row with i + c >= sk
    middle = (hi - lo) * c + (lo + hi - 1) * (hi - lo) // 2
    return middle + (sq - hi) * sk


def _window_scores(sq: int, sk: int, *, offset: int, left: int, right: int) -> int:
    """Scores kept when row i sees keys j with i + offset - left <= j <= i + offset + right."""
    return _clamped_sum(sq, sk, offset + right + 1) - _clamped_sum(sq, sk, offset - left)


class LengthsUnknown(ValueError):
    """Packed sequences whose lengths a meta or fake run cannot read: the op is reported uncounted."""


def _values(c: OpCall, t, name: str) -> list[int]:
    """``t``'s values: its own, or those known beside a meta/fake run (capture/known.py)."""
    v = c.value_list(t)
    if v is None:
        raise LengthsUnknown(f"{name} has no values in this run (meta/fake): sequence lengths unknown")
    return [int(x) for x in v]


def _lengths(c: OpCall, cu, name: str) -> list[int]:
    vals = _values(c, cu, name)
    return [b - a for a, b in zip(vals, vals[1:])]


def _pairs(c: OpCall, q, k, cu_q, cu_k, used_k) -> list[tuple[int, int]]:
    """(Sq_b, Sk_b) of every sequence of the batch."""
    packed = cu_q is not None and cu_q.numel() > 0
    if packed:
        lq, lk = _lengths(c, cu_q, "cu_seqlens_q"), _lengths(c, cu_k, "cu_seqlens_k")
    else:
        b = shape(q)[0]
        lq, lk = [shape(q)[1]] * b, [shape(k)[1]] * b
    if used_k is not None:                 # keys actually used per sequence (a KV cache's fill)
        lk = _values(c, used_k, "seqused_k")
    return list(zip(lq, lk))


def _window(x) -> int:
    return _NO_LIMIT if x is None or int(x) < 0 else int(x)


def _fused(c: OpCall, *, backward: bool, flash: bool, varlen: bool = False) -> OpCost:
    q, k, v = c.arg("query"), c.arg("key"), c.arg("value")
    heads, d, dv = shape(q)[-2], shape(q)[-1], shape(v)[-1]
    if flash:
        if varlen:                         # torch_attn::_varlen_attn*: flash's arguments, named its way
            cu_q = c.arg("cu_seq_q")
            cu_k = c.arg("cu_seq_k")
            cu_k = cu_q if cu_k is None else cu_k
            window = c.arg("window_size") or (-1, -1)
            left, right = _window(window[0]), _window(window[1])
        else:
            cu_q, cu_k = c.arg("cum_seq_q"), c.arg("cum_seq_k")
            left, right = _window(c.arg("window_size_left")), _window(c.arg("window_size_right"))
        used_k = c.arg("seqused_k")
        causal = bool(c.arg("is_causal", False))
        bottom_right = True                # flash-attention 2 aligns the causal diagonal bottom right
        bias = c.arg("alibi_slopes") is not None
        if c.arg("block_table") is not None and used_k is None:
            raise LengthsUnknown("a paged KV cache (block_table) without seqused_k: key lengths unknown")
    else:
        cu_q, cu_k = c.arg("cu_seqlens_q"), c.arg("cu_seqlens_k")
        used_k = c.arg("seqlen_k")
        mask_type = int(c.arg("custom_mask_type", 0) or 0)
        causal, bottom_right = mask_type in (1, 2), mask_type == 2
        left, right = _window(c.arg("window_size")), _NO_LIMIT
        if left != _NO_LIMIT:              # keys i - window_size < j <= i
            left = max(left - 1, 0)
        bias = c.arg("bias") is not None
    if causal:
        right = min(right, 0)
    masked = causal or left != _NO_LIMIT or right != _NO_LIMIT
    unmasked = masked and c.options.causal == "unmasked"
    scores = kept = rows = 0
    for sq, sk in _pairs(c, q, k, cu_q, cu_k, used_k):
        dense = sq * sk
        scores += dense
        rows += sq
        kept += _window_scores(sq, sk, offset=sk - sq if bottom_right else 0, left=left, right=right) \
            if masked else dense
    kw = dict(bias=bias, backward=backward, rows=rows * heads, masked=masked, dropout=_dropout(c))
    if unmasked:
        return attention_cost(kept * heads, d, dv, **kw)
    return attention_cost(scores * heads, d, dv, **kw)._replace(executed=kept / scores if scores else 1.0)


@register("_flash_attention_forward", "_flash_attention_forward_no_dropout_inplace")
def flash_forward(c: OpCall) -> OpCost:
    return _fused(c, backward=False, flash=True)


@register("_flash_attention_backward")
def flash_backward(c: OpCall) -> OpCost:
    return _fused(c, backward=True, flash=True)


# torch.nn.attention.varlen.varlen_attn: custom ops that run flash (or cuDNN) attention over packed
# sequences, seen whole (their kernels run below the recorder); the same formulas as flash's varlen
# path, summed over the sequences of cu_seq_q/k. torch's FlopCounterMode counts the same dense sums
# (test: seq_lens [128, 64], 8 heads of 64: 4 * 8 * 64 * (128^2 + 64^2) = 41,943,040 FLOPs = 2 x MACs)
@register("torch_attn::_varlen_attn", "torch_attn::_varlen_attn_out")
def varlen_forward(c: OpCall) -> OpCost:
    return _fused(c, backward=False, flash=True, varlen=True)


@register("torch_attn::_varlen_attn_backward")
def varlen_backward(c: OpCall) -> OpCost:
    return _fused(c, backward=True, flash=True, varlen=True)


@register("_efficient_attention_forward")
def efficient_forward(c: OpCall) -> OpCost:
    return _fused(c, backward=False, flash=False)


@register("_efficient_attention_backward")
def efficient_backward(c: OpCall) -> OpCost:
    return _fused(c, backward=True, flash=False)
