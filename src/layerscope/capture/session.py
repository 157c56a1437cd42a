"""One run of the model under a module tracker and an aten op recorder.

* The tracker is a forward pre-hook and an always-called forward hook on every module. It keeps the
  stack of module calls (path + call index), the input/output shapes of each call, and names the call
  that failed when the forward raises. Hooks are per module (no global hooks), ignore other threads,
  and are removed in ``finally``.
* The recorder is a TorchDispatchMode: it sees every aten op after autograd has decomposed composite
  ops, prices it with the cost registry and attributes it to the innermost running module call.
* Backward attribution is exact, not heuristic: during the forward the recorder notes the autograd
  sequence number at each op; during backward, ``torch._C._current_autograd_node()`` names the node
  being run, and its sequence number maps back to the forward op (and so the module call) that
  created it. AccumulateGrad nodes map to the module that owns the parameter.
* A StateGuard snapshots what a run can change (train/eval flags, requires_grad, .grad, buffers such
  as BatchNorm statistics, the RNG state) and restores it, also when the model raises.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from bisect import bisect_right
from collections import defaultdict
from typing import Any

import torch
from torch import nn

from .. import _compat
from ..costs import CostOptions, OpCall, OpCost
from ..costs.registry import FREE
from ..errors import ForwardError, InputError, LayerscopeError, RegistryError
from ..trace import (BACKWARD, FORWARD, PRODUCER_INPUT, PRODUCER_STATE, PRODUCER_UNKNOWN, Costs,
                     LayerRecord, OpEvent, ParamSpec, Trace)
from .inputs import SpecCache, iter_tensors, map_tensors
from .rng import PrivateRNG
from .recorder import FAKE_SIZE_FIXES, OpRecorder
from .tracker import ModuleTracker, TrackedCall, module_type, tracked_modules

_get_ident = threading.get_ident

__all__ = ["Session", "OpRecorder", "StateGuard", "capture", "module_type", "tracked_modules", "build_trace", "swapped_state",
           "empty_state", "empty_like_on", "run_forward", "run_backward", "model_device", "describe_inputs",
           "private_rng", "grad_inputs", "held_tensors", "own_forward"]

_ACCUMULATE_GRAD_SEQ = 2 ** 64 - 1
_NO_COSTS = Costs()   # uncounted and free ops (a frozen record: one object serves them all)
_Tensor = torch.Tensor
_ref = weakref.ref


def model_device(model: nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def describe_inputs(specs) -> str:
    if not specs:
        return "no tensors"
    return ", ".join(f"Tensor{list(s.shape)} {s.dtype}" for s in specs)


class StateGuard:
    """Snapshot of what a run may change in a model; ``restore()`` puts every piece back."""

    def __init__(self, model: nn.Module, modules: list[nn.Module] | None = None,
                 inputs: Any = None, params: list[torch.Tensor] | None = None) -> None:
        """``params``: ``held_tensors(modules, "_parameters")`` where the caller has it already."""
        modules = list(model.modules()) if modules is None else modules
        self.modes = [(m, m.training) for m in modules]
        # parameters, and input tensors a backward would accumulate a .grad into
        if params is None:
            params = held_tensors(modules, "_parameters")
        leaves = params + [t for t in _unique(iter_tensors(inputs)) if t.is_leaf and t.requires_grad]
        self.params = [(p, p.requires_grad, p.grad) for p in _unique(leaves)]
        self.buffers = []
        for m in modules:
            for name, b in m._buffers.items():
                if b is not None:
                    self.buffers.append((m, name, b, b.detach().clone()))
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and \
            torch.cuda.is_initialized() else None

    def restore(self, rng: bool = True) -> None:
        """``rng=False`` leaves torch's global generators alone: a run whose random ops all drew from
        a private generator (capture/rng.py) never advanced them, and setting them back would rewind
        the draws other threads made meanwhile."""
        for m, training in self.modes:
            if m.training is not training:   # nn.Module.__setattr__ is slow, and most flags never moved
                _set_training(m, training)
        for p, requires_grad, grad in self.params:
            if p.requires_grad != requires_grad:
                p.requires_grad_(requires_grad)
            p.grad = grad
        with torch.no_grad():
            for m, name, b, saved in self.buffers:
                if (m._buffers[name] if name in m._buffers else None) is not b:   # script modules too
                    m._buffers[name] = b
                if b.device.type != "meta":
                    # a buffer made under inference mode can be written only inside it
                    with torch.inference_mode() if b.is_inference() else contextlib.nullcontext():
                        b.copy_(saved)
        if not rng:
            return
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


@_compat.dispatch_mode
class _PrivateRngMode:
    """Only hands random ops the private generator (no recording)."""

    def __init__(self, rng: PrivateRNG) -> None:
        super().__init__()
        self.rng = rng

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags:
            return self.rng.call(func, args, kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def private_rng():
    """Run a real forward with its random draws from a private generator (capture/rng.py). Yields
    the PrivateRNG: restore the global state afterwards only if ``touched_global``."""
    rng = PrivateRNG()
    with _PrivateRngMode(rng):
        yield rng


class _Call(TrackedCall):
    __slots__ = ("inputs", "outputs", "output_producers", "error", "ambient", "span")

    def __init__(self, module, path, depth, call_index, parent, inputs, type_: str | None = None) -> None:
        # TrackedCall's fields, set here (one Python frame less on every module call)
        self.index = -1
        self.module = module
        self.path = path
        self.type = module_type(module) if type_ is None else type_
        self.depth = depth
        self.call_index = call_index
        self.parent = parent
        self.children: list[int] = []
        self.inputs = inputs
        self.outputs = ()
        self.output_producers: tuple[int, ...] = ()
        self.error: BaseException | None = None
        # the exception being handled around this call, if the model is run inside an except block
        self.ambient = sys.exc_info()[1]
        self.span = (0, -1)  # indices of the first and last op that ran inside the call


class Session(ModuleTracker):
    """One run's tracker (its module calls) and the op recorder's state (ops, dataflow, autograd
    bookkeeping, cost cache)."""

    def __init__(self, model: nn.Module, options: CostOptions, track_seq: bool, storage=None,
                 simulated: bool = False, rng: PrivateRNG | None = None) -> None:
        super().__init__()
        self.model = model
        # random ops draw from a private generator (capture/rng.py), never from torch's global one
        self.rng = rng if rng is not None else PrivateRNG()
        self.storage = storage      # a StorageTracker when memory is tracked
        self.simulated = simulated  # running on fake tensors
        self.options = options
        self.track_seq = track_seq
        # the autograd sequence number of each forward op maps backward nodes to layers
        self.next_seq = _compat.sequence_nr("attributing backward ops to layers") if track_seq else None
        self.ops: list[OpEvent] = []
        # dataflow: id(tensor) -> (weak reference, the op that produced it or a PRODUCER_* code). A
        # plain dict of weakref.ref (C) instead of torch's WeakIdKeyDictionary (a Python class per
        # key): an entry counts only while its reference still points at the very tensor looked up,
        # so a dead tensor's id reused by a new one reads as unknown, as before.
        self.producers: dict[int, tuple] = {}
        self.specs = SpecCache()     # TensorSpec per (shape, dtype): the same few recur in every call
        self.phase = FORWARD
        self.paused = False
        self.seq_vals: list[int] = []
        self.seq_layers: list[int] = []
        self.seq_cache: dict[int, int] = {}
        self.cost_cache: dict[Any, Any] = {}
        self.param_layer: dict[int, int] = {}

    def seed_producers(self, inputs: Any, state) -> None:
        """Dataflow sources: the example inputs and the parameters/buffers the ops will read."""
        producers = self.producers
        for t in iter_tensors(inputs):
            producers[id(t)] = (_ref(t), PRODUCER_INPUT)
        for t in state:
            producers[id(t)] = (_ref(t), PRODUCER_STATE)

    def producer(self, t: torch.Tensor) -> int:
        """The op that produced ``t`` (its index), or a PRODUCER_* code."""
        e = self.producers.get(id(t))
        return e[1] if e is not None and e[0]() is t else PRODUCER_UNKNOWN

    # ---- module calls (capture/tracker.py numbers them) ----------------------------------------
    def remove(self) -> None:
        super().remove()
        # drop the weak references to the model's tensors now: a tensor with a weakref on it cannot
        # be swapped later (module.to_empty() / .to() on tensor subclasses use swap_tensors)
        self.producers = {}

    def skip(self) -> bool:
        # Module calls during backward are activation-checkpoint recomputations: their ops are
        # attributed through the autograd node that runs them, so they add no records.
        return self.phase is BACKWARD or self.thread is not None and _get_ident() != self.thread

    def new_call(self, module, path, depth, call_index, parent, args, kwargs, type_=None):
        call = _Call(module, path, depth, call_index, parent, self.specs.of_call(args, kwargs), type_)
        call.span = (len(self.ops), -1)
        return call

    # The forward hooks: ModuleTracker.enter (with skip, new_call and TrackedCall.__init__ folded in)
    # and ModuleTracker.exit, the same steps in the same order (a module call is the unit of
    # analyze()'s cost, and each Python frame counts). The graph interpreters (exported, TorchScript)
    # call enter/exit, which come to the same records.
    def _pre(self, module, args, kwargs):
        if self.phase is BACKWARD or self.thread is not None and _get_ident() != self.thread:
            return None
        calls, stack = self.calls, self.stack
        idx = len(calls)
        parent = stack[-1] if stack else None
        key = id(module)
        path = self.paths.get(key)
        n = self.ncalls[key]
        call = _Call(module, type(module).__name__ if path is None else path,
                     0 if parent is None else calls[parent].depth + 1, n, parent,
                     self.specs.of_call(args, kwargs), self.types.get(key))
        call.span = (len(self.ops), -1)
        call.index = idx
        self.ncalls[key] = n + 1
        if parent is not None:
            calls[parent].children.append(idx)
        calls.append(call)
        stack.append(idx)
        return None

    def _post(self, module, args, kwargs, output):
        if self.thread is not None and _get_ident() != self.thread:
            return None
        calls, stack = self.calls, self.stack
        while stack and calls[stack[-1]].module is not module:
            stack.pop()
        if not stack:
            return None
        self.exited(calls[stack.pop()], output)
        return None

    def exited(self, call, output) -> None:
        call.span = (call.span[0], len(self.ops) - 1)
        err = sys.exc_info()[1]
        if err is not None and err is not call.ambient:  # the always-called hook of a failed forward
            call.error = err
            return
        ts = [output] if isinstance(output, _Tensor) else list(iter_tensors(output))
        call.outputs = self.specs.of(ts)
        # self.producer(t) for each, inline (a method call per output tensor)
        known = self.producers
        producers = []
        for t in ts:
            e = known.get(id(t))
            producers.append(e[1] if e is not None and e[0]() is t else PRODUCER_UNKNOWN)
        call.output_producers = tuple(producers)

    # ---- op recorder ----------------------------------------------------------------------------
    def _backward_layer(self) -> int:
        node = _compat.current_autograd_node("attributing backward ops to layers")()
        if node is None:
            return 0
        seq = node._sequence_nr()
        if seq == _ACCUMULATE_GRAD_SEQ:
            var = getattr(node, "variable", None)
            return self.param_layer.get(id(var), 0)
        layer = self.seq_cache.get(seq)
        if layer is None:
            i = bisect_right(self.seq_vals, seq)
            layer = self.seq_layers[i] if i < len(self.seq_layers) else 0
            self.seq_cache[seq] = layer
        return layer

    def on_op(self, func, args, kwargs, out, seq) -> None:
        # keyed by id: an OpOverload's __hash__ is a Python method (one more frame per lookup); the
        # entry holds the op itself, so the id stays that op's while the run lasts
        entry = self.cost_cache.get(id(func))
        if entry is None or entry[0] is not func:
            # the analysis's own registry (CostOptions.registry), else the default one
            entry = self.cost_cache[id(func)] = (func, self.options.lookup(func),
                                                 f"{func.namespace}.{func._opname}")
        _, fn, name = entry
        phase = self.phase
        if phase is FORWARD:
            stack = self.stack
            layer = stack[-1] if stack else 0
            if self.track_seq:
                self.seq_vals.append(seq)
                self.seq_layers.append(layer)
        elif phase is BACKWARD:
            layer = self._backward_layer()
        else:  # loss and optimizer ops run outside any module call: the root's
            layer = 0
        # the tensor inputs: positional ones, then those inside list/tuple arguments, then keyword
        # ones (plain loops: a comprehension is one more frame in Python 3.11)
        ins = []
        nested = False
        for a in args:
            if isinstance(a, _Tensor):
                ins.append(a)
            elif isinstance(a, (list, tuple)):
                nested = True
        if nested:
            for a in args:
                if isinstance(a, (list, tuple)):
                    for x in a:
                        if isinstance(x, _Tensor):
                            ins.append(x)
        if kwargs:
            for v in kwargs.values():
                if isinstance(v, _Tensor):
                    ins.append(v)
        if isinstance(out, _Tensor):
            outs = [out]
        else:
            outs = [o for o in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(o, _Tensor)]
        known = self.producers
        producers = []
        for t in ins:
            e = known.get(id(t))
            producers.append(e[1] if e is not None and e[0]() is t else PRODUCER_UNKNOWN)
        window = None
        if fn is None:
            status, costs = "uncounted", _NO_COSTS
        elif fn is FREE:
            status, costs = "free", _NO_COSTS
        else:
            try:
                c = fn(OpCall(func, args, kwargs, out, self.options))
            except Exception:  # a formula that cannot read these arguments: report, never crash
                status, costs = "uncounted", _NO_COSTS
            else:
                if type(c) is not OpCost:  # a user's formula (analyze(costs=...)) gone wrong: say so
                    raise RegistryError(f"the cost formula of {func._schema.name} returned "
                                        f"{type(c).__name__}, not an OpCost")
                status, window = "counted", c.window
                br = c.bytes_read
                if br is None:
                    br = 0
                    for t in ins:
                        br += t.numel() * t.element_size()
                bw = c.bytes_written
                if bw is None:
                    bw = 0
                    for t in outs:
                        bw += t.numel() * t.element_size()
                costs = Costs(int(c.macs), int(c.flops), int(br), int(bw))
        ops = self.ops
        index = len(ops)
        ops.append(OpEvent(index, name, layer, phase, status, costs, tuple(producers), window))
        for o in outs:
            known[id(o)] = (_ref(o), index)
        storage = self.storage
        if storage is not None:
            storage.layer, storage.phase = layer, phase
            # a lift's input is the same logical tensor as its output (a fake run makes a new one)
            fix = FAKE_SIZE_FIXES.get(func) if self.simulated else None
            storage.on_op(() if func._opname.startswith("lift") else ins, outs,
                          fix(args, outs) if fix is not None else None)


def _param_table(modules: list[nn.Module]):
    """How many (module, name) slots hold each param/buffer, and the first module holding it."""
    holders: dict[int, int] = defaultdict(int)
    first_owner: dict[int, int] = {}
    for m in modules:
        for p in m._parameters.values():
            if p is not None:
                holders[id(p)] += 1
                first_owner.setdefault(id(p), id(m))
        for b in m._buffers.values():
            if b is not None:
                holders[id(b)] += 1
                first_owner.setdefault(id(b), id(m))
    return holders, first_owner


def _specs(slots: dict, holders, trainable_default=None, made: dict | None = None) -> tuple[ParamSpec, ...]:
    """ParamSpecs of a module's parameters or buffers. ``made``: specs already made in this build,
    by what fixes one (name, shape, dtype, trainable, shared) -- the blocks of a deep model hold
    the same ones again and again, and a spec is a frozen record."""
    if not slots:      # most modules hold no buffers, and containers and activations no parameters
        return ()
    out = []
    for name, t in slots.items():
        if t is None:
            continue
        trainable = t.requires_grad if trainable_default is None else trainable_default
        shared = holders[id(t)] > 1
        key = None
        if made is not None:
            try:
                key = (name, t.shape, t.dtype, trainable, shared)
                spec = made.get(key)
            except TypeError:     # an unhashable (symbolic) size
                key = spec = None
            if spec is not None:
                out.append(spec)
                continue
        n = int(t.numel())
        spec = ParamSpec(name, tuple(map(int, t.shape)), n, n * t.element_size(), trainable, shared)
        if key is not None:
            made[key] = spec
        out.append(spec)
    return tuple(out)


_NO_KERNEL_ATTR: dict[type, bool] = {}


def _kernel(module: nn.Module):
    cls = type(module)
    plain = _NO_KERNEL_ATTR.get(cls)
    if plain is None:
        # a class with no kernel_size of its own and nn.Module's own attribute lookup: then only the
        # instance can hold one (getattr's miss goes through nn.Module.__getattr__ and an exception,
        # the slow way to learn that a Linear has no kernel)
        plain = _NO_KERNEL_ATTR[cls] = not hasattr(cls, "kernel_size") and cls.__getattr__ is nn.Module.__getattr__
    if plain and "kernel_size" not in module.__dict__ and "kernel_size" not in module._parameters and \
            "kernel_size" not in module._buffers and "kernel_size" not in module._modules:
        return None
    k = getattr(module, "kernel_size", None)
    if k is None:
        return None
    if isinstance(k, int):
        return (k,)
    if isinstance(k, tuple) and all(isinstance(x, int) for x in k):
        return k
    return None


def _subtree_params(model: nn.Module, holders: dict[int, int]) -> dict[int, int]:
    """Unique parameter count of every module's subtree, in one post-order pass. Plain sums are
    exact unless a parameter is shared; only subtrees holding a shared one are recounted."""
    out: dict[int, int] = {}
    shared_below: dict[int, bool] = {}

    def visit(m: nn.Module) -> None:
        if id(m) in out:
            return
        total, shared = 0, False
        for p in m._parameters.values():
            if p is not None:
                total += int(p.numel())
                shared = shared or holders[id(p)] > 1
        for child in m._modules.values():
            if child is not None:
                visit(child)
                total += out[id(child)]
                shared = shared or shared_below[id(child)]
        if shared:
            total = sum(int(p.numel()) for p in m.parameters())
        out[id(m)], shared_below[id(m)] = total, shared

    visit(model)
    return out


def _freeze_layers(cap: Session, model: nn.Module, holders, first_owner):
    subtree = _subtree_params(model, holders)
    layers = []
    called = {id(c.module) for c in cap.calls}
    script = torch.jit.ScriptModule
    made: dict = {}
    for i, c in enumerate(cap.calls):
        m = c.module
        params = _specs(m._parameters, holders, made=made)
        buffers = _specs(m._buffers, holders, trainable_default=False, made=made)
        counted = trainable = 0
        if c.call_index == 0 and (params or isinstance(m, script)):
            # a script module is one layer: it owns the parameters of its whole subtree
            own = _script_subtree_params(m, first_owner, called) if isinstance(m, script) \
                else (p for p in m._parameters.values() if p is not None and first_owner.get(id(p)) == id(m))
            for p in own:
                counted += int(p.numel())
                trainable += int(p.numel()) if p.requires_grad else 0
        # positional, in LayerRecord's field order (index, path, type, depth, call_index, parent,
        # children, inputs, outputs, params, buffers, num_params, trainable_params, subtree_params,
        # kernel_size): keywords cost a dict per record
        layers.append(LayerRecord(
            i, c.path, c.type, c.depth, c.call_index, c.parent, tuple(c.children), c.inputs, c.outputs,
            params, buffers, counted, trainable, subtree.get(id(m), 0), _kernel(m)))
    return layers


def _script_subtree_params(m: nn.Module, first_owner, called: set[int]) -> list[torch.Tensor]:
    """The parameters a script module's layer owns: its own, and those of the submodules inside it
    that are no layer of their own (a scripted child's, run inside TorchScript; the TorchScript
    path records its submodules' calls, and those own their parameters)."""
    inside = {id(sub) for sub in m.modules() if sub is m or id(sub) not in called}
    return [p for p in _unique(m.parameters()) if first_owner.get(id(p)) in inside]


def _forward_error(cap: Session, err: BaseException, phase: str) -> ForwardError:
    failed = [c for c in cap.calls if c.error is err]
    where = max(failed, key=lambda c: c.depth) if failed else None
    what = f"{type(err).__name__}: {err}"
    if where is None:
        return ForwardError(f"the model's {phase} failed outside any submodule: {what}")
    name = f"layer '{where.path}'" if where.path else "the model"
    return ForwardError(
        f"{phase} failed in {name} ({where.type}) called with {describe_inputs(where.inputs)}: {what}",
        path=where.path, module_type=where.type, input_shapes=tuple(s.shape for s in where.inputs))


def swapped_state(model: nn.Module, state: dict[str, torch.Tensor] | None):
    """Run the model with other tensors in place of its parameters and buffers (what
    torch.func.functional_call does), for as long as the context lasts: through backward too, so
    that activation checkpointing recomputes with the swapped tensors, not the model's own."""
    if state is None:
        return contextlib.nullcontext()
    return _compat.reparametrize_module(model, state, tie_weights=True, strict=False)


def empty_like_on(t: torch.Tensor, device) -> torch.Tensor:
    """A tensor with ``t``'s shape, strides and dtype on ``device``, and nothing in it (on meta, or
    under a FakeTensorMode, nothing is allocated). A leaf that requires grad stays one."""
    out = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device)
    return out.requires_grad_(t.requires_grad) if t.is_leaf and t.requires_grad else out


