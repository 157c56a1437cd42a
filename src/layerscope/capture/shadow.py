"""A structural copy of a module tree for an analysis to work on, so that another thread using the
same model never sees layerscope's work (issue 58): no mode flip, no hook, no parameter swapped for
a meta or fake tensor, no buffer updated.

Each module of the tree is copied once (a memo keeps a submodule reached under several names one
copy, as tied weights stay one parameter): its own ``__dict__`` and its own ``_parameters``,
``_buffers``, ``_modules`` and hook dictionaries, so that what an analysis registers, swaps or
flips lands in the copy. The copy's parameters are parameters of their own on the user's
storages (the same values; their ``.grad`` and ``requires_grad`` the copy's), and it shares the
user's hooks (they run in the analysis as in a plain call).
Real buffers are cloned: a train-mode run updates BatchNorm's running statistics in place, and the
other thread's eval forward reads them. Attributes that hold a module of the tree outside
``_modules`` (a list of blocks kept beside a ModuleList, a parent's weak reference, a bound method of
a submodule, a ``functools.partial`` given one) are pointed at the copies.

Where a copy could not be faithful, the model itself is analysed (as before issue 58): a tree that
holds a TorchScript module (its slots live in C++), a parameter still to be created (the first
forward materialises the user's own, as a lazy module's first call does), an instance-level
``forward`` that is neither a bound method of a module nor a ``functools.partial`` given one (as
accelerate's hooks make it; torch.compile's wrapper calls the original modules), a class with
``__slots__``, or torch's distributed wrappers (DDP, FSDP, fully_shard and the other composable APIs
find their state by the module object).

What stays shared and so visible to another thread: on a CUDA model, the
weights a real optimizer step updates in place (``memory(simulate=False)`` / ``measure=True``; put
back afterwards; on the CPU the step runs on clones: ``private_params``); objects the forward mutates
in place through a plain attribute (a list, a cache tensor). Attributes the forward assigns
(``self.received = x``) land in the copy while it runs and are written to the user's modules when
the analysis ends (``write_back``), as the model's own forward would leave them, except private
names (``_x``) and values that hold a meta or fake tensor (a simulation's, never the user's).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import operator
import types
import weakref
from collections import OrderedDict

import torch
from torch import nn
from torch.nn.parameter import UninitializedTensorMixin

__all__ = ["shadow_of", "shadow_tree", "live_module", "private_params", "MARKER", "attributes_of", "write_back"]

# the containers of nn.Module that an analysis writes (parameters, buffers, submodules, forward hooks):
# each copy has its own. The others are shared, read only: nothing in layerscope registers a buffer,
# a backward module hook or a state-dict hook on a model it analyses (the tracker follows backward
# with tensor hooks). 8 containers a module: a copy of 12,001 modules makes about 96,000.
_OWN = ("_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs")
# torch's wrappers whose hooks find their state by the module object (a copy has none)
_WRAPPERS = frozenset({"DistributedDataParallel", "FullyShardedDataParallel", "FSDPModule"})
_COMPOSABLE = "__composable_api_state_key"      # torch.distributed._composable.contract's keys
# the copy's marker: a weak reference to the user's module (a deep copy of a copy keeps it as it is);
# not one of the module's own attributes (capture/blocks.py compares blocks without it)
MARKER = _LIVE = "_layerscope_live"
_SKIP = frozenset(_OWN) | {_LIVE}
# what nn.Module keeps in __dict__ for itself (and layerscope's marker): never an attribute a forward
# sets, nor one that points at a module of the tree
_MODULE_OWN = frozenset(vars(nn.Module())) | {_LIVE}
_OWN_SET = frozenset(_OWN)
_MAKE = tuple((k, type(v)) for k, v in vars(nn.Module()).items() if k in _OWN_SET)   # (name, its container type)
# attribute values that cannot hold a module (most of a module's plain attributes)
_ATOMIC = frozenset({bool, int, float, str, type(None), torch.Tensor, nn.Parameter, torch.dtype,
                     torch.device, torch.Size})
# attribute values _remap hands back as they are without looking inside (it follows plain lists, tuples
# and dicts, bound methods, partials and weak references only): nn.Module's own hook dictionaries
# (OrderedDict, a dozen a module) and the non-persistent buffer names (a set) are never remapped, so
# the copy skips the call (most of _remap's calls: 63,000 on a 1,000-block MLP, 21 a module)
_KEPT = _ATOMIC | {OrderedDict, set, frozenset}


def live_module(module):
    """The user's module a copy stands for; ``module`` itself when it is not a copy."""
    ref = getattr(module, "__dict__", {}).get(_LIVE)
    live = ref() if ref is not None else None
    return live if live is not None else module


