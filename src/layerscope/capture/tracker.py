"""The module tracker: which module call is running, numbered the same way for every user.

A call is (path, call index, depth, parent): the module's first path in ``named_modules()``, how many
times that module was called before in this run, how deep it sits in the calls that are open, and
the call it runs inside. The op recorder (capture/session.py), the latency timer
(analyses/latency.py), ``activations()``, the unit finder of the pipeline and the interpreters of
exported and TorchScript graphs all number calls with this class, so a call's index means the same
thing in every report.
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from .. import _compat

__all__ = ["TrackedCall", "ModuleTracker", "module_type", "tracked_modules"]


def module_type(m: nn.Module) -> str:
    """The module's class name; a scripted module's original class (``Linear``, not
    ``RecursiveScriptModule``)."""
    if isinstance(m, torch.jit.ScriptModule):
        return getattr(m, "original_name", None) or type(m).__name__
    return type(m).__name__


def tracked_modules(named: list[tuple[str, nn.Module]]) -> list[tuple[str, nn.Module]]:
    """The modules whose calls the tracker can see: all but those inside a ScriptModule (TorchScript
    calls them in C++, past any hook; their ops count for the scripted module that holds them)."""
    out, inside = [], []
    for path, m in named:
        if inside and any(path.startswith(p + ".") or p == "" for p in inside):
            continue
        out.append((path, m))
        if isinstance(m, torch.jit.ScriptModule):
            inside.append(path)
    return out


class TrackedCall:
    """One module call as the tracker numbers it."""

    __slots__ = ("module", "path", "type", "depth", "call_index", "parent", "children", "index")

    def __init__(self, module: nn.Module, path: str, depth: int, call_index: int, parent: int | None,
                 type_: str | None = None) -> None:
        self.index = -1                   # its position in the tracker's calls (set when it begins)
        self.module = module
        self.path = path
        self.type = module_type(module) if type_ is None else type_
        self.depth = depth
        self.call_index = call_index
        self.parent = parent
        self.children: list[int] = []


# hook keys of trackers that write nn.Module's hook dicts themselves: negative, so never one of the
# ids RemovableHandle hands out (0, 1, 2, ...); one per tracker, so two trackers on a module differ
_HOOK_KEYS = itertools.count(1)


class ModuleTracker:
    """Forward pre- and post-hooks on every tracked module (``install``), or driven by hand
    (``enter``/``exit``: the graph interpreters). ``calls`` in the order they began (pre-order),
    ``stack`` the open ones. With ``this_thread_only`` (the default), calls made on other threads
    are not the run's and are left out. A subclass adds what it records: ``new_call`` makes its
    call objects, ``entered``/``exited`` see each call begin and end."""

    call_class: type = TrackedCall

    def __init__(self, this_thread_only: bool = True) -> None:
        self.thread = threading.get_ident() if this_thread_only else None
        self.calls: list[Any] = []
        self.stack: list[int] = []
        self.ncalls: dict[int, int] = defaultdict(int)
        self.paths: dict[int, str] = {}
        self.types: dict[int, str] = {}     # module_type of each installed module, worked out once
        self.handles: list = []
        # the hook dicts that hold this tracker's hooks, five per module (install wrote them)
        self.hooked: list[tuple[dict, ...]] = []
        self.hook_key = -next(_HOOK_KEYS)

    # ---- hooks ---------------------------------------------------------------------------------
    def install(self, named: list[tuple[str, nn.Module]]) -> None:
        direct = _compat.get("module_hook_dicts")
        key, pre, post = self.hook_key, self._pre, self._post
        paths, types, hooked = self.paths, self.types, self.hooked
        if direct is not None:
            n_pre, n_pre_kw, n_hooks, n_hooks_kw, n_always = direct
        script = torch.jit.ScriptModule
        for path, m in tracked_modules(named):
            paths.setdefault(id(m), path)
            # module_type, without its call for a plain module
            types[id(m)] = module_type(m) if isinstance(m, script) else type(m).__name__
            if direct is not None:
                # what the two register_* calls below write, without their handles: a forward
                # pre-hook with kwargs, then a forward hook with kwargs that is always called
                d = m.__dict__
                try:
                    pre_hooks, pre_kw, hooks = d[n_pre], d[n_pre_kw], d[n_hooks]
                    hooks_kw, always = d[n_hooks_kw], d[n_always]
                except KeyError:   # a module that never ran nn.Module.__init__'s dicts: the public way
                    pass
                else:
                    pre_hooks[key] = pre
                    pre_kw[key] = True
                    hooks[key] = post
                    hooks_kw[key] = True
                    always[key] = True
                    hooked.append((pre_hooks, pre_kw, hooks, hooks_kw, always))
                    continue
            # ScriptModule refuses its own register_* methods (hooks do not run when TorchScript code
            # calls it), but a scripted child called from eager Python runs nn.Module's call path,
            # hooks included: register through nn.Module's methods. Its own submodules run inside
            # TorchScript and are never tracked (tracked_modules leaves them out).
            self.handles.append(nn.Module.register_forward_pre_hook(m, pre, with_kwargs=True))
            self.handles.append(nn.Module.register_forward_hook(m, post, with_kwargs=True, always_call=True))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        key = self.hook_key
        for dicts in self.hooked:
            for hooks in dicts:
                hooks.pop(key, None)
        self.hooked.clear()

    def _pre(self, module, args, kwargs):
        self.enter(module, args, kwargs)
        return None

    def _post(self, module, args, kwargs, output):
        self.exit(module, args, kwargs, output)
        return None

    # ---- the numbering -------------------------------------------------------------------------
    def skip(self) -> bool:
        """Whether a call starting now is not the run's (another thread's)."""
        return self.thread is not None and threading.get_ident() != self.thread

    def enter(self, module: nn.Module, args: tuple = (), kwargs: dict | None = None):
        """A call of ``module`` begins: its record (None when it is not tracked)."""
        if self.skip():
            return None
        calls, stack = self.calls, self.stack
        idx = len(calls)
        parent = stack[-1] if stack else None
        key = id(module)
        path = self.paths.get(key)
        n = self.ncalls[key]
        call = self.new_call(module, type(module).__name__ if path is None else path,
                             0 if parent is None else calls[parent].depth + 1, n, parent,
                             args, kwargs or {}, self.types.get(key))
        call.index = idx
        self.ncalls[key] = n + 1
        if parent is not None:
            calls[parent].children.append(idx)
        calls.append(call)
        stack.append(idx)
        self.entered(call)
        return call

    def exit(self, module: nn.Module, args: tuple = (), kwargs: dict | None = None, output: Any = None):
        """The open call of ``module`` ends (calls opened inside it that never closed, after an
        exception, close with it): its record, or None."""
        if self.thread is not None and threading.get_ident() != self.thread:
            return None
        stack = self.stack
        while stack and self.calls[stack[-1]].module is not module:
            stack.pop()
        if not stack:
            return None
        call = self.calls[stack.pop()]
        self.exited(call, output)
        return call

    def new_call(self, module, path, depth, call_index, parent, args, kwargs, type_=None):
        """``type_``: the module's module_type when the tracker knows it (installed modules)."""
        return self.call_class(module, path, depth, call_index, parent, type_)

    def entered(self, call) -> None:
        pass

    def exited(self, call, output) -> None:
        pass
