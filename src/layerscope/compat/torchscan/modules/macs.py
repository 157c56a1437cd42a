"""torchscan 0.2's ``module_macs(module, inp, out)``: layerscope's MACs of ``module(inp)``."""

from __future__ import annotations

from ._count import counted

__all__ = ["module_macs"]


def module_macs(module, inp, out) -> int:
    """The multiply-accumulates of the contractions the module's forward runs on ``inp``."""
    rep = counted(module, inp, "module_macs")
    return 0 if rep is None else rep.totals.forward.macs
