"""Fourier transforms, bucketing, grid sampling, polar form and all-true checks.

FFT (``_fft_c2c``, ``_fft_r2c``, ``_fft_c2r``): the radix-2 count, 5 N log2 N FLOPs per complex
  transform of N points (N: the product of the transformed dims); a real transform (r2c, c2r) is
  half of that, 2.5 N log2 N. A normalised transform (normalization != 0) adds 1 FLOP per output
  element for the scaling. No MACs: an FFT is not a contraction.
bucketize / searchsorted: a binary search, ceil(log2(B + 1)) comparisons per looked-up element for
  B boundaries.
grid_sampler_2d / 3d: as resizing does per output element: bilinear 7, nearest 0, bicubic 31;
  trilinear (3d) 15; their backward the same per gradient element.
polar: 4 FLOPs per output element (cos, sin and two products).
_is_all_true / _is_any_true: 1 per input element, as every reduction.
"""

from __future__ import annotations

import math

from ._util import numel, shape
from .registry import OpCall, OpCost, register


def _points(x, dims) -> int:
    s = shape(x)
    return math.prod(s[d] for d in dims) if dims else 1


def _fft(half: bool):
    def fn(c: OpCall) -> OpCost:
        # c2r: the transformed length along the last dim is the real output's, not the input's
        signal = c.outs[0] if c.func.__name__.startswith("_fft_c2r") else c.args[0]
        n = _points(signal, list(c.arg("dim")))
        transforms = numel(signal) // max(n, 1)
        per = (2.5 if half else 5.0) * n * math.log2(n) if n > 1 else 0.0
        scale = numel(c.outs[0]) if c.arg("normalization", 0) else 0
        return OpCost(0, int(round(per * transforms)) + scale)
    return fn


register("_fft_c2c")(_fft(False))
register("_fft_r2c", "_fft_c2r")(_fft(True))


@register("bucketize", "searchsorted")
def bucketize(c: OpCall) -> OpCost:
    # bucketize(input, boundaries); searchsorted(sorted_sequence, input): the looked-up elements
    name = c.func.__name__
    values, bounds = (c.args[0], c.args[1]) if name.startswith("bucketize") else (c.args[1], c.args[0])
    b = shape(bounds)[-1] if shape(bounds) else 1
    looked_up = numel(values) if hasattr(values, "shape") else 1
    return OpCost(0, looked_up * math.ceil(math.log2(b + 1)))


_GRID = {0: 7, 1: 0, 2: 31}           # interpolation_mode: bilinear, nearest, bicubic


def _grid(backward: bool):
    def fn(c: OpCall) -> OpCost:
        out = c.args[0] if backward else c.outs[0]           # backward: grad_output first
        three_d = "3d" in c.func.__name__
        mode = c.arg("interpolation_mode", 0)
        per = 15 if three_d and mode == 0 else _GRID.get(mode, 7)
        return OpCost(0, per * numel(out))
    return fn


register("grid_sampler_2d", "grid_sampler_3d", "_grid_sampler_2d_cpu_fallback")(_grid(False))
register("grid_sampler_2d_backward", "grid_sampler_3d_backward")(_grid(True))


@register("polar")
def polar(c: OpCall) -> OpCost:
    return OpCost(0, 4 * numel(c.outs[0]))


@register("_is_all_true", "_is_any_true")
def is_all_true(c: OpCall) -> OpCost:
    return OpCost(0, numel(c.args[0]))