def shadow_of(model: nn.Module) -> nn.Module:
    """A structural copy of ``model`` sharing its parameters (see the module's documentation), or
    ``model`` itself where a copy could not be faithful or ``model`` is a copy already."""
    return shadow_tree(model)[0]


def shadow_tree(model: nn.Module, leave_inference: bool = False) \
        -> tuple[nn.Module, list[tuple[nn.Module, nn.Module]], bool | None]:
    """``shadow_of(model)``; each (copy, the user's module it stands for) of the tree it made, each
    module once (empty where ``model`` itself is returned): what ``attributes_of`` and ``write_back``
    walk, without walking the copy again through ``modules()`` (a generator and a path string per
    module); and whether the tree holds an inference tensor as a parameter or buffer (None where
    ``model`` itself is returned: not looked at), found on the walk that copies it.
    ``leave_inference``: the copy's tensors are made outside ``torch.inference_mode`` unless the tree
    holds an inference tensor (what capture/guard.py runs the analysis in), as they were when the
    guard asked ``holds_inference_tensors`` in a walk of its own first."""
    if _LIVE in model.__dict__:
        return model, [], None
    memo: dict[int, nn.Module] = {}
    pairs: list[tuple[nn.Module, nn.Module]] = []
    own_attrs: list[tuple[dict, set]] = []     # (a copy's __dict__, its attributes beyond nn.Module's)
    inference = False
    classes: dict[type, bool] = {}
    ref = weakref.ref
    todo = [model]
    while todo:
        m = todo.pop()
        if id(m) in memo:
            continue
        cls = type(m)
        ok = classes.get(cls)
        if ok is None:
            ok = classes[cls] = _copyable_class(cls)
        # the instance's attributes beyond nn.Module's own bookkeeping (a set difference in C: most
        # modules have two or three, a Linear its in/out features): what _copyable and _remap look at
        extra = m.__dict__.keys() - _MODULE_OWN
        held = _copyable(m, extra) if ok else None
        if held is None:
            return model, [], None
        inference = inference or held
        new = object.__new__(cls)
        d = new.__dict__
        d.update(m.__dict__)
        for k, make in _MAKE:
            v = d[k]
            d[k] = make(v) if v else make()
        d[_LIVE] = ref(m)
        memo[id(m)] = new
        pairs.append((new, m))
        if extra:
            own_attrs.append((d, extra))
        for c in m._modules.values():
            if c is not None:
                todo.append(c)
    buffers: dict[int, torch.Tensor] = {}
    params: dict[int, torch.Tensor] = {}
    kept = _KEPT
    with torch.no_grad(), torch.inference_mode(False) if leave_inference and not inference else \
            contextlib.nullcontext():
        for new in memo.values():
            d = new.__dict__
            mods = d["_modules"]
            for k, c in mods.items():
                if c is not None:
                    mods[k] = memo[id(c)]
            if d["_parameters"]:
                _own_tensors(d["_parameters"], params, _alias)
            if d["_buffers"]:
                _own_tensors(d["_buffers"], buffers, _private)
    # nn.Module's own bookkeeping (the mode, hook dictionaries, the non-persistent buffer names) holds
    # no module of the tree: only the other attributes are pointed at the copies
    for d, extra in own_attrs:
        for k in extra:
            v = d[k]
            if type(v) not in kept:
                r = _remap(v, memo, 0)
                if r is not v:
                    d[k] = r
    return memo[id(model)], pairs, inference


def _own_tensors(slots: dict, made: dict[int, torch.Tensor], make) -> None:
    """Each tensor of ``slots`` replaced by ``make(tensor)``, made once per tensor (``made``: by id)."""
    for k, t in slots.items():
        if t is not None:
            new = made.get(id(t))
            if new is None:
                new = made[id(t)] = make(t)
            slots[k] = new


