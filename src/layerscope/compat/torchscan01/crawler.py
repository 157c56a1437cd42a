"""torchscan 0.1's ``torchscan.crawler``: ``crawl_module``, ``summary`` and its ``apply`` helper, with
layerscope's numbers (see the package's docstring and docs/compat.md)."""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from ...errors import InputError
from .utils import aggregate_info, format_info

__all__ = ["crawl_module", "summary"]


def apply(module: nn.Module, fn: Callable[[nn.Module, str], None], name: str | None = None) -> None:
    """``fn(submodule, dotted name)`` for ``module`` and every module under it, parents before their
    children, in the order of ``named_children``; the root's name is ``name``, by default its class
    name in lower case (torchscan's ``Module.apply`` with names: ``"sequential.1.0"``)."""
    stack = [(module, module.__class__.__name__.lower() if name is None else name)]
    while stack:
        mod, path = stack.pop()
        fn(mod, path)
        stack.extend(reversed([(child, f"{path}.{n}") for n, child in mod.named_children()]))


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


def summary(module: nn.Module, input_shape, wrap_mode: str = "mid", max_depth: int | None = None,
            receptive_field: bool = False, effective_rf_stats: bool = False) -> None:
    """torchscan.summary: prints the summary for a batch of 1 of ``input_shape``."""
    info = crawl_module(module, input_shape)
    if isinstance(max_depth, int):
        info = aggregate_info(info, max_depth)
    print(format_info(info, wrap_mode, receptive_field, effective_rf_stats))
