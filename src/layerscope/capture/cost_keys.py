"""Which op calls cost what another call of the run already cost: a formula of the default registry
that reads nothing but its arguments' shapes, dtypes and plain values gives the same OpCost for the
same of those, and a deep model calls the same few ops on the same shapes block after block (a
1,000-block MLP: 2 distinct calls, 3,000 times). The Session prices the first of each and reuses it
(capture/session.py on_op): the formula's call, its OpCall and the byte sums are skipped, the figures
the same.

Only ops listed here (their formulas read shapes and arguments only: no values, no options) and
only calls whose every argument has a key: a plain tensor (its shape and dtype: what the formulas
and the byte sums read), a plain value, a list or tuple of those. Anything else (a tensor subclass,
a symbolic size, an object) is priced by its formula every time. Runs without values (meta, with
known values carried beside them) and a user's registry are never keyed (the Session asks)."""

from __future__ import annotations

import torch

__all__ = ["SHAPE_ONLY", "cost_key"]

# aten ops (overload packets) whose default formulas (costs/) read shapes, dtypes and plain
# arguments only: the matmuls and convolution (costs/matmul.py, conv.py), the pointwise ops
# (costs/elementwise.py _pointwise: per output element), eval-mode batch norm (costs/norm.py)
_POINTWISE = ("add", "sub", "rsub", "mul", "div", "neg", "abs", "reciprocal", "pow", "square", "sqrt",
              "rsqrt", "clamp", "clamp_min", "clamp_max", "minimum", "maximum", "where", "masked_fill",
              "exp", "log", "sin", "cos", "tanh", "erf", "sigmoid", "relu", "relu6", "gelu", "silu",
              "elu", "leaky_relu", "hardtanh", "hardsigmoid", "hardswish", "softplus")
SHAPE_ONLY = frozenset(("mm", "addmm", "bmm", "baddbmm", "convolution", "_native_batch_norm_legit_no_training")
                       + _POINTWISE + tuple(n + "_" for n in _POINTWISE))

_PLAIN = (torch.Tensor, torch.nn.Parameter)
_VALUES = frozenset((int, float, bool, str, type(None), torch.dtype, torch.device, torch.memory_format,
                     torch.layout))
_NONE = object()     # no key


def _key(a):
    t = type(a)
    if t is torch.Tensor or t is torch.nn.Parameter:
        if a.is_nested or a.layout is not torch.strided:
            return _NONE
        return (a.shape, a.dtype)
    if t in _VALUES:
        return (t, a)        # the type too: 1, 1.0 and True are equal keys
    if t is list or t is tuple:
        parts = []
        for x in a:
            k = _key(x)
            if k is _NONE:
                return _NONE
            parts.append(k)
        return (t, tuple(parts))
    return _NONE


def cost_key(func, args: tuple, kwargs: dict, outs: list) -> tuple | None:
    """What fixes a shape-only op call's cost: the op, each argument's key, each output's shape and
    dtype. None where an argument has none (see the module's documentation)."""
    parts: list = [id(func)]       # (the Session holds the op: its id stays its own)
    try:
        for a in args:
            k = _key(a)
            if k is _NONE:
                return None
            parts.append(k)
        if kwargs:
            for name, v in kwargs.items():
                k = _key(v)
                if k is _NONE:
                    return None
                parts.append((name, k))
        for o in outs:
            k = _key(o)
            if k is _NONE:
                return None
            parts.append(k)
        key = tuple(parts)
        hash(key)               # a symbolic size cannot be a key
    except (TypeError, RuntimeError):
        return None
    return key
