"""One run of the model under a module tracker and an aten op recorder.

* The tracker (capture/tracker.py) is a forward pre-hook and an always-called forward hook on every
  module. It keeps the stack of module calls (path + call index); the Session's call records add the
  input/output shapes of each call and name the call that failed when the forward raises. Hooks are
  per module (no global hooks), ignore other threads, and are removed in ``finally``.
* The recorder (capture/recorder.py) is a TorchDispatchMode: it sees every aten op after autograd
  has decomposed composite ops; the Session prices it with the cost registry and attributes it to
  the innermost running module call.
* Backward attribution is exact, not heuristic (capture/backward.py): during the forward the
  Session notes the autograd sequence number at each op; during backward,
  ``torch._C._current_autograd_node()`` names the node being run, and its sequence number maps back
  to the forward op (and so the module call) that created it. AccumulateGrad nodes map to the module
  that owns the parameter.
* A StateGuard (capture/state.py) snapshots what a run can change and restores it, also when the
  model raises; capture/records.py freezes what the run saw into a Trace.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from typing import Any

import torch
from torch import nn

from .. import _compat
from ..costs import CostOptions, OpCall, OpCost
from ..costs.registry import FREE
from ..errors import ForwardError, InputError, LayerscopeError, RegistryError
from ..trace import (BACKWARD, FORWARD, OPTIMIZER, PRODUCER_INPUT, PRODUCER_STATE, PRODUCER_UNKNOWN, Costs, OpEvent,
                     Trace)
from .backward import SeqOwners
from .cost_keys import SHAPE_ONLY, cost_key
from .inputs import SpecCache, iter_tensors
from .known import KnownIndexError
from .records import build_trace
from .recorder import FAKE_SIZE_FIXES, OpRecorder
from .rng import PrivateRNG
from .state import (StateGuard, describe_inputs, empty_state, grad_inputs, held_tensors, model_device, set_mode,
                    swapped_state)
from .tracker import ModuleTracker, TrackedCall, module_type, named_modules, plain_call

__all__ = ["Session", "capture", "run_forward", "run_backward"]

_NO_COSTS = Costs()   # uncounted and free ops (a frozen record: one object serves them all)
_Tensor = torch.Tensor
_ref = weakref.ref


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


class Session:
    """One run's module calls (it holds a ModuleTracker whose records are _Calls) and the op
    recorder's state (ops, dataflow, backward attribution, cost cache)."""

    def __init__(self, model: nn.Module, options: CostOptions, track_seq: bool, storage=None,
                 simulated: bool = False, rng: PrivateRNG | None = None, known=None) -> None:
        tracker = self.tracker = ModuleTracker(new_call=self._new_call)
        tracker.register_user_hooks(post_fw=self._exited)
        # the tracker's own containers, not copies: the op recorder reads the open calls on every op
        self.calls, self.stack, self.ncalls, self.paths = tracker.calls, tracker.stack, tracker.ncalls, tracker.paths
        self.enter, self.exit = tracker.enter, tracker.exit   # the graph interpreters drive it by hand
        self.model = model
        # random ops draw from a private generator (capture/rng.py), never from torch's global one
        self.rng = rng if rng is not None else PrivateRNG()
        self.storage = storage      # a StorageTracker when memory is tracked
        self.simulated = simulated  # running on fake tensors
        self.known = known          # a KnownValues where tensors have no values (capture/known.py)
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
        self.meta_log = None        # what a meta run read without values (capture/simulation.py note_meta_read)
        # backward attribution (capture/backward.py), noted at every forward op: its lists appended
        # to directly in on_op
        self.owners = SeqOwners()
        self.seq_vals, self.seq_layers = self.owners.seqs, self.owners.owners
        self.cost_cache: dict[Any, Any] = {}
        self.costs_made: dict[tuple, Costs] = {}   # each op's Costs by its value (on_op)
        self.priced: dict[tuple, tuple] = {}       # a shape-only op's cost by its call's key (cost_keys.py)

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

    # ---- module calls (the tracker numbers them; these are its factory and forward callback) ------
    def install(self, named: list[tuple[str, nn.Module]]) -> None:
        self.tracker.install(named)

    def remove(self) -> None:
        self.tracker.remove()
        # drop the weak references to the model's tensors now: a tensor with a weakref on it cannot
        # be swapped later (module.to_empty() / .to() on tensor subclasses use swap_tensors)
        self.producers = {}

    def close(self) -> None:
        """Done with the run (its trace built): the tracker lets go of this session's callbacks. The
        session and its tracker hold each other (the tracker calls back into ``_new_call`` and
        ``_exited``), and that cycle kept the whole run -- every call record, and through them the
        analysed modules (an analysis's copy of the tree: capture/shadow.py) -- alive until the
        cyclic garbage collector found it: 37,000 objects a 1,000-block MLP's analyze() left to it,
        walked by the next collections. Without the cycle they go when the last reference does."""
        tracker = self.tracker
        tracker.new_call = plain_call
        tracker.pre_fw = tracker.post_fw = tracker.pre_bw = tracker.post_bw = ()

    def _new_call(self, module, path, depth, call_index, parent, args, kwargs, type_=None):
        # Module calls during backward are activation-checkpoint recomputations: their ops are
        # attributed through the autograd node that runs them, so they add no records.
        if self.phase is BACKWARD:
            return None
        call = _Call(module, path, depth, call_index, parent, self.specs.of_call(args, kwargs), type_)
        call.span = (len(self.ops), -1)
        return call

    def _exited(self, call, output) -> None:
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
        return 0 if node is None else self.owners.of_node(node, 0)

    def on_op(self, func, args, kwargs, out, seq) -> None:
        # keyed by id: an OpOverload's __hash__ is a Python method (one more frame per lookup); the
        # entry holds the op itself, so the id stays that op's while the run lasts
        entry = self.cost_cache.get(id(func))
        if entry is None or entry[0] is not func:
            # the analysis's own registry (CostOptions.registry), else the default one
            # (and whether its cost is fixed by its arguments' shapes: capture/cost_keys.py)
            entry = self.cost_cache[id(func)] = (func, self.options.lookup(func),
                                                 f"{func.namespace}.{func._opname}",
                                                 self.options.registry is None and self.known is None and
                                                 func.namespace == "aten" and func._opname in SHAPE_ONLY)
        _, fn, name, keyed = entry
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
        window, executed, attention = None, 1.0, None
        key = cost_key(func, args, kwargs, outs) if keyed else None
        priced = self.priced.get(key) if key is not None else None
        if priced is not None:    # the same op on the same shapes and arguments earlier in the run
            status, costs, window, executed, attention = priced
        elif fn is None:
            status, costs = "uncounted", _NO_COSTS
        elif fn is FREE:
            status, costs = "free", _NO_COSTS
        else:
            try:
                c = fn(OpCall(func, args, kwargs, out, self.options,
                              self.known.values_list if self.known is not None else None))
            except Exception:  # a formula that cannot read these arguments: report, never crash
                status, costs = "uncounted", _NO_COSTS
            else:
                if type(c) is not OpCost:  # a user's formula (analyze(costs=...)) gone wrong: say so
                    raise RegistryError(f"the cost formula of {func._schema.name} returned "
                                        f"{type(c).__name__}, not an OpCost")
                status, window, executed, attention = "counted", c.window, c.executed, c.attention
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
                # one frozen record per distinct value (a deep model's blocks repeat the same few):
                # fewer objects made, and fewer for the garbage collector to walk once it runs again
                value = (int(c.macs), int(c.flops), int(br), int(bw))
                costs = self.costs_made.get(value)
                if costs is None:
                    costs = self.costs_made[value] = Costs(*value)
                if key is not None:
                    self.priced[key] = (status, costs, window, executed, attention)
        ops = self.ops
        index = len(ops)
        ops.append(OpEvent(index, name, layer, phase, status, costs, tuple(producers), window, executed, attention))
        for o in outs:
            known[id(o)] = (_ref(o), index)
        storage = self.storage
        if storage is not None:
            storage.layer, storage.phase, storage.op_name = layer, phase, name
            # a checkpointed block's recompute (a forward run again in the backward)
            storage.recomputing = phase is BACKWARD and _compat.in_recompute()
            # a lift's input is the same logical tensor as its output (a fake run makes a new one)
            fix = FAKE_SIZE_FIXES.get(func) if self.simulated else None
            kernels = storage.kernels
            if kernels is not None:             # a CUDA target (costs/cuda_scratch.py)
                nbytes = kernels.scratch(name, ins)
                if nbytes:
                    storage.transient(nbytes)       # alive during this op only, beside its outputs
                if phase is OPTIMIZER and name == "aten.lift_fresh":
                    for o in outs:
                        storage.elsewhere(o)
                resized = kernels.resized(name, ins, outs)
                if resized is not None:
                    storage.resize_block(*resized)
            storage.on_op(() if func._opname.startswith("lift") else ins, outs,
                          fix(args, outs) if fix is not None else None)
            if storage.workspace_of is not None:
                nbytes = storage.workspace_of(name)
                if nbytes:
                    # the backward runs on the autograd engine's device thread: a handle of its own
                    storage.workspace("cuBLAS workspace", "backward" if phase is BACKWARD else "forward", nbytes)


