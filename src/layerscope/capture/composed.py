"""A simulated step of a model with a run of identical blocks, from five of them: the shorter model's
step widened to the whole model's (capture/compose.py), then the loop check.

The loop check. compose.py sees the five blocks that ran; the code around them (the loop over the
list, and whatever it does at each place) ran five times, not ``n``. So the whole model's forward runs
once more with a stand-in at every place of the run (blocks.loop_check_model: it returns new tensors
shaped as the repeated block's output and runs no block), and then:
- outside the blocks, the composed trace and this forward show the same module calls (path, class,
  input and output shapes) and the same ops in the same order, and every place the same input and
  output shapes;
- every place is called as the kept blocks were (``blocks.call_signature``: the arguments, tensors by
  spec and other values by value, grad mode, autocast, a checkpoint's saved-tensor hooks): the first
  place as the first block, the last as the last, every place between as the three middle ones,
  which must agree;
- the loop keeps every place's output equally long (from the next place's first op to the death of
  its storages), so that a loop keeping some outputs only shows.
A loop that does something at some place only (``if i == 5``, a block checkpointed or called with
other arguments there, an output kept from chosen places) fails one of them and the whole model is
simulated. The check runs the forward only (a backward follows the forward's graph), on the same fake
tensors, autocast and attention routing. Not seen: state a block keeps where the attribute tracker
cannot see it (a dict keyed by ``id(self)``, a global counter), read in the forward.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from ..trace import FORWARD, Trace
from .blocks import KEPT, REP, Truncated, find_run, loop_check_model, module_state, restore_module_state, truncated
from .regions import NotComposable
from .spec import StepSpec, StepWatch
from .step import StepRun, run_steps
from .storage import StorageTracker

__all__ = ["run_step", "composed_steps", "NotComposable"]


def run_step(spec: StepSpec, watch: Callable[[], StepWatch],
             new_router: Callable[[], object] | None = None) -> tuple[StepRun, StepWatch]:
    """Capture's one step function: ``spec`` run under a fresh ``watch()`` (its tracker, router,
    progress). A simulation with ``spec.compose`` is composed from five blocks where the model has a
    run of identical blocks and the composition can stand for the whole model's step; where it cannot
    (NotComposable, or anything else it raises) the whole model is simulated instead, under a fresh
    watch, and raises the error if it is the model's. Returns the run and the watch it ran under (its
    router's notes are the run's). ``new_router()``: a fresh SdpaRouter like the watch's, for the loop
    check."""
    if spec.simulate and spec.compose:
        w = watch()
        try:
            run = composed_steps(spec, w, check_router=new_router() if new_router is not None else None)
        except Exception:   # noqa: BLE001 - NotComposable, or anything: the whole model is simulated
            run = None      # instead, and raises the error if it is the model's
        w.done()
        if run is not None:
            return run, w
    w = watch()
    try:
        return run_steps(spec, w), w
    finally:
        w.done()


def composed_steps(spec: StepSpec, watch: StepWatch, *, check_router=None) -> StepRun | None:
    """``run_steps(spec, watch)`` (a simulation) composed from five blocks, or None where the model has
    no run of identical blocks to compose. NotComposable: the composition cannot stand for the whole
    model's step (simulate it whole). ``check_router``: a fresh SdpaRouter like the step's, for the loop
    check."""
    model = spec.model
    blocks = find_run(model)
    if blocks is None:
        return None
    tr = truncated(model, blocks)
    # what the forward writes besides tensors (a counter, a cache, the hooks transformers installs on
    # its first call) is put back in the user's modules; where it wrote anything, the blocks left out
    # would have written it too: the whole model is simulated
    before = module_state([*model.modules(), *tr.copies])
    try:
        run = run_steps(spec, watch, compose=tr)
        _check_loop(tr, run, spec, check_router)
    finally:
        changed = restore_module_state(before)
    if changed:
        raise NotComposable(f"the forward wrote {changed[0]!r} in a module")
    return run


def _zero_loss(_out):
    return torch.zeros((), requires_grad=True)


def _check_loop(tr: Truncated, run: StepRun, spec: StepSpec, router) -> None:
    shared: dict = {}
    tracker = StorageTracker()

    def lookup(t):
        try:
            return tracker.live.get(id(t.untyped_storage()))
        except (RuntimeError, NotImplementedError, TypeError):
            return None
    shared["lookup"] = lookup
    if tr.out_spec is None or len(tr.sigs) != KEPT:
        raise NotComposable("the blocks were not all called")
    check = loop_check_model(tr, shared)
    training = spec.training
    check_spec = dataclasses.replace(spec, model=check, optimizer=None, loss_fn=_zero_loss if training else None,
                                     steps=1, accumulation=1, keep_output=True, costs=None, placement=None,
                                     pipeline=None, compose=False)
    seen = run_steps(check_spec, StepWatch(tracker=tracker, attention=router))
    why = tr.read_problem()
    if why is not None:
        raise NotComposable(why)
    if _outside(tr, run.passes[0].trace) != _outside(tr, seen.passes[0].trace):
        raise NotComposable("the code around the blocks does something at some places only")
    n = tr.run.count
    # objects by identity, renumbered in the order each run first passed them: the two runs make their
    # own (transformers' KV cache, made in each forward) and must pass them alike
    ran = dict(zip(sorted(tr.sigs), _renumbered([tr.sigs[b] for b in sorted(tr.sigs)])))
    sigs = dict(zip(sorted(shared["sigs"]), _renumbered([shared["sigs"][i] for i in sorted(shared["sigs"])])))
    if len(sigs) != n or sigs[0] != ran[0] or sigs[n - 1] != ran[KEPT - 1] or \
            any(ran[b] != ran[REP] for b in range(1, KEPT - 1)) or any(sigs[i] != ran[REP] for i in range(1, n - 1)):
        raise NotComposable("the loop calls the blocks differently at some places")
    # how long the loop keeps each place's output: from the next place's first op to its storages' deaths
    trace = seen.passes[0].trace
    pre = tr.run.path + "." if tr.run.path else ""
    first = {r.path: seen.passes[0].spans[r.index][0] for r in trace.layers}
    kept = set()
    for i in range(n - 1):
        nxt = first.get(f"{pre}{tr.run.start + i + 1}")
        outs = shared["outs"].get(i)
        if nxt is None or outs is None or any(b is None for b in outs):
            raise NotComposable("the loop check could not follow a place's output")
        kept.add(tuple(None if b.free is None else b.free - nxt for b in outs))
    if len(kept) > 1:
        raise NotComposable("the loop keeps the output of some places longer than of others")


def _renumbered(sigs: list) -> list:
    """Call signatures (capture/blocks.call_signature) with every object given by identity renumbered in
    the order of its first appearance."""
    seen: dict[int, int] = {}

    def one(v):
        if isinstance(v, tuple):
            if len(v) == 2 and v[0] == "id" and isinstance(v[1], int):
                return "object", seen.setdefault(v[1], len(seen))
            return tuple(one(x) for x in v)
        return v
    return [one(s) for s in sigs]


def _outside(tr: Truncated, trace: Trace):
    """What the loop check compares (see the module's docstring)."""
    run = tr.run
    pre = run.path + "." if run.path else ""
    places = {f"{pre}{run.start + i}" for i in range(run.count)}

    def inside(path: str) -> bool:
        if not path.startswith(pre):
            return False
        head = path[len(pre):].partition(".")[0]
        return f"{pre}{head}" in places
    layers = trace.layers
    calls = tuple((r.path, r.type, r.inputs, r.outputs) if not inside(r.path) else (r.path, r.inputs, r.outputs)
                  for r in layers if not inside(r.path) or r.path in places)
    ops = tuple(o.op for o in trace.ops if o.phase == FORWARD and not inside(layers[o.layer].path))
    return calls, ops