def empty_state(model: nn.Module, device) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Empty copies of the model's parameters and of its buffers, by name, one entry per tensor:
    swapped_state (tie_weights=True) feeds tied names from it."""
    params = {name: empty_like_on(p, device) for name, p in model.named_parameters()}
    buffers = {name: empty_like_on(b, device) for name, b in model.named_buffers()}
    return params, buffers


def grad_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The inputs a backward run is given, so that it differentiates the model and nothing else: an
    input that requires grad but is not a leaf (the output of the caller's own graph) becomes a
    detached leaf that requires grad -- the model's input-gradient work is counted as for a leaf,
    and the caller's graph is neither run backward (its ops recorded as the model's) nor freed, nor
    its leaves' .grad touched. Other inputs are passed as they are; aliases stay aliases."""
    seen: dict[int, torch.Tensor] = {}

    def fix(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in seen:
            seen[id(t)] = t.detach().requires_grad_() if t.requires_grad and not t.is_leaf else t
        return seen[id(t)]

    if not any(t.requires_grad and not t.is_leaf for t in iter_tensors((args, kwargs))):
        return args, kwargs
    return map_tensors(tuple(args), fix), map_tensors(dict(kwargs), fix)


def capture(model: nn.Module, args: tuple, kwargs: dict, *, mode: str = "eval", backward: bool = False,
            on_meta: bool = False, options: CostOptions | None = None) -> tuple[Trace, Any]:
    """Run ``model(*args, **kwargs)`` once under the tracker and recorder; return (Trace, output).

    ``on_meta`` runs a real model with meta copies of its parameters and buffers swapped in, so nothing
    is computed or allocated and the model's own tensors are never touched.
    """
    if mode not in ("eval", "train", "same"):
        raise InputError(f"mode must be 'eval', 'train' or 'same', got {mode!r}")
    options = options or CostOptions()
    named = list(model.named_modules())
    modules = [m for _, m in named]
    # the distinct parameters and buffers before the run, found once for the guard and the dataflow seeds
    held = (held_tensors(modules, "_parameters"), held_tensors(modules, "_buffers"))
    guard = StateGuard(model, modules, (args, kwargs), params=held[0])
    if backward:
        args, kwargs = grad_inputs(args, kwargs)
    cap = Session(model, options, track_seq=backward)
    cap.seed_producers((args, kwargs), held[0] + held[1])
    output = None
    try:
        if mode != "same":
            set_mode(model, modules, mode == "train")
        cap.install(named)
        swap = None
        if on_meta:
            meta_params, meta_buffers = empty_state(model, "meta")
            swap = {**meta_params, **meta_buffers}
        with torch.set_grad_enabled(backward), OpRecorder(cap), swapped_state(model, swap):
            output = run_forward(cap, lambda: model(*args, **kwargs))
            if backward:
                _run_backward(cap, modules, guard, output)
    finally:
        cap.remove()
        guard.restore(rng=cap.rng.touched_global)
    trace = build_trace(cap, model, named, (args, kwargs), output, backward=backward,
                        options={"mode": mode, "causal": options.causal,
                                 "device": "meta" if on_meta else str(model_device(model)),
                                 **({"costs": options.registry.name} if options.registry is not None else {})})
    return trace, output


_TRAIN, _EVAL = nn.Module.train, nn.Module.eval


_SETATTR = nn.Module.__setattr__


def _set_training(m: nn.Module, training: bool) -> None:
    """``m.training = training``. nn.Module.__setattr__ checks the name against the module's
    parameters, submodules and buffers (``training`` can be none of them: register_* refuse a name
    that is already an attribute) and then sets it as object.__setattr__ does: that, in one C call,
    for a class that keeps nn.Module's __setattr__."""
    if type(m).__setattr__ is _SETATTR:
        object.__setattr__(m, "training", training)
    else:
        m.training = training


def set_mode(model: nn.Module, modules: list[nn.Module], training: bool) -> None:
    """``model.train(training)``. Where no module overrides train(), eval() or __setattr__,
    nn.Module.train only sets every module's flag (``modules`` is ``model.modules()``, the modules its
    recursion reaches): the flags are set directly, and only those that change (most are in that
    mode already)."""
    plain = True
    for m in modules:
        cls = type(m)
        if cls.train is not _TRAIN or cls.eval is not _EVAL or cls.__setattr__ is not _SETATTR:
            plain = False
            break
    if not plain:
        if training:
            model.train()
        else:
            model.eval()
        return
    for m in modules:
        if m.training is not training:
            object.__setattr__(m, "training", training)


def dtype_text(model: nn.Module, params: list[torch.Tensor] | None = None) -> str | None:
    """The model's parameter dtypes by share of elements: ``bfloat16`` or ``bfloat16 (98.1%), float32``.
    ``params``: ``held_tensors(list(model.modules()), "_parameters")`` where the caller has it (the
    tensors model.parameters() gives, in its order)."""
    by_dtype: dict[torch.dtype, int] = {}
    for p in model.parameters() if params is None else params:   # each tensor once (parameters() drops repeats)
        by_dtype[p.dtype] = by_dtype.get(p.dtype, 0) + p.numel()
    counts = {str(d).removeprefix("torch."): n for d, n in by_dtype.items()}
    if not counts:
        return None
    total = sum(counts.values()) or 1
    order = sorted(counts, key=counts.get, reverse=True)
    if len(order) == 1:
        return order[0]
    return f"{order[0]} ({100 * counts[order[0]] / total:.1f}%), " + ", ".join(order[1:])


def build_trace(cap: Session, model: nn.Module, named: list[tuple[str, nn.Module]], inputs: Any,
                output: Any, *, backward: bool, options: dict) -> Trace:
    """Freeze what one capture saw into a Trace (its options say the model's dtypes too). ``named``
    is ``list(model.named_modules())``. Parameters and buffers are read now, after the run: a forward
    may register a buffer (a cache made on first use)."""
    modules = [m for _, m in named]
    params = held_tensors(modules, "_parameters")
    buffers = held_tensors(modules, "_buffers")
    # an eager module's parameters() are these, in this order; a script module lists its own
    options = {**options, "model_dtype": options["model_dtype"] if "model_dtype" in options
               else dtype_text(model, None if isinstance(model, torch.jit.ScriptModule) else params)}
    holders, first_owner = _param_table(modules)
    layers = _freeze_layers(cap, model, holders, first_owner)
    if not layers:
        raise InputError("the model's forward never ran as a module call; nothing to analyse")
    # containers without a forward of their own (ModuleList, ModuleDict) are never called by design
    uncalled = tuple(p or "(root)" for p, m in tracked_modules(named)
                     if cap.ncalls.get(id(m), 0) == 0 and own_forward(m))
    # the parameters' and buffers' sums in one pass each (each tensor's numel read once)
    p_numel = p_trainable = p_shared = p_bytes = 0
    for p in params:
        n = int(p.numel())
        p_numel += n
        if p.requires_grad:
            p_trainable += n
        if holders[id(p)] > 1:
            p_shared += n
        p_bytes += n * p.element_size()
    b_numel = b_bytes = 0
    for b in buffers:
        n = int(b.numel())
        b_numel += n
        b_bytes += n * b.element_size()
    in_bytes = sum(t.numel() * t.element_size() for t in _unique(iter_tensors(inputs)))
    out_bytes = sum(t.numel() * t.element_size() for t in _unique(iter_tensors(output)))
    return Trace(
        model_name=type(model).__name__,
        layers=tuple(layers),
        ops=tuple(cap.ops),
        layer_outputs=tuple(c.output_producers for c in cap.calls),
        param_numel=p_numel, trainable_numel=p_trainable, shared_numel=p_shared, param_bytes=p_bytes,
        buffer_numel=b_numel, buffer_bytes=b_bytes,
        input_bytes=in_bytes, output_bytes=out_bytes, uncalled_modules=uncalled, backward=backward,
        options=options,
    )


def own_forward(m: nn.Module) -> bool:
    """Whether the module defines a forward (a ModuleList does not); script modules say so in C++."""
    if isinstance(m, torch.jit.ScriptModule):
        return m._c._has_method("forward")
    return type(m).forward is not nn.Module.forward


def held_tensors(modules: list[nn.Module], slot: str) -> list[torch.Tensor]:
    """The distinct tensors the modules hold directly in ``slot`` ("_parameters" or "_buffers")."""
    out, seen = [], set()
    for m in modules:                      # _unique over the slots, as plain loops (no generators)
        for t in getattr(m, slot).values():
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
    return out


def _unique(tensors):
    seen = set()
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            yield t


def run_forward(cap: Session, call) -> Any:
    """``call()`` (the model's forward) with a failure turned into a ForwardError naming the layer."""
    try:
        return call()
    except LayerscopeError:
        raise
    except Exception as e:
        raise _forward_error(cap, e, "forward") from e


def run_backward(cap: Session, modules: list[nn.Module], backward) -> None:
    """``backward()`` in the BACKWARD phase, ops attributed to the forward calls that made their
    autograd nodes; AccumulateGrad nodes to the module call that owns the parameter."""
    first_call: dict[int, int] = {}
    for i, c in enumerate(cap.calls):
        first_call.setdefault(id(c.module), i)
    for m in modules:
        for p in m._parameters.values():
            if p is not None and id(m) in first_call:
                cap.param_layer.setdefault(id(p), first_call[id(m)])
    cap.phase = BACKWARD
    try:
        backward()
    except LayerscopeError:
        raise
    except Exception as e:
        raise ForwardError(f"backward failed: {type(e).__name__}: {e}") from e
    finally:
        cap.phase = FORWARD


def _run_backward(cap: Session, modules: list[nn.Module], guard: StateGuard, output: Any) -> None:
    outs = [t for t in iter_tensors(output) if t.requires_grad and (t.is_floating_point() or t.is_complex())]
    if not outs:
        if not any(True for _ in iter_tensors(output)):
            raise InputError(f"backward=True but the model's output ({type(output).__name__}) holds no "
                             "tensor: nothing to differentiate (a backbone with no out_features chosen?)")
        raise InputError("backward=True but no output of the model requires grad "
                         "(are all parameters frozen, or does forward run under no_grad?)")
    for p, _, _ in guard.params:
        p.grad = None  # the guard restores the user's gradients (params and inputs) afterwards
    cap.paused = True
    seeds = [torch.ones_like(t) for t in outs]
    cap.paused = False
    run_backward(cap, modules, lambda: torch.autograd.backward(outs, seeds))
