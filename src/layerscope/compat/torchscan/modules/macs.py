"""torchscan's ``module_macs``: layerscope's MACs of the module's forward on the given input."""

from __future__ import annotations

from typing import Any

from torch import nn

from ._count import run

__all__ = ["module_macs"]


def module_macs(module: nn.Module, inp: Any, out: Any = None) -> int:
    """Multiply-accumulates of ``module(inp)`` as layerscope counts them: those of contractions only
    (convolutions, matmuls, attention), bias adds, normalisation and pooling not included. ``inp``:
    the input tensor (or a tuple of positional inputs); ``out`` is not used. A module without a
    forward of its own: 0 and a UserWarning, as torchscan."""
    rep = run("module_macs", module, inp)
    return 0 if rep is None else int(rep.totals.forward.macs)
