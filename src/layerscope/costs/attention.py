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
"""

from __future__ import annotations

from ._util import prod, shape
from .registry import OpCall, OpCost, register

SOFTMAX_FWD = 5   # max, subtract, exp, sum, divide
SOFTMAX_BWD = 4   # dS = P * (dP - rowsum(dP * P)): mul, sum, sub, mul


def _kept_scores(sq: int, sk: int, causal: bool, options) -> int:
    if causal and options.causal == "unmasked":
        full_rows = max(0, sq - sk)  # rows i >= sk - 1 keep every key
        partial = min(sq, sk)
        return partial * (partial + 1) // 2 + full_rows * sk
    return sq * sk


def _sdpa(q, k, v, causal: bool, has_mask: bool, backward: bool, options) -> OpCost:
    qs, vs = shape(q), shape(v)
    batch, sq, d = prod(qs[:-2]), qs[-2], qs[-1]
    sk, dv = shape(k)[-2], vs[-1]
    scores = batch * _kept_scores(sq, sk, causal, options)
    if backward:
        macs = scores * (3 * d + 2 * dv)
        per_score = 1 + SOFTMAX_FWD + SOFTMAX_BWD + 1 + int(has_mask)
    else:
        macs = scores * (d + dv)
        per_score = 1 + SOFTMAX_FWD + int(has_mask)
    return OpCost(macs, 2 * macs + per_score * scores)


@register("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
          "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
          "_scaled_dot_product_fused_attention_overrideable")
def sdpa_forward(c: OpCall) -> OpCost:
    return _sdpa(c.args[0], c.args[1], c.args[2], bool(c.arg("is_causal", False)), _has_mask(c), False,
                 c.options)


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
                 c.options)


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
    scores = b * heads * sq * sk
    return OpCost(macs, 2 * macs + biases + scores * (1 + SOFTMAX_FWD + int(mask is not None)))
