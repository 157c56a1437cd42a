"""torchscan's (0.1 and 0.2) ``module_flops``: layerscope's FLOPs of the module's forward on the given inputs."""

from __future__ import annotations

from typing import Any

import torch.nn.functional as F
from torch import nn

from ._count import run

__all__ = ["module_flops"]   # what `from .flops import *` gives torchscan.modules (torchscan's name)


def unverified_options(module: nn.Module, layers: bool = False) -> str | None:
    """torch-scan 0.2's refusal of options its formulas were not checked for (its NotImplementedError
    text), or None: a MultiheadAttention with ``add_bias_kv`` or ``add_zero_attn``; an nn.Transformer
    with other than torch's encoder and decoder stacks or a layer whose activation is not ReLU. With
    ``layers`` (its ``flops_transformer_encoderlayer``/``decoderlayer``) a Transformer layer's own
    attention and activation too. layerscope could count them (the ops that ran); 0.2's API raises,
    and code written against it may rely on that (torch-scan's tests/test_modules.py does)."""
    if isinstance(module, nn.MultiheadAttention):
        if module.bias_k is not None or module.bias_v is not None or module.add_zero_attn:
            return "MultiheadAttention FLOPs do not support add_bias_kv or add_zero_attn."
        return None
    if isinstance(module, nn.Transformer):
        if not isinstance(module.encoder, nn.TransformerEncoder) or not isinstance(module.decoder, nn.TransformerDecoder):
            return "Transformer FLOPs only support the native encoder and decoder stacks."
        stack = [*module.encoder.layers, *module.decoder.layers]
    elif layers and isinstance(module, (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer)):
        stack = [module]
    else:
        return None
    for layer in stack:
        for attn in (getattr(layer, "self_attn", None), getattr(layer, "multihead_attn", None)):
            why = unverified_options(attn) if attn is not None else None
            if why:
                return why
        if layer.activation is not F.relu:
            return "Transformer FLOPs only support the default ReLU activation."
    return None


def counted_flops(module: nn.Module, inputs: Any, out: Any = None) -> int:
    """FLOPs of ``module(*inputs)`` as layerscope counts them, whatever the module's options (torch-scan
    0.1's ``module_flops``, which refuses none)."""
    rep = run("module_flops", module, inputs)
    return 0 if rep is None else int(rep.totals.forward.flops)


def module_flops(module: nn.Module, inputs: Any, out: Any = None) -> int:
    """FLOPs of ``module(*inputs)`` as layerscope counts them (2 x MACs plus every other op's
    arithmetic, from the aten ops that ran). ``inputs``: the positional inputs (a tuple, as a forward
    hook receives them, or one tensor); ``out`` is accepted for torchscan's signature and not used
    (the module runs). A module without a forward of its own: 0 and a UserWarning, as torchscan.
    NotImplementedError, as torch-scan 0.2, for the options it refuses (``unverified_options``)."""
    why = unverified_options(module)
    if why:
        raise NotImplementedError(why)
    rep = run("module_flops", module, inputs)
    return 0 if rep is None else int(rep.totals.forward.flops)


def flops_transformer_encoderlayer(module: nn.Module, inputs: Any) -> int:
    """torchscan 0.2's formula for a ``TransformerEncoderLayer`` call: here, layerscope's FLOPs of it."""
    return _layer_flops(module, inputs)


def flops_transformer_decoderlayer(module: nn.Module, inputs: Any) -> int:
    """torchscan 0.2's formula for a ``TransformerDecoderLayer`` call (target, memory, ...): layerscope's
    FLOPs of it."""
    return _layer_flops(module, inputs)


def _layer_flops(module: nn.Module, inputs: Any) -> int:
    why = unverified_options(module, layers=True)
    if why:
        raise NotImplementedError(why)
    rep = run("module_flops", module, inputs)
    return 0 if rep is None else int(rep.totals.forward.flops)
