"""Thin public entry points: analyze(), summary(), activations()."""

from __future__ import annotations

import contextlib
import fnmatch
import gc
from typing import Any, Iterable

import torch
from torch import nn

from .capture import StateGuard, capture, make_inputs, map_tensors, model_device
from .costs import CostOptions
from .errors import ForwardError, InputError
from .report import Report

__all__ = ["analyze", "summary", "activations"]


def _check_model(model: Any) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise InputError(f"expected a torch.nn.Module, got {type(model).__name__}")
    return model


def _prepare(model: nn.Module, args: tuple, kwargs: dict, input_size, dtypes, batch_dim, device):
    """Resolve example inputs and where to run. Returns (args, kwargs, on_meta)."""
    here = model_device(model)
    target = torch.device(device) if device is not None else here
    on_meta = target.type == "meta" and here.type != "meta"
    if not on_meta and target.type != here.type and any(True for _ in model.parameters()):
        raise InputError(f"the model is on {here} but device={str(target)!r} was asked; layerscope never "
                         "moves a model: move it first, or pass device='meta' to analyse it without "
                         "running it")
    if input_size is not None:
        if args:
            raise InputError("give either input_size or example inputs, not both")
        args = tuple(make_inputs(input_size, dtypes, batch_dim, target))
    elif dtypes is not None or batch_dim is not None:
        raise InputError("dtypes and batch_dim only apply together with input_size")
    if on_meta:
        to_meta = lambda t: torch.empty_like(t, device="meta")  # noqa: E731
        args, kwargs = map_tensors(tuple(args), to_meta), map_tensors(dict(kwargs), to_meta)
    if not args and not kwargs:
        raise InputError("no example inputs: pass them as arguments (analyze(model, x)) or give input_size")
    return tuple(args), dict(kwargs), on_meta


def analyze(model: nn.Module, *args: Any, input_size=None, dtypes=None, batch_dim: int | None = None,
            device=None, mode: str = "eval", backward: bool = False, causal: str = "dense",
            **kwargs: Any) -> Report:
    """Analyse one forward (and, with ``backward=True``, one backward) of ``model``.

    Args and kwargs pass to ``model.forward`` as they are (dicts, lists, token ids, ...); or give
    ``input_size`` (with ``dtypes`` and ``batch_dim``) to build example inputs. ``device='meta'`` runs
    a real model on meta copies of its weights, so nothing is computed. ``mode`` is "eval", "train"
    or "same" (leave the model's flags as they are); the model's own state is restored afterwards.
    ``causal="unmasked"`` counts only the unmasked part of causal attention.
    """
    _check_model(model)
    if causal not in ("dense", "unmasked"):
        raise InputError(f"causal must be 'dense' or 'unmasked', got {causal!r}")
    args, kwargs, on_meta = _prepare(model, args, kwargs, input_size, dtypes, batch_dim, device)
    with _gc_paused():
        trace, _ = capture(model, args, kwargs, mode=mode, backward=backward, on_meta=on_meta,
                           options=CostOptions(causal=causal))
        return Report(trace, model)


@contextlib.contextmanager
def _gc_paused():
    """Pause the cyclic garbage collector while records are built: its full passes over a large heap
    made per-module time grow with model size (4,000 blocks: 117 us per call with it, 71 without).
    Restored on exit; the run's garbage is freed by reference counting or the next collection."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def summary(model: nn.Module, input_size=None, input_data=None, batch_dim: int | None = None,
            col_names: Iterable[str] | None = None, depth: int = 3, device=None, dtypes=None,
            mode: str = "eval", verbose: int = 1, **kwargs: Any) -> Report:
    """Drop-in for torchinfo.summary's common arguments: prints the table (verbose >= 1) and returns
    the Report. ``input_data`` may be a tensor, a list/tuple of positional inputs, or a dict of kwargs."""
    args: tuple = ()
    if input_data is not None:
        if isinstance(input_data, torch.Tensor):
            args = (input_data,)
        elif isinstance(input_data, dict):
            kwargs = {**input_data, **kwargs}
        elif isinstance(input_data, (list, tuple)):
            args = tuple(input_data)
        else:
            raise InputError(f"input_data must be a tensor, a list/tuple or a dict, got {type(input_data).__name__}")
    rep = analyze(model, *args, input_size=input_size, dtypes=dtypes, batch_dim=batch_dim, device=device,
                  mode=mode, **kwargs)
    if verbose:
        rep.print(depth=depth, columns=col_names)
    return rep


def _selector(select) -> Any:
    if select is None:
        return lambda path, m: True
    items = select if isinstance(select, (list, tuple, set)) else [select]
    types = tuple(s for s in items if isinstance(s, type))
    patterns = [s for s in items if isinstance(s, str)]
    if len(types) + len(patterns) != len(items):
        raise InputError("select takes module classes and/or path patterns like 'encoder.*.attn'")
    return lambda path, m: (types and isinstance(m, types)) or any(fnmatch.fnmatchcase(path, p) for p in patterns)


def activations(model: nn.Module, *args: Any, select=None, mode: str = "eval", **kwargs: Any) -> dict[str, Any]:
    """Detached outputs of the selected layers for one no-grad forward.

    ``select``: module classes and/or fnmatch patterns on the module path. Keys are module paths; a
    module called more than once adds keys ``path[1]``, ``path[2]``, ... for its later calls.
    """
    _check_model(model)
    if mode not in ("eval", "train", "same"):
        raise InputError(f"mode must be 'eval', 'train' or 'same', got {mode!r}")
    pick = _selector(select)
    out: dict[str, Any] = {}
    calls: dict[str, int] = {}
    handles = []

    def hook_for(path):
        def hook(module, inputs, output):
            n = calls.get(path, 0)
            calls[path] = n + 1
            out[path if n == 0 else f"{path}[{n}]"] = map_tensors(output, lambda t: t.detach())
        return hook

    guard = StateGuard(model)
    try:
        if mode != "same":
            model.train(mode == "train")
        for path, m in model.named_modules():
            if pick(path, m):
                handles.append(m.register_forward_hook(hook_for(path)))
        with torch.no_grad():
            try:
                model(*args, **kwargs)
            except Exception as e:
                raise ForwardError(f"forward failed: {type(e).__name__}: {e}") from e
    finally:
        for h in handles:
            h.remove()
        guard.restore()
    return out