def _forward_error(cap: Session, err: BaseException, phase: str) -> ForwardError:
    failed = [c for c in cap.calls if c.error is err]
    where = max(failed, key=lambda c: c.depth) if failed else None
    what = f"{type(err).__name__}: {err}"
    if isinstance(err, KnownIndexError):     # seen in values carried beside meta/fake tensors
        what = f"IndexError: {err} (the index values are known here: the real run fails too)"
    if where is None:
        return ForwardError(f"the model's {phase} failed outside any submodule: {what}")
    name = f"layer '{where.path}'" if where.path else "the model"
    return ForwardError(
        f"{phase} failed in {name} ({where.type}) called with {describe_inputs(where.inputs)}: {what}",
        path=where.path, module_type=where.type, input_shapes=tuple(s.shape for s in where.inputs))



def capture(model: nn.Module, args: tuple, kwargs: dict, *, mode: str = "eval", backward: bool = False,
            on_meta: bool = False, options: CostOptions | None = None, known=None,
            attention=None) -> tuple[Trace, Any]:
    """Run ``model(*args, **kwargs)`` once under the tracker and recorder; return (Trace, output).

    ``on_meta`` runs a real model with meta copies of its parameters and buffers swapped in, so nothing
    is computed or allocated and the model's own tensors are never touched. ``attention`` (an
    SdpaRouter, capture/attention.py) runs SDPA as a GPU target would, in the forward.
    """
    if mode not in ("eval", "train", "same"):
        raise InputError(f"mode must be 'eval', 'train' or 'same', got {mode!r}")
    options = options or CostOptions()
    named = named_modules(model)
    modules = [m for _, m in named]
    # the distinct parameters and buffers before the run, found once for the guard and the dataflow seeds
    held = (held_tensors(modules, "_parameters"), held_tensors(modules, "_buffers"))
    guard = StateGuard(model, modules, (args, kwargs), params=held[0])
    if backward:
        args, kwargs = grad_inputs(args, kwargs)
    cap = Session(model, options, track_seq=backward, known=known)
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
            with attention.mode() if attention is not None else contextlib.nullcontext():
                output = run_forward(cap, lambda: model(*args, **kwargs))
            if backward:
                _run_backward(cap, modules, guard, output, attention)
    finally:
        cap.remove()
        guard.restore(rng=cap.rng.touched_global)
    trace = build_trace(cap, model, named, (args, kwargs), output, backward=backward,
                        options={"mode": mode, "causal": options.causal,
                                 "device": "meta" if on_meta else str(model_device(model)),
                                 **({"costs": options.registry.name} if options.registry is not None else {}),
                                 **({"gpu": attention.gpu.name, "attention": attention.forced}
                                    if attention is not None else {}),
                                 **({"notes": tuple(cap.meta_log.notes())} if cap.meta_log is not None else {})})
    cap.close()
    return trace, output



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
                cap.owners.params.setdefault(id(p), first_call[id(m)])
    cap.phase = BACKWARD
    try:
        backward()
    except LayerscopeError:
        raise
    except Exception as e:
        raise ForwardError(f"backward failed: {type(e).__name__}: {e}") from e
    finally:
        cap.phase = FORWARD


def _run_backward(cap: Session, modules: list[nn.Module], guard: StateGuard, output: Any, attention=None) -> None:
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
    run_backward(cap, modules, lambda: torch.autograd.backward(outs, seeds) if attention is None else
                 attention.backward(outs, seeds))
