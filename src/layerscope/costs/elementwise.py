"""Pointwise arithmetic, activations, softmax, dropout, reductions and losses.

Pointwise ops: FLOPs per output element (broadcast inputs count once per output element)
  1  arithmetic (add, sub, mul, div, ...), comparisons, min/max, clamp, where, masked_fill,
     transcendental functions (exp, log, tanh, sigmoid, erf, ...) and activations (relu, gelu, silu, ...)
  2  fused two-step ops: addcmul, addcdiv, lerp, glu (per output), activation backward ops (derivative
     times grad), dropout (mask multiply and scale), dropout backward
softmax / log_softmax: 5 per element (max, subtract, exp, sum, divide/log); their backward: 4 per element
reductions (sum, mean, max, min, prod, any, all, argmax, cumsum, ...): 1 per input element (mean adds
  1 per output element for the divide); var/std: 3 per input element; norm: 2 per input element;
  logsumexp: 4 per input element; sort/topk: n*ceil(log2 n) comparisons along the sorted dim
losses: mse 3 per element (sub, square, add), its backward 2; nll 1 per target; nll backward 1 per
  target; binary cross-entropy 4 per element, its backward 4.
"""

from __future__ import annotations

import math

import torch

from ._util import numel, shape
from .registry import OpCall, OpCost, register

# The conventions, as pure functions of sizes: the aten formulas below and the ONNX op types
# (costs/onnx.py) both count with these.
POINTWISE = 1           # per output element: arithmetic, comparisons, transcendental functions, activations
SOFTMAX = 5             # per element: max, subtract, exp, sum, divide (log_softmax: log)
SOFTMAX_BACKWARD = 4    # per element: dS = P * (dP - rowsum(dP * P)): mul, sum, sub, mul


def pointwise_flops(out_numel: int) -> int:
    return POINTWISE * out_numel


def variadic_flops(n_inputs: int, out_numel: int, mean: bool = False) -> int:
    """n inputs combined elementwise (max, min, sum of n tensors): n - 1 per output element, at least 1;
    a mean adds 1 per element for the divide."""
    return out_numel * (max(1, n_inputs - 1) + int(mean))


def softmax_flops(elements: int) -> int:
    return SOFTMAX * elements


def reduce_flops(in_numel: int) -> int:
    """A reduction (sum, max, prod, argmax, cumsum, ...): 1 per input element."""
    return in_numel


def mean_flops(in_numel: int, out_numel: int) -> int:
    """A mean: the sum's 1 per input element and 1 divide per output element."""
    return in_numel + out_numel


def map_reduce_flops(in_numel: int) -> int:
    """One pointwise op then a sum (a vector norm: square and add): 2 per input element."""
    return 2 * in_numel


def sort_flops(elements: int, n: int) -> int:
    """Sort or top-k along a dim of n: n*ceil(log2 n) comparisons per row, i.e. ceil(log2 n) per element."""
    return elements * max(1, math.ceil(math.log2(max(n, 2))))


def _out_numel(c: OpCall) -> int:
    o = c.outs[0]
    return numel(o) if isinstance(o, torch.Tensor) else 1


def _pointwise(per: int, *names: str, inplace: bool = True) -> None:
    def fn(c: OpCall) -> OpCost:
        return OpCost(0, per * pointwise_flops(_out_numel(c)))

    fn.__doc__ = f"{per} FLOP(s) per output element."
    all_names = []
    for n in names:
        all_names.append(n)
        if inplace and hasattr(torch.ops.aten, n + "_"):
            all_names.append(n + "_")
    register(*all_names)(fn)


_pointwise(
    1,          # one pointwise op per output element (pointwise_flops)
    # arithmetic
    "add", "sub", "rsub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "neg",
    "abs", "reciprocal", "pow", "square", "sqrt", "rsqrt", "sign", "sgn", "floor", "ceil", "round",
    "trunc", "frac", "clamp", "clamp_min", "clamp_max", "clip", "minimum", "maximum", "fmin", "fmax",
    "where", "masked_fill", "copysign", "hypot", "xlogy", "nan_to_num", "heaviside",
    # comparisons and logic
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "logical_not",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "bitwise_left_shift",
    "bitwise_right_shift", "isnan", "isinf", "isposinf", "isneginf", "signbit",
    # transcendental
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
    "atan", "atan2", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv",
    "sigmoid", "logit", "special_erfcx", "lgamma", "digamma",
    # activations
    "relu", "relu6", "gelu", "silu", "mish", "elu", "selu", "celu", "leaky_relu", "hardtanh",
    "hardsigmoid", "hardswish", "softplus", "softshrink", "hardshrink", "threshold", "_prelu_kernel",
    "rrelu_with_noise", "log_sigmoid_forward", "prelu",
)
_pointwise(2, "addcmul", "addcdiv", "lerp")
_pointwise(
    2, "threshold_backward", "gelu_backward", "silu_backward", "sigmoid_backward", "tanh_backward",
    "hardtanh_backward", "leaky_relu_backward", "elu_backward", "softplus_backward",
    "hardswish_backward", "hardsigmoid_backward", "mish_backward", "logit_backward",
    "log_sigmoid_backward", "rrelu_with_noise_backward", "softshrink_backward", "hardshrink_backward",
    "native_dropout_backward", "glu", "glu_backward", inplace=False,
)


