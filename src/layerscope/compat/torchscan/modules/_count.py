"""One forward of a module on the inputs torchscan's per-module functions receive, counted by
layerscope (``analyze(..., mode="same")``: the module's flags as they are; weights, buffers such as
BatchNorm's running statistics, hooks and the RNG restored afterwards). The inputs run as copies,
so an in-place module does not overwrite the caller's tensors."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

from ....errors import InputError


def _args(inputs: Any) -> tuple:
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)) or not inputs:
        raise InputError("the module's input must be a tensor or a non-empty tuple of its positional inputs "
                         f"(what its forward hook receives), got {type(inputs).__name__}")
    return tuple(inputs)


def run(fn: str, module: Any, inputs: Any):
    """The Report of ``module``'s forward on ``inputs``, or None (with torchscan's UserWarning) for a
    module that has no forward of its own: no op runs, nothing can be counted, torchscan's 0 stands."""
    from ....api import analyze
    from ....capture.inputs import map_tensors
    if not isinstance(module, nn.Module):
        raise InputError(f"{fn}: expected a torch.nn.Module, got {type(module).__name__}")
    if type(module).forward is nn.Module.forward:
        warnings.warn(f"Module type not supported: {type(module).__name__} (it has no forward to count)",
                      UserWarning, stacklevel=3)
        return None
    args = map_tensors(_args(inputs), lambda t: t.detach().clone())
    rep = analyze(module, *args, mode="same")
    missing = ", ".join(u.op for u in rep.coverage.uncounted)
    if missing:
        warnings.warn(f"{fn}: layerscope has no cost formula for {missing} (counted as 0)", UserWarning,
                      stacklevel=3)
    return rep


def element_size(module: nn.Module, inputs: Any) -> int:
    """The size of one element for DMAs: the module's floating-point parameters', else its first
    floating-point input's, else 4 bytes (float32)."""
    for t in (*module.parameters(), *(_args(inputs) if inputs is not None else ())):
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            return t.element_size()
    return 4
