"""The module tracker: which module call is running, numbered the same way for every user.

A call is (path, call index, depth, parent): the module's first path in ``named_modules()``, how many
times that module was called before in this run, how deep it sits in the calls that are open, and
the call it runs inside. The op recorder (capture/session.py), the latency timer
(capture/timing.py), ``activations()``, the pipeline's unit marks, the profiler and the interpreters
of exported and TorchScript graphs all hold one ModuleTracker (composition, never a subclass), so a
call's index means the same thing in every report. What they record they add through the tracker's
two extension points, as torch's ModTracker.register_user_hooks: ``new_call`` (the factory of their
call records) and ``register_user_hooks`` (forward pre/post and backward pre/post callbacks).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from typing import Any, Callable

import torch
from torch import nn

from .. import _compat
from .backward import SeqOwners, hook_graph

__all__ = ["named_modules", "plain_call", "TrackedCall", "ModuleTracker", "module_type", "tracked_modules"]

_get_ident = threading.get_ident


def module_type(m: nn.Module) -> str:
    """The module's class name; a scripted module's original class (``Linear``, not
    ``RecursiveScriptModule``)."""
    if isinstance(m, torch.jit.ScriptModule):
        return getattr(m, "original_name", None) or type(m).__name__
    return type(m).__name__


def named_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``list(model.named_modules())``: the same (path, module) pairs in the same order (pre-order, a
    module reached again left out), found by one loop over a stack instead of a generator per module
    and level (a 1,000-block MLP: 3,001 modules, each path yielded up through every level above
    it). A class that overrides ``named_modules`` anywhere in the tree gets torch's own walk."""
    out: list[tuple[str, nn.Module]] = []
    memo: set = set()
    stack: list[tuple[str, nn.Module]] = [("", model)]
    own = _NAMED_MODULES
    while stack:
        prefix, m = stack.pop()
        if m in memo:
            continue
        if type(m).named_modules is not own:
            return list(model.named_modules())
        memo.add(m)
        out.append((prefix, m))
        kids = m._modules
        if kids:
            dot = prefix + "." if prefix else ""
            items = list(kids.items())      # (a script module's _modules is no dict)
            items.reverse()                 # popped in their own order
            stack.extend([(dot + name, c) for name, c in items if c is not None])
    return out


