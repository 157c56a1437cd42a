"""Module hooks for the parts above capture/ that need one of their own, so that every module hook
of the package is registered in capture/: hooks that change what a module receives or returns
(pipeline stages inject received activations and stop at a stage's end), and the phase marks of
the pipeline's measured working memory (``phase_hooks``). Observing calls and attributing backward
is otherwise the ModuleTracker's job."""

from __future__ import annotations

from typing import Any, Callable

from torch import nn

__all__ = ["forward_pre_hook", "forward_hook", "phase_hooks", "remove_all"]


def forward_pre_hook(module: nn.Module, fn: Callable, *, with_kwargs: bool = False, prepend: bool = False):
    """``module.register_forward_pre_hook(fn, ...)``: its handle."""
    return module.register_forward_pre_hook(fn, with_kwargs=with_kwargs, prepend=prepend)


def forward_hook(module: nn.Module, fn: Callable):
    """``module.register_forward_hook(fn)``: its handle."""
    return module.register_forward_hook(fn)


def phase_hooks(modules: list[tuple[Any, nn.Module]], fire: Callable[[Any, str, str], None]) -> list:
    """Hooks calling ``fire(key, phase, when)`` (phase "f" or "b", when "begin" or "end") where each
    module's forward and its full backward begin and end: their handles. The measured working
    memory of pipeline units (pipeline/unit_timing.py) is defined by where these fire -- a full
    backward hook's extra autograd nodes included -- so its marks keep them rather than the
    tracker's node hooks (capture/backward.py), which would move the numbers."""
    handles = []
    for key, mod in modules:
        handles += [
            mod.register_forward_pre_hook(lambda m, a, k=key: fire(k, "f", "begin")),
            mod.register_forward_hook(lambda m, a, o, k=key: fire(k, "f", "end")),
            mod.register_full_backward_pre_hook(lambda m, go, k=key: fire(k, "b", "begin")),
            mod.register_full_backward_hook(lambda m, gi, go, k=key: fire(k, "b", "end"))]
    return handles


def remove_all(handles: list) -> None:
    """Remove the hooks and empty the list."""
    for h in handles:
        h.remove()
    handles.clear()
