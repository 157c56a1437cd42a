"""torchscan's ``module_rf``: layerscope's receptive field of the module's output."""

from __future__ import annotations

from typing import Any

from torch import nn

from ._count import run

__all__ = ["module_rf"]


def module_rf(module: nn.Module, inp: Any, out: Any = None) -> tuple[float, float, float]:
    """(receptive field, effective stride, effective padding) of ``module(inp)``'s output with respect
    to its input along the first spatial dimension, from layerscope's receptive-field analysis of the
    ops that ran (``analyses/receptive_field.py``). A module without convolution or pooling leaves the
    field as it is: (1.0, 1.0, 0.0), as torchscan; so does a module without a forward (with its
    UserWarning). A transposed convolution of kernel k, stride s gives layerscope's field
    (1 + (k - 1) / s, 1 / s, 0), where torchscan returns (-k, 1 / s, 0)."""
    rep = run("module_rf", module, inp)
    rf = rep.layers[0].receptive_field if rep is not None and rep.layers else None
    if rf is None or not rf.size:
        return 1.0, 1.0, 0.0
    return float(rf.size[0]), float(rf.stride[0]), float(rf.padding[0])
