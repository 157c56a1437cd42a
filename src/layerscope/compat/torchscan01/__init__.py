"""torchscan 0.1's ``crawl_module`` and ``summary`` (torch-scan 0.1.x, the version the seed was written
against) with layerscope's numbers; ``layerscope.compat.torchscan`` is 0.2's (what pip installs).

    from layerscope.compat.torchscan01 import summary, crawl_module
    summary(model, (3, 224, 224), receptive_field=True, max_depth=1)
    info = crawl_module(model, (3, 224, 224))      # {"overheads": ..., "layers": [...], "overall": ...}

Same arguments (``input_shape`` without the batch dimension: a batch of 1 is added), the same dict
keys per layer (name, depth, type, input_shape, output_shape, grad_params, nograd_params,
param_size, num_buffers, buffer_size, flops, macs, dmas, rf, s, p, is_shared, is_leaf) and the same
printed layout. Where the numbers differ (docs/compat.md): every module call is counted from the
aten ops it ran, containers included (torchscan gives containers 0 and misses functional ops), so
the layers add up to the totals; a module holding parameters next to its children keeps them
(torchscan drops them); ``dmas`` is layerscope's bytes read + written divided by the model's
floating-point element size (torchscan's own formula per module type); ``rf``/``s``/``p`` are
layerscope's receptive field of each call's output w.r.t. the input (first spatial dim; torchscan
chains every layer in call order, branches included), carried over from the last layer that had
one; the CUDA and framework overheads are 0 (layerscope does not read process memory here: use
``layerscope.memory``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...errors import InputError
from ...render.torchscan import Row, Totals, summary_text

__all__ = ["crawl_module", "summary", "aggregate_info", "format_info"]


def _shapes(input_shape) -> list[tuple[int, ...]]:
    shapes = input_shape if isinstance(input_shape, list) else [input_shape]
    if not shapes or any(not isinstance(s, tuple) or not all(isinstance(d, int) and d > 0 for d in s)
                         for s in shapes):
        raise InputError(f"input_shape must be a tuple of positive ints (without the batch dimension) "
                         f"or a list of them, got {input_shape!r}")
    return shapes


def crawl_module(module: nn.Module, input_shape, dtype=None) -> dict[str, Any]:
    """torchscan's per-layer information for one forward on a batch of 1 of ``input_shape``."""
    from ...api import analyze
    from ...capture.prepare import check_model
    check_model(module)
    shapes = _shapes(input_shape)
    first = next(module.parameters(), None)
    if dtype is None:
        dtype = first.dtype if first is not None else torch.float32
    dtypes = [dtype] * len(shapes) if isinstance(dtype, torch.dtype) else list(dtype)
    if len(dtypes) != len(shapes):
        raise InputError(f"dtype gives {len(dtypes)} dtypes for {len(shapes)} input shapes")
    rep = analyze(module, input_size=[(1, *s) for s in shapes], dtypes=dtypes, mode="same")
    itemsize = (first.element_size() if first is not None and first.is_floating_point() else 4)
    root_name = module.__class__.__name__.lower()
    layers = []
    rf, s, p = 1.0, 1.0, 0.0
    for r in rep.layers:
        trainable = r.trainable_params
        counted_bytes = sum(q.nbytes for q in r.params)
        numel = sum(q.numel for q in r.params)
        param_size = counted_bytes if numel == r.num_params else (
            r.num_params * counted_bytes // numel if numel else 0)
        if r.receptive_field is not None and r.receptive_field.size:
            rf, s, p = (float(r.receptive_field.size[0]), float(r.receptive_field.stride[0]),
                        float(r.receptive_field.padding[0]))
        name = f"{root_name}.{r.path}" if r.path else root_name
        layers.append(dict(
            name=name.rpartition(".")[-1], depth=len(name.split(".")) - 1, type=r.type,
            input_shape=(-1, *r.inputs[0].shape[1:]) if r.inputs else None,
            output_shape=(-1, *r.outputs[0].shape[1:]) if r.outputs else None,
            grad_params=trainable, nograd_params=r.num_params - trainable, param_size=param_size,
            num_buffers=sum(b.numel for b in r.buffers) if r.call_index == 0 else 0,
            buffer_size=sum(b.nbytes for b in r.buffers) if r.call_index == 0 else 0,
            flops=r.forward.flops, macs=r.forward.macs, dmas=r.forward.bytes_moved // itemsize,
            rf=rf, s=s, p=p, is_shared=any(q.shared for q in r.params) or r.call_index > 0,
            is_leaf=r.is_leaf))
    t = rep.totals
    return dict(
        overheads=dict(cuda=dict(pre=0.0, fwd=0.0), framework=dict(pre=0.0, fwd=0.0)),
        layers=layers,
        overall=dict(grad_params=t.trainable_params, nograd_params=t.frozen_params, param_size=t.param_bytes,
                     num_buffers=t.buffers, buffer_size=t.buffer_bytes))


def aggregate_info(info: dict[str, Any], max_depth: int) -> dict[str, Any]:
    """Rows deeper than ``max_depth`` folded into their ancestor at ``max_depth`` (torchscan's)."""
    if not any(layer["depth"] == max_depth for layer in info["layers"]):
        raise InputError("The `max_depth` argument cannot be higher than module depth.")
    keys = ("flops", "macs", "dmas", "grad_params", "nograd_params", "param_size", "num_buffers", "buffer_size")
    rows = info["layers"]
    for i, layer in enumerate(rows):
        if layer["depth"] == max_depth and not layer["is_leaf"]:
            for child in rows[i + 1:]:
                if child["depth"] <= max_depth:
                    break
                for k in keys:       # the container's own ops and params stay (layerscope counts them)
                    layer[k] += child[k]
                layer["rf"], layer["s"], layer["p"] = child["rf"], child["s"], child["p"]
    info["layers"] = [layer for layer in rows if layer["depth"] <= max_depth]
    return info


def format_info(module_info: dict[str, Any], wrap_mode: str = "mid", receptive_field: bool = False,
                effective_rf_stats: bool = False) -> str:
    """torchscan's printed summary of a ``crawl_module`` dict (drawn by ``render.torchscan``)."""
    layers = module_info["layers"]
    rows = [Row(name=layer["name"], depth=layer["depth"], type=layer["type"], output_shape=layer["output_shape"],
                count=layer["grad_params"] + layer["nograd_params"] + layer["num_buffers"],
                rf=layer["rf"], stride=layer["s"], padding=layer["p"]) for layer in layers]
    o, over = module_info["overall"], module_info["overheads"]
    totals = Totals(trainable=o["grad_params"], frozen=o["nograd_params"],
                    model_mb=(o["param_size"] + o["buffer_size"]) / 1024**2,
                    overhead_mb=over["framework"]["fwd"] + over["cuda"]["fwd"],
                    flops=sum(layer["flops"] for layer in layers), macs=sum(layer["macs"] for layer in layers),
                    dmas=sum(layer["dmas"] for layer in layers))
    return summary_text(rows, totals, wrap_mode, receptive_field, effective_rf_stats)


def summary(module: nn.Module, input_shape, wrap_mode: str = "mid", max_depth: int | None = None,
            receptive_field: bool = False, effective_rf_stats: bool = False) -> None:
    """torchscan.summary: prints the summary for a batch of 1 of ``input_shape``."""
    info = crawl_module(module, input_shape)
    if isinstance(max_depth, int):
        info = aggregate_info(info, max_depth)
    print(format_info(info, wrap_mode, receptive_field, effective_rf_stats))
