"""A light op counter: a dispatch mode that prices every aten op a piece of the caller's own code runs
(in this thread, while it is entered) by the cost registry, and hands each to a callback. Unlike an
analysis it runs nothing itself and restores nothing: the code runs as written, with its own
gradients, random draws and state changes (the front ends' training-loop profilers and
``measure_flops``: compat/deepspeed.py, compat/torchscan/flops.py). ``ForwardCounter`` puts it on a
model's own forwards, per module (DeepSpeed's FlopsProfiler and ``layerscope.Profiler``)."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .. import _compat
from ..costs import FREE, CostOptions, OpCall
from . import hooks
from .guard import analysing

__all__ = ["OpCounter", "ForwardCounter", "op_name"]

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


def _now(module: nn.Module) -> float:
    """A time stamp after the module's device has finished its work (DeepSpeed synchronises the
    accelerator in its hooks too)."""
    p = next(module.parameters(), None)
    if p is not None and p.device.type == "cuda":
        torch.cuda.synchronize(p.device)
    return time.perf_counter()


class ForwardCounter:
    """The model's own forwards, counted as they run: while ``attach``ed, hooks on every module keep
    a per-thread stack of the module calls running; the outermost call enters an ``OpCounter`` (in
    the calling thread) that adds each op's MACs and FLOPs to the innermost call running. Nothing is
    run again and nothing of the inputs is kept: the counts are those of the forwards as they ran
    (their mode, their values). A forward run by one of layerscope's own analyses is not counted
    (capture.guard.analysing), nor a call of the model inside its own forward twice.

    ``own``: module path -> [MACs, FLOPs] of the ops run in its calls themselves, added up over the
    forwards since ``reset``; ``seconds``: path -> its calls' time (a module running inside itself
    timed once); ``uncounted``: op -> calls without a formula (their FLOPs are left out)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._handles: list = []
        self._local = threading.local()        # per thread: the module calls running, the open counter
        self.reset()

    def reset(self) -> None:
        self.own: dict[str, list] = {}
        self.seconds: dict[str, float] = {}
        self.uncounted: dict[str, int] = {}

    @property
    def macs(self) -> int:
        return sum(v[0] for v in self.own.values())

    @property
    def flops(self) -> int:
        return sum(v[1] for v in self.own.values())

    def attach(self) -> None:
        if self._handles:
            return
        seen: set[int] = set()
        for path, m in self.model.named_modules():
            if id(m) in seen or isinstance(m, torch.jit.ScriptModule):   # TorchScript takes no hooks
                continue
            seen.add(id(m))
            self._handles.append(hooks.forward_pre_hook(m, functools.partial(self._pre, path)))
            self._handles.append(hooks.forward_hook(m, functools.partial(self._post, path), always_call=True))

    def detach(self) -> None:
        hooks.remove_all(self._handles)

    def _pre(self, path: str, module, args) -> None:
        local = self._local
        calls = getattr(local, "calls", None)
        if calls is None:
            calls = local.calls = []
        if not calls:
            if analysing():              # one of layerscope's own analyses runs the model: not the user's
                return
            local.counter = OpCounter(self._on_op)
            local.counter.__enter__()
        calls.append((path, _now(module)))

    def _post(self, path: str, module, args, out) -> None:
        calls = getattr(self._local, "calls", None)
        if not calls or calls[-1][0] != path:
            return
        _, start = calls.pop()
        if not any(p == path for p, _ in calls):       # a module running inside itself: timed once
            self.seconds[path] = self.seconds.get(path, 0.0) + _now(module) - start
        if not calls:
            counter, self._local.counter = self._local.counter, None
            counter.__exit__(None, None, None)

    def _on_op(self, name: str, status: str, macs: int, flops: int) -> None:
        calls = self._local.calls
        own = self.own.setdefault(calls[-1][0] if calls else "", [0, 0])
        own[0] += macs
        own[1] += flops
        if status == UNCOUNTED:
            self.uncounted[name] = self.uncounted.get(name, 0) + 1
