"""torchscan's (0.1 and 0.2) ``module_flops``: layerscope's FLOPs of the module's forward on the given inputs."""

from __future__ import annotations

from typing import Any

from torch import nn

from ._count import run

__all__ = ["module_flops"]


def module_flops(module: nn.Module, inputs: Any, out: Any = None) -> int:
    """FLOPs of ``module(*inputs)`` as layerscope counts them (2 x MACs plus every other op's
    arithmetic, from the aten ops that ran). ``inputs``: the positional inputs (a tuple, as a forward
    hook receives them, or one tensor); ``out`` is accepted for torchscan's signature and not used
    (the module runs). A module without a forward of its own: 0 and a UserWarning, as torchscan."""
    rep = run("module_flops", module, inputs)
    return 0 if rep is None else int(rep.totals.forward.flops)


def flops_transformer_encoderlayer(module: nn.Module, inputs: Any) -> int:
    """torchscan 0.2's formula for a ``TransformerEncoderLayer`` call: here, layerscope's FLOPs of it."""
    return module_flops(module, inputs)


def flops_transformer_decoderlayer(module: nn.Module, inputs: Any) -> int:
    """torchscan 0.2's formula for a ``TransformerDecoderLayer`` call (target, memory, ...): layerscope's
    FLOPs of it."""
    return module_flops(module, inputs)
