"""Convolution, plain and transposed, any dimensionality, groups and dilation.

input [N, Cin, *in], weight [Cout, Cin/g, *k] (transposed: [Cin, Cout/g, *k]), output [N, Cout, *out]
  conv:        MACs = numel(output) * (Cin/g) * prod(k)    (each output element is one dot product)
  transposed:  MACs = numel(input)  * (Cout/g) * prod(k)   (each input element is scattered once)
  FLOPs = 2*MACs + numel(output) when there is a bias.
convolution_backward (output_mask = [input, weight, bias]):
  grad_input MACs = forward MACs; grad_weight MACs = forward MACs; grad_bias FLOPs = numel(grad_out).
"""

from __future__ import annotations

from ..trace import Window
from ._util import numel, prod, shape, tup
from .matmul import contraction
from .registry import OpCall, OpCost, register


def conv_macs(in_numel: int, weight_shape, out_numel: int, transposed: bool) -> int:
    """A convolution's MACs from its sizes (the aten formulas here and ONNX Conv/ConvTranspose)."""
    per = int(weight_shape[1]) * prod(weight_shape[2:])
    return in_numel * per if transposed else out_numel * per


def _conv_macs(x, w, out, transposed: bool) -> int:
    return conv_macs(numel(x), shape(w), numel(out), transposed)


def _window(w, stride, padding, dilation, transposed: bool) -> Window:
    ws = shape(w)
    nd = len(ws) - 2
    return Window("tconv" if transposed else "conv", ws[2:], tup(stride, nd), tup(padding, nd), tup(dilation, nd))


@register("convolution", "_convolution")
def convolution(c: OpCall) -> OpCost:
    x, w, b = c.args[0], c.args[1], c.args[2]
    stride, padding, dilation, transposed = c.args[3], c.args[4], c.args[5], bool(c.args[6])
    out = c.out
    macs = _conv_macs(x, w, out, transposed)
    cost = contraction(macs, numel(out) if b is not None else 0)
    # the contraction's cost with the window added (a namedtuple's _replace is slow for one field)
    return OpCost(cost.macs, cost.flops, cost.bytes_read, cost.bytes_written,
                  _window(w, stride, padding, dilation, transposed))


@register("convolution_backward")
def convolution_backward(c: OpCall) -> OpCost:
    grad_out, x, w = c.args[0], c.args[1], c.args[2]
    transposed, mask = bool(c.args[7]), c.args[10]
    macs_one = _conv_macs(x, w, grad_out, transposed)
    macs = macs_one * (int(bool(mask[0])) + int(bool(mask[1])))
    return contraction(macs, numel(grad_out) if mask[2] else 0)
