"""One module call counted by layerscope (the module comes out as it went in)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn


def counted(module: Any, inputs: tuple, what: str):
    """The Report of ``module(*inputs)`` in the mode the module is in, or None (with torchscan's
    "Module type not supported" warning) when it cannot run on them; a warning names the ops without a
    formula (the count is then a lower bound)."""
    from ....api import analyze
    from ....errors import LayerscopeError
    name = type(module).__name__
    args = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    if not isinstance(module, nn.Module) or not any(isinstance(a, torch.Tensor) for a in args):
        warnings.warn(f"Module type not supported: {name} (layerscope counts the ops a module runs: "
                      f"give it the tensors it takes)", stacklevel=3)
        return None
    try:
        rep = analyze(module, *args, mode="same")
    except LayerscopeError as e:
        warnings.warn(f"Module type not supported: {name} ({what} needs its forward to run: {e})", stacklevel=3)
        return None
    missing = sorted({u.op for u in getattr(rep.coverage, "uncounted", ()) or ()})
    if missing:
        warnings.warn(f"{name}: no formula for {', '.join(missing)}; {what} counts the other ops", stacklevel=3)
    return rep
