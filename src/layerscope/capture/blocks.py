"""Blocks a model repeats, and a shorter model that runs five of them, for a simulated step composed
from one block (capture/compose.py).

Which blocks are identical. A run of consecutive children of a ModuleList or Sequential (numbered
"0", "1", ...) whose subtrees have, module by module, the same class, train/eval flag, parameters
(names, shapes, dtypes, devices, requires_grad) and buffers, no hooks of their own, no parameter held
anywhere else (no ties into or out of a block), and the same non-tensor state: every attribute of
every module of the subtree has the same value in each block (plain values by equality, other
objects by identity, a shared config), or differs (``layer_idx``) and is never read while the
simulation runs (each such attribute is moved into a property on a private copy of its module that
notes every read; a read makes the composition void and the whole model is simulated instead), or is
a layer index (``layer_idx``) read only by transformers' KV cache to pick the block's slot
(capture/layer_index.py).
Such blocks run the same Python code on the same specs of parameters and attributes; given the same
input specs they make the same ops in the same order with the same shapes, dtypes and storages on
fake tensors, whose dispatch depends on nothing else. That the input specs are the same, and that the
code around the blocks treats each alike (a loop over the list, nothing read by position), is not
argued here: compose.py checks it on the run, by requiring the three middle blocks of the five run
to leave the same record (ops, calls, storages and how long each lives, relative to the
neighbouring blocks), and simulates the whole model where they do not.

``truncated`` builds the shorter model without touching the user's: new objects for the root, every
module down to the list, and the list itself (each with its own dicts of modules, parameters and
buffers), holding the run's first three blocks and its last two; the blocks themselves are the user's
modules, except those holding an attribute that differs, copied as described.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from .. import _compat
from .inputs import iter_tensors, map_tensors
from .layer_index import INDEX_NAMES, IndexReads
from .shadow import MARKER

__all__ = ["BlockRun", "find_run", "truncated", "Truncated", "loop_check_model", "call_signature", "module_state",
           "restore_module_state", "MIN_BLOCKS", "KEPT", "REP"]

KEPT = 5                # blocks the shorter model runs: the first three and the last two
REP = 2                 # the one of them that stands for the blocks left out (the third)
MIN_BLOCKS = 6          # a run shorter than this is simulated whole (five of its blocks run anyway)

_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
          "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs", "_forward_hooks_always_called")
_MACHINERY = frozenset(("training", "_parameters", "_buffers", "_non_persistent_buffers_set", "_modules",
                        "_is_full_backward_hook", "_state_dict_hooks", "_state_dict_pre_hooks",
                        "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks", *_HOOKS, MARKER))
_PLAIN = (int, float, str, bool, type(None), complex, torch.dtype, torch.device)


@dataclass(frozen=True)
class BlockRun:
    """``count`` identical children of the container at ``path``, from child ``start`` on."""

    path: str
    container: nn.Module
    start: int
    count: int
    differing: tuple[tuple[str, str], ...] = ()   # (module path inside a block, attribute) that differ


def _value_key(v):
    if isinstance(v, _PLAIN):
        return (type(v), v)
    if isinstance(v, (tuple, list, frozenset)) and len(v) <= 64:
        return (type(v), tuple(_value_key(x) for x in v))
    return ("id", id(v))


def _structure(block: nn.Module, places: dict[int, int]):
    """What must be equal between identical blocks (None: this block cannot be one: a hook, or a module
    of it registered somewhere else too, ``places`` counting where each module is registered)."""
    out = []
    for rel, sub in block.named_modules(remove_duplicate=False):
        if any(getattr(sub, h, None) for h in _HOOKS) or places.get(id(sub), 0) > 1:
            return None
        ps = tuple((n, None if p is None else (tuple(p.shape), p.dtype, p.device.type, p.requires_grad, type(p)))
                   for n, p in sub._parameters.items())
        bs = tuple((n, None if b is None else (tuple(b.shape), b.dtype, b.device.type, type(b)),
                    n in sub._non_persistent_buffers_set) for n, b in sub._buffers.items())
        attrs = tuple(sorted(k for k in sub.__dict__ if k not in _MACHINERY))
        out.append((rel, type(sub), sub.training, ps, bs, attrs))
    return tuple(out)


def _attributes(block: nn.Module) -> dict[tuple[str, str], object]:
    return {(rel, k): _value_key(v) for rel, sub in block.named_modules()
            for k, v in sub.__dict__.items() if k not in _MACHINERY}


def _numbered(m: nn.Module) -> bool:
    return isinstance(m, (nn.ModuleList, nn.Sequential)) and \
        list(m._modules) == [str(i) for i in range(len(m._modules))]


def find_run(model: nn.Module, least: int = MIN_BLOCKS) -> BlockRun | None:
    """The longest run of identical blocks (see the module's docstring), at least ``least`` long."""
    best = None
    holders: dict[int, int] = {}
    places: dict[int, int] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        places[id(m)] = places.get(id(m), 0) + 1
    for m in model.modules():
        for p in m._parameters.values():
            if p is not None:
                holders[id(p)] = holders.get(id(p), 0) + 1
    for path, m in model.named_modules():
        if not _numbered(m) or len(m._modules) < least:
            continue
        kids = list(m._modules.values())
        shapes = [_structure(k, places) if k is not None else None for k in kids]
        i = 0
        while i < len(kids):
            j = i + 1
            while shapes[i] is not None and j < len(kids) and shapes[j] == shapes[i]:
                j += 1
            n = j - i
            if shapes[i] is not None and n >= least and (best is None or n > best.count) and \
                    len({id(k) for k in kids[i:j]}) == n and \
                    all(holders[id(p)] == 1 for k in kids[i:j] for p in k.parameters()):
                attrs = [_attributes(k) for k in kids[i:j]]
                differing = tuple(sorted(key for key in attrs[0] if any(a.get(key) != attrs[0][key] for a in attrs)))
                best = BlockRun(path, m, i, n, differing)
            i = j
    return best


@dataclass
class Truncated:
    """The shorter model and how its names and modules are the whole model's."""

    model: nn.Module
    run: BlockRun
    originals: dict[int, nn.Module] = field(default_factory=dict)   # id(copy) -> the user's module
    reads: list = field(default_factory=list)                      # (module, attribute) read while running
    index: IndexReads = field(default_factory=IndexReads)          # layer indices read (capture/layer_index.py)
    # each kept block's first call: how it was called (``call_signature``), and the repeated block's
    # output as specs (no tensor of it is held: that would change when its storages die)
    sigs: dict[int, tuple] = field(default_factory=dict)
    out_spec: object = None
    copies: list = field(default_factory=list)                     # the modules made for the shorter model
    # the blocks carry hooks whose ops run after a block's call (FSDP2's): the edge blocks' regions extend
    # over them (capture/regions.py ``Regions._edges``)
    edges: bool = False
    # an op's producers outside the blocks are not compared between the middle blocks, and each copy's op
    # keeps t2's (FSDP2's lazy init views every block's shard in the root's pre-forward; no figure of a
    # sharded rank reads an op's producers: planning/simulate/composed_rank.py)
    loose_producers: bool = False

    def read_problem(self) -> str | None:
        """Why what the blocks read of their differing attributes voids the composition, or None."""
        if self.reads:
            return f"the forward read {self.reads[0]!r}, which differs between the blocks"
        return self.index.problem(self.model)

    def full_index(self, i: int) -> int:
        """The whole container's child index of the shorter one's child ``i``."""
        s, n = self.run.start, self.run.count
        if i <= s + REP:
            return i
        return i + n - KEPT

    def full_path(self, path: str) -> str:
        """The whole model's name for a module or parameter path of the shorter model."""
        pre = self.run.path + "." if self.run.path else ""
        if not path.startswith(pre):
            return path
        rest = path[len(pre):]
        head, dot, tail = rest.partition(".")
        if not head.isdigit():
            return path
        return f"{pre}{self.full_index(int(head))}{dot}{tail}"


def _clone(m: nn.Module) -> nn.Module:
    """``copy.copy(m)`` without the class's ``__new__``: a new object of ``m``'s class whose attributes are
    ``m``'s (its dicts shared). FSDP2's ``FSDPModule.__new__`` builds the original class and calls its
    ``__init__`` without arguments, which copy.copy would run (planning/simulate/composed_rank.py)."""
    c = object.__new__(type(m))
    c.__dict__.update(m.__dict__)
    return c


def _shallow(m: nn.Module, originals: dict, copies: list | None = None) -> nn.Module:
    c = _clone(m)
    if copies is not None:
        copies.append(c)
    for d in ("_modules", "_parameters", "_buffers"):
        c.__dict__[d] = dict(m.__dict__[d])
    originals[id(c)] = originals.get(id(m), m)
    return c


def module_state(modules) -> dict[int, tuple]:
    """What a forward may write in a module besides its tensors: its plain attributes (by identity) and
    its hooks (by handle id), per module (id -> (module, attributes, hooks))."""
    out = {}
    for m in modules:
        attrs = {k: v for k, v in m.__dict__.items() if k not in _MACHINERY and not k.startswith("_ls_")}
        hooks = {h: tuple(getattr(m, h, {}) or ()) for h in _HOOKS}
        out[id(m)] = (m, attrs, hooks)
    return out


def restore_module_state(before: dict[int, tuple]) -> list[str]:
    """Put back what ``module_state`` saw (new attributes and hooks removed, changed ones restored);
    the names of what had changed."""
    changed = []
    for m, attrs, hooks in before.values():
        now = {k: v for k, v in m.__dict__.items() if k not in _MACHINERY and not k.startswith("_ls_")}
        for k in set(now) | set(attrs):
            if k not in attrs:
                changed.append(k)
                del m.__dict__[k]
            elif k not in now or now[k] is not attrs[k]:
                changed.append(k)
                m.__dict__[k] = attrs[k]
        for h, keys in hooks.items():
            d = getattr(m, h, None)
            if d is not None and tuple(d) != keys:
                changed.append(h)
                for key in [x for x in d if x not in keys]:
                    del d[key]
    return changed


_TRACKING: dict[tuple[type, frozenset], type] = {}


def _tracking_class(cls: type, names: frozenset) -> type:
    """A subclass of ``cls`` whose ``names`` are properties noting each read and write in the
    instance's ``_ls_reads`` list (the values sit in the instance's ``_ls_values``); a read of a layer
    index (``INDEX_NAMES``, an int) hands out a ``LayerIndex`` from the instance's ``_ls_index``, which
    notes its uses instead."""
    key = (cls, names)
    sub = _TRACKING.get(key)
    if sub is None:
        def prop(name):
            def get(self):
                value = self.__dict__["_ls_values"][name]
                if name in INDEX_NAMES and type(value) is int:   # its uses are noted (capture/layer_index.py)
                    return self.__dict__["_ls_index"].hand(value)
                self.__dict__["_ls_reads"].append(name)
                return value

            def put(self, value):
                self.__dict__["_ls_reads"].append(name)
                self.__dict__["_ls_values"][name] = value
            return property(get, put)
        sub = type(cls.__name__, (cls,), {n: prop(n) for n in names})
        sub.__qualname__, sub.__module__ = cls.__qualname__, cls.__module__
        _TRACKING[key] = sub
    return sub


def truncated(model: nn.Module, run: BlockRun) -> Truncated:
    """The model with the run's first three blocks and its last two only (see the module's docstring)."""
    out = Truncated(model, run)
    s, n = run.start, run.count
    kids = list(run.container._modules.values())
    keep = kids[:s + REP + 1] + kids[s + n - (KEPT - REP - 1):]
    by_block: dict[str, list[str]] = {}
    for rel, name in run.differing:
        by_block.setdefault(rel, []).append(name)

    def watched(block: nn.Module) -> nn.Module:
        if not by_block:
            return block
        made = {"": _shallow(block, out.originals, out.copies)}     # relative path -> this block's copy of the module
        for rel in by_block:
            path = ""
            for part in [p for p in rel.split(".") if p]:
                parent, path = made[path], f"{path}.{part}" if path else part
                if path not in made:
                    made[path] = _shallow(parent._modules[part], out.originals, out.copies)
                    parent._modules[part] = made[path]
        for rel, names in by_block.items():
            holder = made[rel]
            holder.__dict__["_ls_values"] = {k: holder.__dict__.pop(k) for k in names}
            holder.__dict__["_ls_reads"] = out.reads
            holder.__dict__["_ls_index"] = out.index
            holder.__class__ = _tracking_class(type(holder), frozenset(names))
        return made[""]

    def twin(block: nn.Module, b: int) -> nn.Module:
        """A copy of the kept block ``b`` that notes how it is called (and the repeated one its output)."""
        c = _clone(block)           # shares the block's dicts: its parameters are swapped with the block's
        out.originals[id(c)] = out.originals.get(id(block), block)
        out.copies.append(c)
        plain = type(block).forward

        def forward(*args, **kwargs):
            out.sigs.setdefault(b, call_signature(args, kwargs))
            result = plain(c, *args, **kwargs)
            if b == REP and out.out_spec is None:
                out.out_spec = map_tensors(result, _Spec)
            return result
        c.__dict__["forward"] = forward
        return c

    for block in kids[s:s + n]:         # every place's index, for the checks of the blocks left out
        for rel, names in by_block.items():
            for name in INDEX_NAMES.intersection(names):
                value = getattr(block.get_submodule(rel), name, None) if rel else getattr(block, name, None)
                if type(value) is int:
                    out.index.places.add(value)
    container = _shallow(run.container, out.originals, out.copies)
    container.__dict__["_modules"] = {str(i): twin(watched(k), i - s) if s <= i < s + KEPT else k
                                      for i, k in enumerate(keep)}
    out.model = _above(model, run.path, container, out.originals, out.copies)
    return out


def _above(root: nn.Module, path: str, node: nn.Module, originals: dict, copies: list | None = None) -> nn.Module:
    """A new root whose module at ``path`` is ``node``: new objects for every module above it."""
    parts = path.split(".") if path else []
    for depth in range(len(parts), 0, -1):
        c = _shallow(root.get_submodule(".".join(parts[:depth - 1])), originals, copies)
        c._modules[parts[depth - 1]] = node
        node = c
    return node


class _Spec:
    """A tensor's shape, strides, dtype, device and requires_grad, without the tensor."""

    __slots__ = ("shape", "stride", "dtype", "device", "requires_grad")

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.stride, self.dtype = tuple(t.shape), tuple(t.stride()), t.dtype
        self.device, self.requires_grad = t.device, t.requires_grad

    def make(self) -> torch.Tensor:
        out = torch.empty_strided(self.shape, self.stride, dtype=self.dtype, device=self.device)
        return out.requires_grad_(True) if self.requires_grad and out.is_floating_point() else out


def _sig(v, depth: int = 0):
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.dtype, tuple(v.stride()), v.requires_grad, v.device.type)
    if depth < 4 and isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(_sig(x, depth + 1) for x in v))
    if depth < 4 and isinstance(v, dict):
        return ("dict", tuple((k, _sig(x, depth + 1)) for k, x in v.items()))
    return _value_key(v)


