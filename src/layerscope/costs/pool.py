"""Pooling and resizing, 1/2/3-d.

max pool:      FLOPs = numel(out) * (prod(k) - 1) comparisons
avg pool:      FLOPs = numel(out) * prod(k)       (prod(k) - 1 adds + 1 divide)
adaptive pool: kernel per dim = ceil(in / out) (exact when out divides in), then as above
backward:      max pool: numel(grad_out) (scatter-add); avg pool: numel(grad_out) * prod(k);
               adaptive avg: numel(input); adaptive max: numel(grad_out)
resize (per output element): nearest 0 (a copy), linear 3 (2 mul + 1 add), bilinear 7, trilinear 15,
               bicubic 31; the backward op counts the same per grad_out element.
"""

from __future__ import annotations

import math

from ..trace import Window
from ._util import numel, prod, shape, tup
from .registry import OpCall, OpCost, register


# The conventions as functions of sizes (the aten formulas here and ONNX pooling and Resize).
def max_pool_flops(out_numel: int, kernel) -> int:
    return out_numel * (prod(kernel) - 1)


def avg_pool_flops(out_numel: int, kernel) -> int:
    return out_numel * prod(kernel)


def interpolation_flops(mode: str, dims: int) -> int:
    """FLOPs per output element of a resize: nearest 0 (a copy); linear over `dims` resized dims
    2**(dims + 1) - 1 (linear 3, bilinear 7, trilinear 15); cubic 31."""
    if mode == "nearest":
        return 0
    if mode == "linear":
        return 2 ** (dims + 1) - 1
    return 31


def _pool_window(c: OpCall, nd: int) -> Window:
    k = tup(c.arg("kernel_size"), nd)
    stride = c.arg("stride")
    s = k if not stride else tup(stride, nd)
    return Window("conv", k, s, tup(c.arg("padding", 0), nd), tup(c.arg("dilation", 1), nd))


def _max_pool(nd: int):
    def fn(c: OpCall) -> OpCost:
        k = tup(c.arg("kernel_size"), nd)
        return OpCost(0, max_pool_flops(numel(c.outs[0]), k), window=_pool_window(c, nd))
    return fn


def _avg_pool(nd: int):
    def fn(c: OpCall) -> OpCost:
        k = tup(c.arg("kernel_size"), nd)
        return OpCost(0, avg_pool_flops(numel(c.outs[0]), k), window=_pool_window(c, nd))
    return fn


def _adaptive_kernel(x, out, nd: int) -> tuple[int, ...]:
    i, o = shape(x)[-nd:], shape(out)[-nd:]
    return tuple(math.ceil(a / max(b, 1)) for a, b in zip(i, o))


def _adaptive_window(x, out, nd: int) -> Window:
    i, o = shape(x)[-nd:], shape(out)[-nd:]
    k = _adaptive_kernel(x, out, nd)
    s = tuple(max(a // max(b, 1), 1) for a, b in zip(i, o))
    return Window("conv", k, s, (0,) * nd, (1,) * nd)


def _adaptive(nd: int, is_max: bool):
    def fn(c: OpCall) -> OpCost:
        x, out = c.args[0], c.outs[0]
        k = _adaptive_kernel(x, out, nd)
        flops = max_pool_flops(numel(out), k) if is_max else avg_pool_flops(numel(out), k)
        return OpCost(0, flops, window=_adaptive_window(x, out, nd))
    return fn


for _n in (1, 2, 3):
    register(f"max_pool{_n}d", f"max_pool{_n}d_with_indices")(_max_pool(_n))
    register(f"avg_pool{_n}d")(_avg_pool(_n))
    register(f"adaptive_max_pool{_n}d")(_adaptive(_n, True))
register("_adaptive_avg_pool2d", "adaptive_avg_pool2d")(_adaptive(2, False))
register("_adaptive_avg_pool3d", "adaptive_avg_pool3d")(_adaptive(3, False))
register("adaptive_avg_pool1d")(_adaptive(1, False))


@register("max_pool2d_with_indices_backward", "max_pool3d_with_indices_backward",
          "adaptive_max_pool2d_backward", "adaptive_max_pool3d_backward", "max_pool2d_backward",
          "max_unpool2d", "max_unpool3d")
def max_pool_backward(c: OpCall) -> OpCost:
    return OpCost(0, numel(c.args[0]))


@register("avg_pool2d_backward", "avg_pool3d_backward")
def avg_pool_backward(c: OpCall) -> OpCost:
    nd = c.args[1].dim() - 2
    return OpCost(0, numel(c.args[0]) * prod(tup(c.arg("kernel_size"), nd)))


@register("_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d_backward")
def adaptive_avg_pool_backward(c: OpCall) -> OpCost:
    return OpCost(0, numel(c.args[1]))


_RESIZE = {"nearest": interpolation_flops("nearest", 0), "linear": interpolation_flops("linear", 1),
           "bilinear": interpolation_flops("linear", 2), "trilinear": interpolation_flops("linear", 3),
           "bicubic": interpolation_flops("cubic", 2)}


def _resize(per: int, backward: bool):
    def fn(c: OpCall) -> OpCost:
        out = c.args[0] if backward else c.outs[0]
        window = None
        if not backward:
            x = c.args[0]
            nd = x.dim() - 2
            scale = tuple(shape(out)[2 + d] / max(shape(x)[2 + d], 1) for d in range(nd))
            window = Window("resize", (1,) * nd, scale, (0,) * nd, (1,) * nd)
        return OpCost(0, per * numel(out), window=window)
    return fn


for _mode, _per in _RESIZE.items():
    dims = {"nearest": (1, 2, 3), "linear": (1,), "bilinear": (2,), "trilinear": (3,), "bicubic": (2,)}[_mode]
    for _d in dims:
        names = [f"upsample_{_mode}{_d}d"]
        if _mode == "nearest":
            names.append(f"_upsample_nearest_exact{_d}d")
        if _mode in ("bilinear", "bicubic"):
            names.append(f"_upsample_{_mode}{_d}d_aa")
        register(*names)(_resize(_per, False))
        register(*(n + "_backward" for n in names))(_resize(_per, True))
