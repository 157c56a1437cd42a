"""torchscan's ``crawl_module`` and ``summary`` (torch-scan 0.1.x) with layerscope's numbers.

    from layerscope.compat.torchscan import summary, crawl_module
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

from ..errors import InputError
from ..render.units import torchscan_scale

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
    from ..api import analyze
    from ..capture.prepare import check_model
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


def _format_name(name: str, depth: int) -> str:
    if depth == 0:
        return name
    if depth == 1:
        return f"├─{name}"
    return f"{'|    ' * (depth - 1)}└─{name}"


def _wrap(s: str, max_len: int, mode: str | None, wrap: str = "[...]") -> str:
    if len(s) <= max_len or mode is None:
        return s
    if mode == "end":
        return s[: max_len - len(wrap)] + wrap
    if mode == "mid":
        end = f"{wrap}.{s.rpartition('.')[-1]}"
        return s[: max_len - len(end)] + end
    raise InputError(f"wrap_mode must be 'mid', 'end' or None, got {mode!r}")


def _fmt(s: str, w: int | None) -> str:
    return s if w is None else f"{s:<{w}}"[:w]


def _line(layer: dict, col_w: list | None, wrap_mode, receptive_field: bool, effective_rf_stats: bool) -> list[str]:
    col_w = col_w or [None] * 7
    max_len = col_w[0] + 3 if isinstance(col_w[0], int) else 100
    out = [_fmt(_wrap(_format_name(layer["name"], layer["depth"]), max_len, wrap_mode), col_w[0]),
           _fmt(layer["type"], col_w[1]), _fmt(str(layer["output_shape"]), col_w[2]),
           _fmt(f"{layer['grad_params'] + layer['nograd_params'] + layer['num_buffers']:,}", col_w[3])]
    if receptive_field:
        out.append(_fmt(f"{layer['rf']:.0f}", col_w[4]))
        if effective_rf_stats:
            out += [_fmt(f"{layer['s']:.0f}", col_w[5]), _fmt(f"{layer['p']:.0f}", col_w[6])]
    return out


def format_info(module_info: dict[str, Any], wrap_mode: str = "mid", receptive_field: bool = False,
                effective_rf_stats: bool = False) -> str:
    """torchscan's printed summary of a ``crawl_module`` dict."""
    margin = 4
    headers = ["Layer", "Type", "Output Shape", "Param #", "Receptive field", "Effective stride", "Effective padding"]
    max_w = [27, 20, 25, 15, 15, 16, 17]
    col_w = [len(h) for h in headers]
    for layer in module_info["layers"]:
        col_w = [max(v, len(s)) for v, s in zip(col_w, _line(layer, None, wrap_mode, True, True))]
    col_w = [min(v, m) for v, m in zip(col_w, max_w)]
    n = 4 if not receptive_field else 5 if not effective_rf_stats else 7
    col_w, headers = col_w[:n], headers[:n]
    width = sum(col_w) + (len(col_w) - 1) * margin
    thin, thick, dots, sep = "_" * width, "=" * width, "-" * width, " " * margin
    lines = [thin, sep.join(f"{h:<{w}}" for h, w in zip(headers, col_w)), thick]
    lines += [sep.join(_line(layer, col_w, wrap_mode, receptive_field, effective_rf_stats))
              for layer in module_info["layers"]]
    o = module_info["overall"]
    lines += [thick, f"Trainable params: {o['grad_params']:,}", f"Non-trainable params: {o['nograd_params']:,}",
              f"Total params: {o['grad_params'] + o['nograd_params']:,}", dots]
    size = (o["param_size"] + o["buffer_size"]) / 1024**2
    over = module_info["overheads"]["framework"]["fwd"] + module_info["overheads"]["cuda"]["fwd"]
    lines += [f"Model size (params + buffers): {size:.2f} Mb", f"Framework & CUDA overhead: {over:.2f} Mb",
              f"Total RAM usage: {size + over:.2f} Mb", dots]
    for key, label, unit in (("flops", "Floating Point Operations on forward", "FLOPs"),
                             ("macs", "Multiply-Accumulations on forward", "MACs"),
                             ("dmas", "Direct memory accesses on forward", "DMAs")):
        v, u = torchscan_scale(sum(layer[key] for layer in module_info["layers"]))
        lines.append(f"{label}: {v:.2f} {u}{unit}")
    lines.append(thin)
    return "\n".join(lines)


def summary(module: nn.Module, input_shape, wrap_mode: str = "mid", max_depth: int | None = None,
            receptive_field: bool = False, effective_rf_stats: bool = False) -> None:
    """torchscan.summary: prints the summary for a batch of 1 of ``input_shape``."""
    info = crawl_module(module, input_shape)
    if isinstance(max_depth, int):
        info = aggregate_info(info, max_depth)
    print(format_info(info, wrap_mode, receptive_field, effective_rf_stats))