_NAMED_MODULES = nn.Module.named_modules


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
    are not the run's and are left out.

    ``new_call(module, path, depth, call_index, parent, args, kwargs, type_)`` makes a call's record
    (a TrackedCall or a subclass; None: this call is not tracked, e.g. a recomputation during the
    op recorder's backward). ``register_user_hooks`` adds callbacks: ``pre_fw(call)`` once the call
    is numbered, ``post_fw(call, output)`` when it ends; with ``track_backward()``, ``pre_bw(call)``
    before each autograd node the call's forward made runs (capture/backward.py: one node at a time,
    so a call's backward time is exactly the sum over its nodes) and ``post_bw()`` when a backward
    pass through such nodes ends. Callbacks are kept as tuples: the hooks run on every module call."""

    def __init__(self, this_thread_only: bool = True, *, new_call: Callable | None = None) -> None:
        self.thread = _get_ident() if this_thread_only else None
        self.new_call = new_call if new_call is not None else _plain_call
        self.pre_fw: tuple = ()
        self.post_fw: tuple = ()
        self.pre_bw: tuple = ()
        self.post_bw: tuple = ()
        self.paths: dict[int, str] = {}
        self.types: dict[int, str] = {}     # module_type of each installed module, worked out once
        self.handles: list = []
        # the hook dicts that hold this tracker's hooks, five per module (install wrote them)
        self.hooked: list[tuple[dict, ...]] = []
        self.hook_key = -next(_HOOK_KEYS)
        # backward (track_backward): the next autograd sequence number, or None when not tracked
        self.next_seq: Callable[[], int] | None = None
        self.defer = False
        self.param_module: dict[int, int] = {}   # parameter -> the tracked module that registers it
        self.node_handles: list = []
        self.reset()

    def register_user_hooks(self, pre_fw: Callable | None = None, post_fw: Callable | None = None,
                            pre_bw: Callable | None = None, post_bw: Callable | None = None) -> None:
        """Add callbacks (see the class); each runs after those registered before it."""
        self.pre_fw += (pre_fw,) if pre_fw is not None else ()
        self.post_fw += (post_fw,) if post_fw is not None else ()
        self.pre_bw += (pre_bw,) if pre_bw is not None else ()
        self.post_bw += (post_bw,) if post_bw is not None else ()

    def track_backward(self, defer: bool = False) -> bool:
        """Attribute backward to calls (pre_bw/post_bw): each call notes the autograd sequence
        numbers its forward used, and after a top-level call ends every node of the graph it built
        gets a pre-hook naming its call (``defer``: only at ``hook_pending()``, which the caller runs
        between forward and backward, outside its timings). False where this torch cannot."""
        self.next_seq = _compat.get("sequence_nr")
        self.defer = defer
        return self.next_seq is not None

    def reset(self) -> None:
        """Forget the calls (a new step begins); node hooks of the last one come off."""
        self.drop_node_hooks()
        self.calls: list[Any] = []
        self.stack: list[int] = []
        self.ncalls: dict[int, int] = defaultdict(int)
        self.first_call: dict[int, int] = {}   # module -> its first call (backward: parameters' owner)
        self.notes: SeqOwners | None = None    # the open top-level call's sequence notes
        self.pending: list[tuple[int, Any, SeqOwners]] = []
        self.in_pass = False
        self.hook_seconds = 0.0    # CPU seconds spent putting pre-hooks on graph nodes

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
            if self.next_seq is not None:
                for p in m._parameters.values():
                    if p is not None:
                        self.param_module.setdefault(id(p), id(m))
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
        """Take the module hooks off (and the node hooks: see drop_node_hooks)."""
        for h in self.handles:
            h.remove()
        self.handles.clear()
        key = self.hook_key
        for dicts in self.hooked:
            for hooks in dicts:
                hooks.pop(key, None)
        self.hooked.clear()
        self.drop_node_hooks()

    def drop_node_hooks(self) -> None:
        for h in self.node_handles:
            h.remove()
        self.node_handles = []
        self.hooked_leaves: dict[int, Any] = {}   # gradient accumulators already hooked this step

    # ---- the numbering (the forward pre-hook and the always-called forward hook) ----------------
    def enter(self, module: nn.Module, args: tuple = (), kwargs: dict | None = None) -> None:
        """A call of ``module`` begins."""
        if self.thread is not None and _get_ident() != self.thread:
            return None
        calls, stack = self.calls, self.stack
        idx = len(calls)
        parent = stack[-1] if stack else None
        key = id(module)
        path = self.paths.get(key)
        n = self.ncalls[key]
        call = self.new_call(module, type(module).__name__ if path is None else path,
                             0 if parent is None else calls[parent].depth + 1, n, parent,
                             args, kwargs, self.types.get(key))
        if call is None:
            return None
        call.index = idx
        self.ncalls[key] = n + 1
        if parent is not None:
            calls[parent].children.append(idx)
        calls.append(call)
        stack.append(idx)
        if self.next_seq is not None:
            self.first_call.setdefault(key, idx)
            if parent is None:
                self.notes = SeqOwners()
            self.notes.note(self.next_seq(), parent)
        for fn in self.pre_fw:
            fn(call)
        return None   # a forward pre-hook that returns something replaces the module's arguments

    def exit(self, module: nn.Module, args: tuple = (), kwargs: dict | None = None, output: Any = None) -> None:
        """The open call of ``module`` ends."""
        if self.thread is not None and _get_ident() != self.thread:
            return None
        calls, stack = self.calls, self.stack
        if not stack:
            return None
        if calls[stack[-1]].module is not module:
            # after an exception, calls opened inside this one that never closed close with it; a
            # call the factory declined (not on the stack) closes nothing
            k = len(stack) - 2
            while k >= 0 and calls[stack[k]].module is not module:
                k -= 1
            if k < 0:
                return None
            del stack[k + 1:]
        call = calls[stack.pop()]
        for fn in self.post_fw:
            fn(call, output)
        if self.next_seq is not None and self.notes is not None:
            notes = self.notes
            notes.note(self.next_seq(), call.index)
            if call.parent is None and notes.seqs[-1] > notes.seqs[0] and output is not None:
                self.pending.append((call.index, output, notes))
                if not self.defer:
                    self.hook_pending()
        return None   # a forward hook that returns something replaces the module's output

    _pre = enter
    _post = exit

    # ---- backward ------------------------------------------------------------------------------
    def hook_pending(self) -> None:
        """Give every node of the graphs the finished top-level calls built a pre-hook naming its
        call (capture/backward.py)."""
        t = time.perf_counter()
        for root, out, notes in self.pending:
            self.node_handles += hook_graph(
                out, notes, lambda p, root=root: self.first_call.get(self.param_module.get(id(p)), root),
                self.hooked_leaves, self._node)
        self.pending = []
        self.hook_seconds += time.perf_counter() - t

    def _node(self, call: int, grad_outputs) -> None:
        if not self.in_pass:
            self.in_pass = True
            _compat.queue_backward_callback(self._pass_end)
        for fn in self.pre_bw:
            fn(call)

    def _pass_end(self) -> None:
        for fn in self.post_bw:
            fn()
        self.in_pass = False


def plain_call(module, path, depth, call_index, parent, args, kwargs, type_=None) -> TrackedCall:
    return TrackedCall(module, path, depth, call_index, parent, type_)


_plain_call = plain_call
