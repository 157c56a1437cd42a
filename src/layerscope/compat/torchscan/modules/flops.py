"""torchscan 0.2's ``module_flops(module, inputs, out)``: layerscope's FLOPs of ``module(*inputs)``."""

from __future__ import annotations

from ._count import counted

__all__ = ["module_flops"]


def module_flops(module, inputs, out) -> int:
    """The FLOPs of the module's forward on ``inputs`` (a tuple of its arguments; ``out`` is not needed:
    the forward runs again, and the module comes out as it went in). 0 with a warning when it cannot."""
    rep = counted(module, inputs, "module_flops")
    return 0 if rep is None else rep.totals.forward.flops
