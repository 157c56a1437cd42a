"""torchscan's ``module_dmas``: layerscope's memory traffic of the module's forward, in elements."""

from __future__ import annotations

from typing import Any

from torch import nn

from ._count import element_size, run

__all__ = ["module_dmas"]


def module_dmas(module: nn.Module, inp: Any, out: Any = None) -> int:
    """Direct memory accesses of ``module(inp)``: layerscope's bytes read + written by the ops that
    ran (every tensor an op reads, weights included, and every one it writes; views move nothing)
    divided by the element size (the module's floating-point parameters', else the input's, else 4),
    as ``crawl_module``'s ``dmas``. ``out`` is not used. A module without a forward of its own: 0 and
    a UserWarning, as torchscan."""
    rep = run("module_dmas", module, inp)
    if rep is None:
        return 0
    return int(rep.totals.forward.bytes_moved // element_size(module, inp))
