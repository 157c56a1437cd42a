"""torchscan 0.2's ``module_rf(module, inp, out)``: layerscope's receptive field of the module's output."""

from __future__ import annotations

from ._count import counted

__all__ = ["module_rf"]


def module_rf(module, inp, out) -> tuple[float, float, float]:
    """(receptive field, effective stride, effective padding) of the output with respect to ``inp``, in
    its first spatial dimension; (1, 1, 0) where no op has a window (torchscan's value for such modules)."""
    rep = counted(module, inp, "module_rf")
    rf = None if rep is None or not rep.layers else rep.layers[0].receptive_field
    if rf is None or not rf.size:
        return 1.0, 1.0, 0.0
    return float(rf.size[0]), float(rf.stride[0]), float(rf.padding[0])