def private_params(model: nn.Module, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """For a real training step on a copy (``shadow_of``) whose parameters are all on the CPU: clones of
    them by name (tied names one clone), for the step to run on in their place, so that its gradients
    and its optimizer's in-place updates never reach the user's parameters, which another thread may
    be running. The clones take the memory the step's snapshot of the weights took before (issue 58).
    None elsewhere: a CUDA model's weights are not doubled on the device (that could not fit, and
    would show in the measured peak); the step then writes the user's weights in place and puts them
    back afterwards."""
    if live_module(model) is model or not params or \
            any(type(p) not in (torch.Tensor, nn.Parameter) or p.device.type != "cpu" for p in params.values()):
        return None
    clones: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for p in params.values():
            if id(p) not in clones:
                clones[id(p)] = p.detach().clone().requires_grad_(p.requires_grad)
    return {n: clones[id(p)] for n, p in params.items()}


def _copyable_class(cls: type) -> bool:
    """A class whose instances keep their state in ``__dict__`` (no ``__slots__`` of its own), and
    whose slots are not TorchScript's (kept in C++)."""
    if issubclass(cls, torch.jit.ScriptModule) or any(c.__name__ in _WRAPPERS for c in cls.__mro__):
        return False
    for c in cls.__mro__:
        slots = vars(c).get("__slots__", ())
        if set((slots,) if isinstance(slots, str) else slots) - {"__dict__", "__weakref__"}:
            return False
    return True


def _copyable(m: nn.Module, extra) -> bool | None:
    """None where a copy of ``m`` would not run as ``m`` does (a tensor still to be created, an
    instance-level ``forward`` that is not a bound method of a module); else whether ``m`` holds an
    inference tensor as a parameter or buffer of its own. ``extra``: the names of ``m.__dict__``
    beyond nn.Module's own (``_MODULE_OWN``)."""
    d = m.__dict__
    if not d.keys() >= _OWN_SET:
        return None
    if extra and any(map(str.startswith, extra, itertools.repeat(_COMPOSABLE))):
        return None                      # fully_shard, replicate, checkpoint: state found by the module
    fwd = d.get("forward") if extra else None
    if fwd is not None and not (type(fwd) is types.MethodType and isinstance(fwd.__self__, nn.Module)) and \
            not (type(fwd) is functools.partial and any(isinstance(a, nn.Module) for a in fwd.args)):
        return None
    inference = False
    for t in m._parameters.values():
        if t is not None:
            if isinstance(t, UninitializedTensorMixin):
                return None
            inference = inference or t.is_inference()
    for t in m._buffers.values():
        if t is not None:
            if isinstance(t, UninitializedTensorMixin):
                return None
            inference = inference or t.is_inference()
    return inference


def _alias(p: torch.Tensor) -> torch.Tensor:
    """A parameter of its own on ``p``'s storage: the same values, read where ``p`` is read, but its
    ``.grad`` and ``requires_grad`` are the copy's (a backward of the analysis never touches the
    user's gradients, which a training loop in another thread may be using). A parameter of a tensor
    subclass (fake, DTensor, quantised) or made under inference mode is shared as it is."""
    if type(p) is not nn.Parameter or type(p.data) is not torch.Tensor or p.is_inference():
        return p       # (an inference tensor takes requires_grad only inside inference mode)
    return nn.Parameter(p.data, requires_grad=p.requires_grad)


def _private(b: torch.Tensor) -> torch.Tensor:
    """A clone of a real buffer (a meta or subclass tensor, whose values nothing updates or that cannot
    be cloned faithfully, is shared)."""
    if type(b) is not torch.Tensor or b.is_meta:
        return b
    if b.is_inference():       # a clone that stays an inference tensor, as the model's was
        with torch.inference_mode():
            return b.clone()
    c = b.clone()              # (under no_grad)
    return c.requires_grad_() if b.requires_grad else c


def _remap(v, memo: dict[int, nn.Module], depth: int):
    """``v`` with every module of the tree in it replaced by its copy (plain lists, tuples and dicts,
    bound methods); ``v`` itself when it holds none."""
    if isinstance(v, nn.Module):
        return memo.get(id(v), v)
    if depth > 3:
        return v
    t = type(v)
    if t is list or t is tuple:
        out = [_remap(x, memo, depth + 1) for x in v]
        return v if all(a is b for a, b in zip(out, v)) else t(out)
    if t is dict:
        out = {k: _remap(x, memo, depth + 1) for k, x in v.items()}
        return v if all(out[k] is x for k, x in v.items()) else out
    if t is types.MethodType and isinstance(v.__self__, nn.Module) and id(v.__self__) in memo:
        return types.MethodType(v.__func__, memo[id(v.__self__)])
    if t is functools.partial:   # accelerate's forward: partial(new_forward, module)
        args = _remap(v.args, memo, depth + 1)
        kw = _remap(v.keywords, memo, depth + 1)
        if args is v.args and kw is v.keywords:
            return v
        new = functools.partial(v.func, *args, **kw)
        new.__dict__.update(v.__dict__)      # functools.update_wrapper's attributes
        return new
    if t is weakref.ref:         # a reference to a parent kept out of _modules
        target = v()
        if isinstance(target, nn.Module) and id(target) in memo:
            return weakref.ref(memo[id(target)])
    return v






def attributes_of(copy: nn.Module, pairs: list[tuple[nn.Module, nn.Module]] | None = None) -> list | None:
    """The plain attributes of each module of the copy ``copy`` as they are now, for ``write_back``;
    None where ``copy`` is not a copy (the model itself is analysed). ``pairs``: ``shadow_tree``'s
    (copy, user's module) of this copy, where the caller has them (else found by a walk)."""
    if live_module(copy) is copy:
        return None
    if pairs is None:
        pairs = [(m, live_module(m)) for m in copy.modules()]
    return [(m, live, dict(m.__dict__)) for m, live in pairs if live is not m]


def write_back(copy: nn.Module, before: list | None) -> None:
    """Attributes that the analysis's forwards assigned on the copy's modules since ``before``
    (``attributes_of``), set on the user's modules, as the model's own forward would have left them
    (torch-scan's tests read ``model.received`` after a crawl). Not written: nn.Module's own state
    (parameters, buffers, submodules, hooks, the mode: the analysis's, on the copy); private names
    (``_x``: a library's flag that pairs with hooks it installed on the copy, as transformers'
    ``_output_capturing_hooks_installed``, would tell the user's model it has hooks it has not;
    layerscope's own ``_ls_`` state); and values that hold a meta or fake tensor (a simulation's
    values; the user's model never held them)."""
    if before is None:
        return
    is_, eq = operator.is_, operator.eq
    for m, live, old in before:
        d = m.__dict__
        # nothing assigned (most modules): the same keys in the same order holding the very same
        # objects, tested in C (a changed order or value goes the key-by-key way below)
        if len(d) == len(old) and all(map(is_, d.values(), old.values())) and all(map(eq, d, old)):
            continue
        for k, v in list(d.items()):
            if k.startswith("_") or old.get(k, _MODULE_OWN) is v or k in _MODULE_OWN or \
                    isinstance(v, (types.MethodType, functools.partial)) or not _real(v, 0):
                continue     # (a forward bound to a copy: layerscope's own)
            live.__dict__[k] = live_module(v) if isinstance(v, nn.Module) else v


def _real(v, depth: int) -> bool:
    """Whether ``v`` holds no tensor that is not a plain one on a real device (a meta, fake or other
    subclass tensor) and no copy of a module below its top, looking into lists, tuples and dicts (8
    levels; deeper: not written)."""
    if isinstance(v, torch.Tensor):
        return type(v) in (torch.Tensor, nn.Parameter) and not v.is_meta
    if isinstance(v, nn.Module):     # a copy inside a container would hand the user layerscope's copy
        return depth == 0 or live_module(v) is v
    if isinstance(v, (list, tuple)):
        return depth < 8 and all(_real(x, depth + 1) for x in v)
    if isinstance(v, dict):
        return depth < 8 and all(_real(x, depth + 1) for x in v.values())
    return True