@register("_prelu_kernel_backward")
def prelu_backward(c: OpCall) -> OpCost:
    return OpCost(0, 2 * numel(c.args[0]))


@register("native_dropout")
def native_dropout(c: OpCall) -> OpCost:
    return OpCost(0, 2 * numel(c.args[0]))


@register("_softmax", "_log_softmax", "_safe_softmax", "softmax", "log_softmax")
def softmax(c: OpCall) -> OpCost:
    return OpCost(0, softmax_flops(numel(c.args[0])))


@register("_softmax_backward_data", "_log_softmax_backward_data")
def softmax_backward(c: OpCall) -> OpCost:
    return OpCost(0, SOFTMAX_BACKWARD * numel(c.args[0]))


# Reductions: one FLOP per input element read.
@register("sum", "nansum", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "any", "all",
          "cumsum", "cumsum_", "cumprod", "cumprod_", "cummax", "cummin", "count_nonzero", "aminmax",
          "histc", "bincount",
          "logcumsumexp")
def reduce_one(c: OpCall) -> OpCost:
    return OpCost(0, reduce_flops(numel(c.args[0])), window=_global_window(c))


@register("mean", "nanmean")
def mean(c: OpCall) -> OpCost:
    return OpCost(0, mean_flops(numel(c.args[0]), _out_numel(c)), window=_global_window(c))


@register("var", "std", "var_mean", "std_mean")
def var(c: OpCall) -> OpCost:
    return OpCost(0, 3 * numel(c.args[0]))


@register("norm", "linalg_vector_norm", "frobenius_norm")
def norm(c: OpCall) -> OpCost:
    return OpCost(0, map_reduce_flops(numel(c.args[0])))


@register("_weight_norm_interface")
def weight_norm(c: OpCall) -> OpCost:
    """w = g * v / ||v|| (per output row): the norm 2 per element of v, the scale 1 per element."""
    return OpCost(0, 3 * numel(c.args[0]))


@register("_weight_norm_interface_backward")
def weight_norm_backward(c: OpCall) -> OpCost:
    """grad_v = g/||v|| * (grad_w - w_hat * sum(grad_w * w_hat)), grad_g = sum(grad_w * w_hat): 5 per
    element of v."""
    return OpCost(0, 5 * numel(c.args[0]))


@register("logsumexp")
def logsumexp(c: OpCall) -> OpCost:
    return OpCost(0, 4 * numel(c.args[0]))


@register("sort", "topk", "kthvalue", "median", "nanmedian", "mode")
def sort(c: OpCall) -> OpCost:
    x = c.args[0]
    dim = c.arg("dim", -1)
    if not isinstance(dim, int):
        dim = -1
    n = shape(x)[dim] if x.dim() else 1
    return OpCost(0, sort_flops(numel(x), n))


def _global_window(c: OpCall):
    """A reduction over the trailing spatial dims of an [N, C, *spatial] tensor (global pooling)."""
    from ..trace import Window

    x = c.args[0]
    dims = c.arg("dim", None)
    # [N, C, H, W] or [N, C, D, H, W] only: a 3-D [B, S, hidden] reduction is a transformer's, not a pool
    if not isinstance(x, torch.Tensor) or x.dim() < 4 or not isinstance(dims, (list, tuple)) or not dims:
        return None
    nd = x.dim()
    norm_dims = sorted(d % nd for d in dims)
    if norm_dims != list(range(nd - len(norm_dims), nd)) or len(norm_dims) > nd - 2:
        return None
    k = tuple(shape(x)[d] for d in norm_dims)
    return Window("global", k, tuple(1 for _ in k), tuple(0 for _ in k), tuple(1 for _ in k))


@register("mse_loss")
def mse_loss(c: OpCall) -> OpCost:
    return OpCost(0, 3 * numel(c.args[0]))


@register("mse_loss_backward")
def mse_loss_backward(c: OpCall) -> OpCost:
    return OpCost(0, 2 * numel(c.args[1]))


@register("nll_loss_forward", "nll_loss2d_forward", "nll_loss_backward", "nll_loss2d_backward")
def nll_loss(c: OpCall) -> OpCost:
    target = c.arg("target")
    return OpCost(0, numel(target) if isinstance(target, torch.Tensor) else 1)


@register("binary_cross_entropy", "binary_cross_entropy_backward", "binary_cross_entropy_with_logits",
          "smooth_l1_loss", "smooth_l1_loss_backward", "huber_loss", "huber_loss_backward")
def bce(c: OpCall) -> OpCost:
    x = c.arg("self")
    return OpCost(0, 4 * numel(c.args[0] if x is None else x))
