"""The model and example inputs an entry point was given: checked, built from ``input_size``,
re-batched, cut into micro-batches, moved to meta. No model runs here."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import InputError
from .inputs import iter_tensors, make_inputs, map_tensors
from .state import model_device

__all__ = ["check_model", "as_device", "prepare_inputs", "example_inputs", "rebatch", "micro_batch",
           "is_fake_model", "float_dtype"]


def check_model(model: Any) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise InputError(f"expected a torch.nn.Module, got {type(model).__name__}")
    return model


def as_device(device) -> torch.device:
    try:
        return torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise InputError(f"unknown device {device!r} (cpu, cuda, cuda:1, meta)") from None


def prepare_inputs(model: nn.Module, args: tuple, kwargs: dict, input_size, dtypes, batch_dim, device):
    """Resolve example inputs and where to run. Returns (args, kwargs, on_meta)."""
    here = model_device(model)
    target = as_device(device) if device is not None else here
    on_meta = target.type == "meta" and here.type != "meta"
    if not on_meta and target.type != here.type and any(True for _ in model.parameters()):
        raise InputError(f"the model is on {here} but device={str(target)!r} was asked; layerscope never "
                         "moves a model: move it first, or pass device='meta' to analyse it without "
                         "running it")
    if input_size is None and batch_dim is not None:
        raise InputError("dtypes and batch_dim only apply together with input_size")
    args = example_inputs(args, kwargs, input_size, dtypes, batch_dim, target, "analyze")
    if on_meta:
        # a meta copy keeps requires_grad: a backward then computes the input's gradient as on cpu
        to_meta = lambda t: torch.empty_like(t, device="meta").requires_grad_(  # noqa: E731
            t.requires_grad and (t.is_floating_point() or t.is_complex()))
        args, kwargs = map_tensors(tuple(args), to_meta), map_tensors(dict(kwargs), to_meta)
    return tuple(args), dict(kwargs), on_meta


def example_inputs(args: tuple, kwargs: dict, input_size, dtypes, batch_dim, device, entry: str) -> tuple:
    """The positional inputs: as given, or built from ``input_size`` on ``device``; refuses both, and
    neither."""
    if input_size is not None:
        if args:
            raise InputError("give either input_size or example inputs, not both")
        args = tuple(make_inputs(input_size, dtypes, batch_dim, device))
    elif dtypes is not None:
        raise InputError("dtypes and batch_dim only apply together with input_size" if entry == "analyze"
                         else "dtypes only applies together with input_size")
    if not args and not kwargs:
        raise InputError(f"no example inputs: pass them as arguments ({entry}(model, x)) or give input_size")
    return tuple(args)


def rebatch(args: tuple, kwargs: dict, batch_dim: int, size: int):
    """The same inputs with ``size`` along ``batch_dim``: every tensor whose batch dimension matches
    the first tensor's is cut or repeated (real values repeat; meta/fake tensors have none)."""
    first = next((t for t in iter_tensors((args, kwargs)) if t.dim() > batch_dim), None)
    if first is None:
        raise InputError(f"batch_size needs an input tensor with a dimension {batch_dim}")
    old = first.shape[batch_dim]

    def fix(t: torch.Tensor) -> torch.Tensor:
        if t.dim() <= batch_dim or t.shape[batch_dim] != old or old == size:
            return t
        if t.device.type == "meta" or old == 0:
            shape = list(t.shape)
            shape[batch_dim] = size
            return torch.empty(shape, dtype=t.dtype, device=t.device)
        idx = torch.arange(size, device=t.device) % old
        return t.index_select(batch_dim, idx)

    return map_tensors(tuple(args), fix), map_tensors(dict(kwargs), fix)


def micro_batch(args: tuple, kwargs: dict, microbatches: int, batch_dim: int = 0):
    """The first of ``microbatches`` equal chunks of the inputs along ``batch_dim`` (as the pipeline
    schedules split them). Integer-free leaves and tensors without that dim pass through."""
    sizes = {t.shape[batch_dim] for t in iter_tensors((args, kwargs)) if t.dim() > batch_dim}
    if not sizes:
        raise InputError("the inputs have no tensor with a batch dimension to split into micro-batches")
    if len(sizes) > 1:
        raise InputError(f"the inputs disagree on the batch size along dim {batch_dim}: {sorted(sizes)}")
    batch = sizes.pop()
    if batch % microbatches:
        raise InputError(f"batch size {batch} does not split into {microbatches} equal micro-batches")
    return rebatch(args, kwargs, batch_dim, batch // microbatches) + (batch // microbatches,)


def is_fake_model(model: nn.Module) -> bool:
    return any(getattr(p, "fake_mode", None) is not None for p in model.parameters())


def float_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's first floating-point parameter (float32 when it has none)."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
