"""The model and example inputs an entry point was given: checked, built from ``input_size``,
re-batched, cut into micro-batches, moved to meta. No model runs here."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from ..errors import InputError
from .guard import any_held
from .inputs import iter_tensors, make_inputs, map_tensors
from .known import LIMIT
from .shadow import live_module
from .state import model_device, non_leaf

__all__ = ["check_model", "as_device", "prepare_inputs", "example_inputs", "rebatch", "micro_batch",
           "is_fake_model", "float_dtype", "materialize_lazy"]


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
    if device is None and here.type != "meta" and \
            any(t.device.type == "meta" for t in iter_tensors((args, kwargs))):
        target = torch.device("meta")   # meta inputs: count on meta, as device="meta" does
    on_meta = target.type == "meta" and here.type != "meta"
    if not on_meta and target.type != here.type and any(True for _ in model.parameters()):
        raise InputError(f"the model is on {here} but device={str(target)!r} was asked; layerscope never "
                         "moves a model: move it first, or pass device='meta' to analyse it without "
                         "running it")
    if input_size is None and batch_dim is not None:
        raise InputError("dtypes and batch_dim only apply together with input_size")
    args = example_inputs(args, kwargs, input_size, dtypes, batch_dim, target, "analyze")
    materialize_lazy(model, args, kwargs)
    if on_meta:
        args, kwargs = map_tensors(tuple(args), _to_meta), map_tensors(dict(kwargs), _to_meta)
    elif target.type == "meta":
        # a model on meta already: its floating-point inputs go to meta too. A real one beside meta
        # weights makes ops whose output takes the real input's device, and a backward hands a real
        # gradient to a meta tensor ("MmBackward0 returned an invalid gradient ... expected device
        # meta but got cpu", issue 34). Integer and boolean inputs (token ids, masks: no gradient,
        # and code may read their values) stay as given, as before.
        move = lambda t: _to_meta(t) if t.is_floating_point() or t.is_complex() else t  # noqa: E731
        args, kwargs = map_tensors(tuple(args), move), map_tensors(dict(kwargs), move)
    return tuple(args), dict(kwargs), on_meta


def _to_meta(t: torch.Tensor) -> torch.Tensor:
    """A meta copy of an input: it keeps requires_grad (a backward then computes the input's gradient
    as on cpu), and a non-leaf stays a non-leaf (in-place ops on it work as on the caller's)."""
    if t.device.type == "meta":
        return t
    grad = t.requires_grad and (t.is_floating_point() or t.is_complex())
    meta = torch.empty_like(t, device="meta").requires_grad_(grad)
    return non_leaf(meta) if grad and not t.is_leaf else meta


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


def rebatch(args: tuple, kwargs: dict, batch_dim: int, size: int, simulated: bool = False):
    """The same inputs with ``size`` along ``batch_dim``: every tensor whose batch dimension matches
    the first tensor's is cut or repeated (real values repeat; meta/fake tensors have none).
    ``simulated``: the inputs are only for a simulation, which carries the values of small integer
    and boolean tensors alone (capture/known.py): a real tensor whose values it would not carry
    (floating, or over ``known.LIMIT`` elements) is made on meta instead of repeated for real
    (issue 58: a batch-size search allocated its inputs at every batch it simulated)."""
    first = next((t for t in iter_tensors((args, kwargs)) if t.dim() > batch_dim), None)
    if first is None:
        raise InputError(f"batch_size needs an input tensor with a dimension {batch_dim}")
    old = first.shape[batch_dim]

    def fix(t: torch.Tensor) -> torch.Tensor:
        if t.dim() <= batch_dim or t.shape[batch_dim] != old or old == size:
            return t
        shape = list(t.shape)
        shape[batch_dim] = size
        if simulated and t.device.type != "meta" and getattr(t, "fake_mode", None) is None and \
                (t.is_floating_point() or t.is_complex() or math.prod(shape) > LIMIT):
            return torch.empty(shape, dtype=t.dtype, device="meta")
        if t.device.type == "meta" or old == 0:
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


def _lazy(model: nn.Module) -> bool:
    """Whether a parameter or buffer is still to be created (``UninitializedParameter``). Never on an
    analysis's copy of a model (capture/shadow.py copies no tree that holds one: the user's model is
    analysed instead), so a copy is not walked again."""
    if live_module(model) is not model:
        return False
    return any_held(model, is_lazy)


def materialize_lazy(model: nn.Module, args: tuple, kwargs: dict) -> None:
    """A model with parameters or buffers still to be created (``nn.LazyLinear``'s
    ``UninitializedParameter``) gets them from one first forward on the example inputs, as the model's
    own first call -- and torchinfo's summary -- does; then they are counted like any other (issue 34).
    That first call is the one change an analysis leaves in a model: it comes out materialised (its
    weights drawn from the global RNG, as that call draws them). The call runs in eval mode under
    no_grad (no BatchNorm statistics updated) on the model's device: meta inputs are given as zeros
    there. Does nothing, and runs nothing, for a model without lazy tensors."""
    if not _lazy(model):
        return
    device = model_device(model)

    def here(t: torch.Tensor) -> torch.Tensor:
        return torch.zeros(tuple(t.shape), dtype=t.dtype, device=device) if t.device != device \
            and t.device.type == "meta" else t

    modes = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        with torch.no_grad():
            model(*map_tensors(tuple(args), here), **map_tensors(dict(kwargs), here))
    except Exception as e:
        raise InputError(f"the model's lazy parameters could not be created by a first forward on the "
                         f"example inputs: {type(e).__name__}: {e}") from e
    finally:
        for m, training in modes:
            m.training = training
    if _lazy(model):
        raise InputError("the model still has uninitialized (lazy) parameters or buffers after a first "
                         "forward on the example inputs: a module the forward never called?")