def call_signature(args: tuple, kwargs: dict) -> tuple:
    """How a block is called: its arguments (tensors by shape, strides, dtype, requires_grad and device,
    other values by value or identity), grad mode, autocast, and the saved-tensor hooks in force (a
    checkpoint's)."""
    return (_sig(tuple(args)), _sig(dict(kwargs)), torch.is_grad_enabled(),
            torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda"), _compat.saved_hooks_name())


class _StandIn(nn.Module):
    """A place of the run in the loop check: it notes how it is called and returns new tensors shaped
    as the repeated block's output (noting their storages through ``shared["lookup"]``); reads of its
    attributes go to the repeated block (a read of one that differs is noted there)."""

    def __init__(self, shared: dict, place: int) -> None:
        super().__init__()
        self.__dict__["_ls_shared"] = shared
        self.__dict__["_ls_place"] = place

    def forward(self, *args, **kwargs):
        shared, place = self._ls_shared, self._ls_place
        shared["sigs"].setdefault(place, call_signature(args, kwargs))
        out = map_tensors(shared["spec"], _Spec.make, leaf=_Spec)
        shared["outs"].setdefault(place, [shared["lookup"](t) for t in iter_tensors(out)])
        return out

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.__dict__["_ls_shared"]["block"], name)


def loop_check_model(tr: Truncated, shared: dict) -> nn.Module:
    """The whole model's loop with a stand-in at every place of the run (``_StandIn``), for checking
    that the code around the blocks treats every place alike (capture/composed.py). ``shared`` gets
    ``sigs`` (place -> call signature) and ``outs`` (place -> its output's Blocks)."""
    run = tr.run
    s, n = run.start, run.count
    short = tr.model.get_submodule(run.path) if run.path else tr.model
    kept = list(short._modules.values())
    shared.update(block=kept[s + REP], spec=tr.out_spec, sigs={}, outs={})
    kids = kept[:s] + [_StandIn(shared, i) for i in range(n)] + kept[s + KEPT:]
    out = _shallow(short, tr.originals)
    out.__dict__["_modules"] = {str(i): k for i, k in enumerate(kids)}
    return _above(tr.model, run.path, out, tr.originals)
