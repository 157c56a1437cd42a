"""torchscan 0.2's ``module_dmas(module, inp, out)``: layerscope's traffic of ``module(inp)``."""

from __future__ import annotations

from ._count import counted

__all__ = ["module_dmas"]


def module_dmas(module, inp, out) -> int:
    """The elements read and written by the module's forward on ``inp``: layerscope's bytes moved divided
    by the input's element size (each tensor an op reads or writes, once per op)."""
    rep = counted(module, inp, "module_dmas")
    if rep is None:
        return 0
    first = inp[0] if isinstance(inp, (tuple, list)) else inp
    return rep.totals.forward.bytes_moved // first.element_size()
