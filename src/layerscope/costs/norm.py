"""Normalisation layers. Counts are FLOPs per element of the normalised input.

forward
  statistics (mean 1 + variance 3: subtract, square, add)   4   (batch norm in training, layer,
                                                                 group and instance norm)
  normalise (subtract mean, multiply by rstd)               2
  affine (weight multiply 1, bias add 1)                    1 + 1 when present
  batch norm in eval uses stored statistics: normalise + affine only.
  RMS norm: square 1 + add 1 (statistic), multiply by rstd 1, weight 1.
backward
  with batch statistics: recompute x_hat 2, d_bias 1, d_weight 2, dx = rstd*(g - mean(g) - x_hat*mean(g*x_hat))
  with g = dy*weight: 1 + 8  ->  14 with affine, 10 without (no g multiply, no d_weight/d_bias)
  batch norm with stored statistics: dx = dy*weight*rstd 2, d_weight 4 (x_hat 2 + mul-add 2), d_bias 1 -> 7;
  1 without affine
  RMS: x_hat 1, d_weight 2, g 1, dx = rstd*(g - x_hat*mean(g*x_hat)) 5 -> 9 with weight, 6 without
Per-channel scalar work (rsqrt of the variance, running-statistics update) is not counted.
"""

from __future__ import annotations

from ._util import numel
from .registry import OpCall, OpCost, register

STATS, NORMALISE = 4, 2
RMS_STATS, RMS_NORMALISE = 2, 1


def normalise_flops(n: int, *, stats: bool, weight: bool, bias: bool) -> int:
    """Batch, layer, group and instance norm forward over n elements (the aten formulas here and the
    ONNX op types in costs/onnx.py)."""
    return n * ((STATS if stats else 0) + NORMALISE + int(weight) + int(bias))


def rms_norm_flops(n: int, *, weight: bool) -> int:
    return n * (RMS_STATS + RMS_NORMALISE + int(weight))


def _fwd(n: int, with_stats: bool, weight, bias) -> OpCost:
    return OpCost(0, normalise_flops(n, stats=with_stats, weight=weight is not None, bias=bias is not None))


def _bwd(n: int, with_stats: bool, affine: bool) -> OpCost:
    if with_stats:
        per = 14 if affine else 10
    else:
        per = 7 if affine else 1
    return OpCost(0, per * n)


@register("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
          "cudnn_batch_norm", "miopen_batch_norm")
def batch_norm(c: OpCall) -> OpCost:
    return _fwd(numel(c.args[0]), bool(c.arg("training")), c.args[1], c.args[2])


@register("_native_batch_norm_legit_no_training")
def batch_norm_eval(c: OpCall) -> OpCost:
    return _fwd(numel(c.args[0]), False, c.args[1], c.args[2])


@register("_batch_norm_with_update", "_batch_norm_with_update_functional")
def batch_norm_update(c: OpCall) -> OpCost:
    return _fwd(numel(c.args[0]), True, c.args[1], c.args[2])


@register("_batch_norm_no_update")
def batch_norm_no_update(c: OpCall) -> OpCost:
    # Without running statistics the kernel normalises with batch statistics.
    return _fwd(numel(c.args[0]), c.args[3] is None, c.args[1], c.args[2])


@register("native_batch_norm_backward")
def batch_norm_backward(c: OpCall) -> OpCost:
    return _bwd(numel(c.args[1]), bool(c.arg("train")), c.args[2] is not None)


@register("batch_norm_backward")
def batch_norm_backward_update(c: OpCall) -> OpCost:
    # `update` is True when the forward used (and updated) batch statistics.
    return _bwd(numel(c.args[1]), bool(c.arg("update")) or c.args[3] is None, c.args[2] is not None)


@register("cudnn_batch_norm_backward", "miopen_batch_norm_backward")
def batch_norm_backward_vendor(c: OpCall) -> OpCost:
    return _bwd(numel(c.args[0]), True, c.args[2] is not None)


@register("native_layer_norm")
def layer_norm(c: OpCall) -> OpCost:
    return _fwd(numel(c.args[0]), True, c.args[2], c.args[3])


@register("native_layer_norm_backward")
def layer_norm_backward(c: OpCall) -> OpCost:
    return _bwd(numel(c.args[1]), True, c.args[5] is not None)


@register("native_group_norm")
def group_norm(c: OpCall) -> OpCost:
    return _fwd(numel(c.args[0]), True, c.args[1], c.args[2])


@register("native_group_norm_backward")
def group_norm_backward(c: OpCall) -> OpCost:
    return _bwd(numel(c.args[1]), True, c.args[4] is not None)


@register("_fused_rms_norm", "rms_norm")
def rms_norm(c: OpCall) -> OpCost:
    return OpCost(0, rms_norm_flops(numel(c.args[0]), weight=c.args[2] is not None))


@register("_fused_rms_norm_backward")
def rms_norm_backward(c: OpCall) -> OpCost:
    return OpCost(0, (9 if c.args[4] is not None else 6) * numel(c.args[1]))
