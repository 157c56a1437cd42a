"""Module hooks for the parts above capture/ that need one of their own, so that every module hook
of the package is registered in capture/: hooks that change what a module receives or returns
(pipeline stages inject received activations and stop at a stage's end), or that a simulation
hangs what no tensor shows on (a checkpointed block's copy of the generator state). Observing calls and
attributing backward is the ModuleTracker's job (capture/tracker.py)."""

from __future__ import annotations

from typing import Callable

from torch import nn

__all__ = ["forward_pre_hook", "forward_hook", "remove_all"]


def forward_pre_hook(module: nn.Module, fn: Callable, *, with_kwargs: bool = False, prepend: bool = False):
    """``module.register_forward_pre_hook(fn, ...)``: its handle."""
    return module.register_forward_pre_hook(fn, with_kwargs=with_kwargs, prepend=prepend)


def forward_hook(module: nn.Module, fn: Callable, *, with_kwargs: bool = False, always_call: bool = False):
    """``module.register_forward_hook(fn, ...)``: its handle (``always_call``: also when the forward raises)."""
    return module.register_forward_hook(fn, with_kwargs=with_kwargs, always_call=always_call)


def remove_all(handles: list) -> None:
    """Remove the hooks and empty the list."""
    for h in handles:
        h.remove()
    handles.clear()
