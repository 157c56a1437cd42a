"""``activations()``: the outputs of chosen layers for one no-grad forward, keyed by the tracker's
numbering of calls (``path``, then ``path[1]``, ``path[2]`` for a module's later calls)."""

from __future__ import annotations

import fnmatch
from typing import Any, Callable

import torch
from torch import nn

from ..errors import ForwardError, InputError
from .inputs import map_tensors
from .state import StateGuard, private_rng
from .tracker import ModuleTracker

__all__ = ["collect_activations", "selector"]


def selector(select) -> Callable[[str, nn.Module], bool]:
    """Module classes and/or fnmatch patterns on the module path; None: every module."""
    if select is None:
        return lambda path, m: True
    items = select if isinstance(select, (list, tuple, set)) else [select]
    types = tuple(s for s in items if isinstance(s, type))
    patterns = [s for s in items if isinstance(s, str)]
    if len(types) + len(patterns) != len(items):
        raise InputError("select takes module classes and/or path patterns like 'encoder.*.attn'")
    return lambda path, m: bool(types and isinstance(m, types)) or any(fnmatch.fnmatchcase(path, p) for p in patterns)


def collect_activations(model: nn.Module, args: tuple, kwargs: dict, select, mode: str) -> dict[str, Any]:
    pick = selector(select)
    out: dict[str, Any] = {}

    def kept(call, output) -> None:
        if pick(call.path, call.module):
            key = call.path if call.call_index == 0 else f"{call.path}[{call.call_index}]"
            out[key] = map_tensors(output, lambda t: t.detach())

    keep = ModuleTracker()
    keep.register_user_hooks(post_fw=kept)
    guard = StateGuard(model)
    rng = None
    try:
        if mode != "same":
            model.train(mode == "train")
        keep.install(list(model.named_modules()))
        with torch.no_grad(), private_rng() as rng:
            try:
                model(*args, **kwargs)
            except Exception as e:
                raise ForwardError(f"forward failed: {type(e).__name__}: {e}") from e
    finally:
        keep.remove()
        guard.restore(rng=rng is None or rng.touched_global)
    return out
