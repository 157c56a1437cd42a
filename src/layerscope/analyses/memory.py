"""Memory analysis: pure functions of the storage blocks and traces of a tracked step run.

A block is alive during op ``t`` when ``alloc <= t <= free`` (``free`` is the last op that ran
before the storage died). So the live bytes "during" an op count its inputs and its outputs at
once, as the allocator holds them, and the peak is the largest such sum.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from ..capture.storage import CATEGORIES
from ..trace import BACKWARD

if TYPE_CHECKING:
    from ..capture.step import StepRun

__all__ = ["memory_results", "live_bytes", "layer_at", "CallMemory", "MemoryLayer", "PhaseSpan", "StepMemory", "Marker",
           "Timeline"]


@dataclass(frozen=True, slots=True)
class CallMemory:
    """Live bytes (all categories) when a module call starts, when it ends, and the most in between."""

    entry: int
    exit: int
    peak: int


@dataclass(frozen=True, slots=True)
class MemoryLayer:
    """One module call of the last pass. ``*_bytes`` are the call's own; ``*_total`` its subtree's."""

    index: int
    path: str
    type: str
    depth: int
    call_index: int
    parent: int | None
    children: tuple[int, ...]
    input_bytes: int               # bytes of the tensors handed to the call
    saved_bytes: int               # activations this call saved for backward
    param_bytes: int               # parameters it owns (first call of the first owner)
    grad_bytes: int
    optimizer_bytes: int
    saved_total: int
    param_total: int
    grad_total: int
    optimizer_total: int
    forward: CallMemory | None
    backward: CallMemory | None
    first_op: int = 0              # the global op index at which the call began
    # the storages this call itself saved for backward: (global op index of the allocation, bytes)
    saved_blocks: tuple[tuple[int, int], ...] = ()
    # its output tensors: (global op index that produced it, bytes)
    output_allocs: tuple[tuple[int, int], ...] = ()

    @property
    def name(self) -> str:
        return self.path or "(root)"

    @property
    def total(self) -> int:
        """Subtree bytes of saved activations, parameters, gradients and optimizer state."""
        return self.saved_total + self.param_total + self.grad_total + self.optimizer_total


@dataclass(frozen=True, slots=True)
class PhaseSpan:
    step: int
    phase: str                     # forward, loss, backward, optimizer
    first_op: int
    last_op: int
    peak_bytes: int


@dataclass(frozen=True, slots=True)
class StepMemory:
    step: int                      # 0-based
    peak_bytes: int
    peak_op: int                   # global op index of the peak
    peak_phase: str
    peak_layer: str                # module path running at the peak ("" root, None outside the model)
    breakdown: dict                # category -> live bytes at the peak
    start_bytes: int               # live before the step's first op
    end_bytes: int                 # live after its last op
    phases: tuple[PhaseSpan, ...]


@dataclass(frozen=True, slots=True)
class Marker:
    kind: str                      # "step", "phase" or "module"
    label: str
    first_op: int
    last_op: int


@dataclass(frozen=True, slots=True)
class Timeline:
    """Live bytes per category after each op (global op index), with phase and module markers."""

    categories: tuple[str, ...]
    bytes: tuple[tuple[int, ...], ...]   # per category, per op
    step: tuple[int, ...]                # per op
    phase: tuple[str, ...]               # per op
    markers: tuple[Marker, ...]

    @property
    def total(self) -> tuple[int, ...]:
        return tuple(sum(col) for col in zip(*self.bytes)) if self.bytes and self.bytes[0] else ()

    def __len__(self) -> int:
        return len(self.step)



_ACTIVATION = CATEGORIES.index("activation")
_OUTPUT = CATEGORIES.index("output")


def live_bytes(blocks, n_ops: int, groups: int = len(CATEGORIES), group_of=None):
    """(during, allocs_at, frees_at): ``during[c][t]`` live bytes of category c during op t; per-op
    totals of bytes allocated at t and freed right after t. ``groups``/``group_of(block)``: other
    groups than the categories (parallel/: the parts of a rank's memory). Plain Python (no tensors),
    so it runs the same inside a user's FakeTensorMode."""
    n = max(n_ops, 1)
    diff = [[0] * (n + 1) for _ in range(groups)]
    allocs = [0] * n
    frees = [0] * n
    for b in blocks:
        a = max(b.alloc, 0)
        f = n - 1 if b.free is None else b.free
        if f < a or not b.nbytes:
            continue
        row = diff[b.category if group_of is None else group_of(b)]
        row[a] += b.nbytes
        row[f + 1] -= b.nbytes
        if b.alloc >= 0:
            allocs[a] += b.nbytes
        if b.free is not None:
            frees[f] += b.nbytes
    during = [list(accumulate(row[:n])) for row in diff]
    return during, allocs, frees


def layer_at(run: "StepRun", t: int) -> str | None:
    """The module path running at global op ``t`` ("" the root), or None outside every pass."""
    for p in run.passes:
        if p.offset <= t < p.offset + len(p.trace.ops):
            return p.trace.layers[p.trace.ops[t - p.offset].layer].path
    return None


def memory_results(run: "StepRun", model, *, options: dict, measured=None, notes=()) -> dict[str, Any]:
    tracker = run.tracker
    n = tracker.clock + 1
    during, allocs, frees = live_bytes(tracker.blocks, n)
    total = [sum(col) for col in zip(*during)]

    # which pass / phase / layer each global op belongs to
    op_step = [0] * n
    op_phase = ["optimizer"] * n
    for step, phase, first, last in run.phase_ranges:
        for t in range(first, min(last, n - 1) + 1):
            op_step[t] = step
            op_phase[t] = phase

    static = {c: 0 for c in CATEGORIES}
    for b in tracker.blocks:
        if b.alloc < 0 and (b.free is None or b.free >= 0):
            static[CATEGORIES[b.category]] += b.nbytes

    steps = []
    for i, (first, last) in enumerate(run.step_ranges):
        if last < first:
            # a step that ran no op (a model returning its input): what is live where it would have run
            # (the parameters, buffers and inputs, when nothing ran before) is its peak, never 0 and
            # never no step at all (a report without steps had no peak to show)
            t = max(min(first - 1, len(total) - 1), 0)
            steps.append(StepMemory(step=i, peak_bytes=total[t], peak_op=t, peak_phase="forward", peak_layer=None,
                                    breakdown={c: during[k][t] for k, c in enumerate(CATEGORIES)},
                                    start_bytes=total[t], end_bytes=total[t],
                                    phases=(PhaseSpan(i, "forward", t, t, total[t]),)))
            continue
        t = max(range(first, last + 1), key=total.__getitem__)  # the first op at the peak
        phases = tuple(PhaseSpan(s, ph, a, z, max(total[a:z + 1]) if z >= a else 0)
                       for s, ph, a, z in run.phase_ranges if s == i)
        steps.append(StepMemory(
            step=i, peak_bytes=total[t], peak_op=t, peak_phase=op_phase[t], peak_layer=layer_at(run, t),
            breakdown={c: during[k][t] for k, c in enumerate(CATEGORIES)},
            start_bytes=total[first] - allocs[first], end_bytes=total[last] - frees[last],
            phases=phases))

    last_pass = run.passes[-1]
    layers = _layers(run, last_pass, total, allocs, frees)
    markers = [Marker("step", f"step {i + 1}", a, z) for i, (a, z) in enumerate(run.step_ranges)]
    markers += [Marker("phase", ph, a, z) for _, ph, a, z in run.phase_ranges]
    for p in run.passes:
        for rec, (a, z) in zip(p.trace.layers, p.spans):
            if rec.depth == 1:
                markers.append(Marker("module", rec.path, a, z))
    timeline = Timeline(categories=CATEGORIES, bytes=tuple(tuple(row) for row in during),
                        step=tuple(op_step), phase=tuple(op_phase), markers=tuple(markers))
    saved = sum(r.saved_bytes for r in layers)
    totals = {
        "peak_bytes": max((s.peak_bytes for s in steps), default=0),
        "parameter_bytes": sum(run.param_bytes.values()),
        "buffer_bytes": static["buffer"],
        "input_bytes": static["input"],
        "gradient_bytes": sum(run.grad_bytes.values()),
        "optimizer_bytes": sum(run.optimizer_bytes.values()) + run.optimizer_other_bytes,
        "optimizer_unowned_bytes": run.optimizer_other_bytes,
        "saved_activation_bytes": saved,
        # the last pass's model output (the breakdown only has it when the peak falls while it lives)
        "output_bytes": sum(b.nbytes for b in tracker.blocks
                            if b.category == _OUTPUT and b.pass_index == len(run.passes) - 1),
        # what the last pass's loss saved for its backward (not counted as any layer's activations)
        "loss_saved_bytes": _loss_saved(run),
    }
    return dict(model_name=type(model).__name__, options=options, steps=tuple(steps),
                static=static, totals=totals, layers=layers, timeline=timeline,
                trace=last_pass.trace, measured=measured, notes=tuple(notes), model=model)


def _call_memory(first: int, last: int, total, allocs, frees) -> CallMemory | None:
    if last < first:
        return None
    return CallMemory(entry=total[first] - allocs[first], exit=total[last] - frees[last],
                      peak=max(total[first:last + 1]))


def _in_loss(run: "StepRun"):
    return [(a, z) for _, ph, a, z in run.phase_ranges if ph == "loss"]


def _loss_saved(run: "StepRun") -> int:
    last = len(run.passes) - 1
    spans = _in_loss(run)
    return sum(b.nbytes for b in run.tracker.blocks
               if b.saved_by is not None and b.saved_by[0] == last and b.category == _ACTIVATION
               and any(a <= b.alloc <= z for a, z in spans))


def _layers(run: "StepRun", last_pass, total, allocs, frees) -> tuple[MemoryLayer, ...]:
    trace = last_pass.trace
    recs = trace.layers
    k = len(recs)
    pass_index = len(run.passes) - 1
    saved = [0] * k
    # what the loss saves for its backward is the loss's, not the model's (root) call's
    in_loss = _in_loss(run)
    blocks: list[list[tuple[int, int]]] = [[] for _ in range(k)]
    for b in run.tracker.blocks:
        if b.saved_by is not None and b.saved_by[0] == pass_index and b.category == _ACTIVATION \
                and not any(a <= b.alloc <= z for a, z in in_loss):
            saved[b.saved_by[1]] += b.nbytes
            blocks[b.saved_by[1]].append((b.alloc, b.nbytes))
    # owned params / grads / optimizer state: by the owning module's first call
    first_call: dict[str, int] = {}
    for r in recs:
        first_call.setdefault(r.path, r.index)
    params, grads, opt = [0] * k, [0] * k, [0] * k
    for name, nbytes in run.param_bytes.items():
        owner = first_call.get(name.rpartition(".")[0], 0)
        params[owner] += nbytes
        grads[owner] += run.grad_bytes.get(name, 0)
        opt[owner] += run.optimizer_bytes.get(name, 0)
    # backward spans: the ops autograd ran for each call's subtree
    lo, hi = [None] * k, [None] * k
    for op in trace.ops:
        if op.phase == BACKWARD:
            t = last_pass.offset + op.index
            i = op.layer
            lo[i] = t if lo[i] is None else min(lo[i], t)
            hi[i] = t if hi[i] is None else max(hi[i], t)
    subtree = [list(x) for x in zip(saved, params, grads, opt)]
    for r in reversed(recs):
        p = r.parent
        if p is None:
            continue
        for j in range(4):
            subtree[p][j] += subtree[r.index][j]
        if lo[r.index] is not None:
            lo[p] = lo[r.index] if lo[p] is None else min(lo[p], lo[r.index])
            hi[p] = hi[r.index] if hi[p] is None else max(hi[p], hi[r.index])
    out = []
    for r in recs:
        a, z = last_pass.spans[r.index]
        out.append(MemoryLayer(
            index=r.index, path=r.path, type=r.type, depth=r.depth, call_index=r.call_index,
            parent=r.parent, children=r.children, input_bytes=sum(s.nbytes for s in r.inputs),
            saved_bytes=saved[r.index], param_bytes=params[r.index], grad_bytes=grads[r.index],
            optimizer_bytes=opt[r.index], saved_total=subtree[r.index][0],
            param_total=subtree[r.index][1], grad_total=subtree[r.index][2],
            optimizer_total=subtree[r.index][3],
            forward=_call_memory(a, z, total, allocs, frees),
            backward=_call_memory(lo[r.index], hi[r.index], total, allocs, frees)
            if lo[r.index] is not None else None,
            first_op=a, saved_blocks=tuple(blocks[r.index]),
            output_allocs=tuple((last_pass.offset + q, spec.nbytes)
                                for q, spec in zip(trace.layer_outputs[r.index], r.outputs) if q >= 0)))
    return tuple(out)
