"""A light op counter: a dispatch mode that prices every aten op a piece of the caller's own code runs
(in this thread, while it is entered) by the cost registry, and hands each to a callback. Unlike an
analysis it runs nothing itself and restores nothing: the code runs as written, with its own
gradients, random draws and state changes (the front ends' training-loop profilers and
``measure_flops``: compat/deepspeed.py, compat/torchscan/flops.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .. import _compat
from ..costs import FREE, CostOptions, OpCall

__all__ = ["OpCounter", "op_name"]

COUNTED, FREE_OP, UNCOUNTED = "counted", "free", "uncounted"


def op_name(func) -> str:
    """``aten.addmm`` for ``torch.ops.aten.addmm.default``."""
    return f"{func.namespace}.{func._opname}"


def _shapes(x):
    if isinstance(x, torch.Tensor):
        return tuple(x.shape)
    if isinstance(x, (list, tuple)):
        return type(x)(_shapes(v) for v in x)
    return x


@_compat.dispatch_mode
class OpCounter:
    """``on_op(name, status, macs, flops)`` for each op (status "counted", "free" — a formula that says
    the op does no arithmetic — or "uncounted": no formula, or one that cannot read these arguments).
    ``custom``: formulas by op name ("aten.sin") in torch's FlopCounterMode form,
    ``f(*input_shapes, out_shape=..., **kwargs) -> flops``, in place of the registry's; their errors
    are the caller's, and the ops they run are not counted."""

    def __init__(self, on_op: Callable[[str, str, int, int], None],
                 custom: dict[str, Callable[..., Any]] | None = None, options: CostOptions | None = None) -> None:
        super().__init__()
        self.on_op = on_op
        self.custom = custom or {}
        self.options = options or CostOptions()
        self._fns: dict[Any, Any] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.is_inference_mode_enabled() and _compat.has_composite_kernel(func.name()):
            # under inference mode a composite op arrives whole: its parts are counted, as autograd
            # decomposes it in every other mode
            with self:
                return func._op_dk(_compat.composite_implicit_key(), *args, **kwargs)
        out = func(*args, **kwargs)
        name = op_name(func)
        formula = self.custom.get(name)
        if formula is not None:
            self.on_op(name, COUNTED, 0, int(formula(*_shapes(args), out_shape=_shapes(out),
                                                      **{k: _shapes(v) for k, v in kwargs.items()})))
            return out
        fn = self._fns.get(func, _MISSING)
        if fn is _MISSING:
            fn = self._fns[func] = self.options.lookup(func)
        if fn is None:
            self.on_op(name, UNCOUNTED, 0, 0)
        elif fn is FREE:
            self.on_op(name, FREE_OP, 0, 0)
        else:
            try:
                c = fn(OpCall(func, args, kwargs, out, self.options))
            except Exception:    # a formula that cannot read these arguments: uncounted, never a crash
                self.on_op(name, UNCOUNTED, 0, 0)
            else:
                self.on_op(name, COUNTED, int(c.macs), int(c.flops))
        return out


_MISSING = object()
