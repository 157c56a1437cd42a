"""Per-module latency: timed runs with hooks on every module, beside uninstrumented runs.

Forward: a module call's inclusive time runs from its forward pre-hook to its forward hook; its self
time is that minus its direct children's inclusive times, per repeat, so self times add up to the
root's inclusive time exactly in every repeat.

Backward: no module backward hooks (PyTorch's full backward hooks wrap every module's inputs and
outputs in extra autograd nodes, which tripled the backward of a small GPT-2). Instead each module
call notes the autograd sequence numbers its forward used; after the root's forward every node of
its graph gets a cheap pre-hook, and a node belongs to the innermost call whose forward created it
(a parameter's gradient accumulation belongs to the module that owns the parameter). A node's time
runs from its pre-hook to the next node's (or the end of the backward pass), so a call's backward
self time is the sum over its nodes and, again, self times add up to the root's backward exactly.

CPU clocks are ``time.perf_counter``; on CUDA the hooks record CUDA events (no synchronize inside a
hook, which would stall the kernel stream and inflate every layer) and the times are read after one
synchronize at the end of each repeat or step.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable

import torch
from torch import nn

from .. import _compat
from ..capture.inputs import iter_tensors
from ..capture.tracker import ModuleTracker, TrackedCall, tracked_modules
from .roofline import Roofline

__all__ = ["Timing", "timing", "CallTimes", "Recorder", "merge_steps", "time_calls", "median_interval", "half_width",
           "precision", "warm_count", "LatencyLayer",
           "latency_layers", "latency_totals"]

@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds over the timed repeats."""

    median: float
    p25: float
    p75: float
    min: float
    max: float

    @property
    def spread(self) -> float:
        """Interquartile range relative to the median."""
        return (self.p75 - self.p25) / self.median if self.median > 0 else 0.0


def timing(values: list[float]) -> Timing:
    vals = sorted(values)
    if len(vals) >= 2:
        q = statistics.quantiles(vals, n=4, method="inclusive")
        p25, p75 = q[0], q[2]
    else:
        p25 = p75 = vals[0]
    return Timing(median=statistics.median(vals), p25=p25, p75=p75, min=vals[0], max=vals[-1])


@dataclass
class CallTimes:
    """One module call (in pre-order) with its seconds per repeat or step: inclusive forward and
    backward, and where its spans lie from the start of the repeat (for traces; None: no span)."""

    path: str
    type: str
    depth: int
    call_index: int
    parent: int | None
    children: list[int]
    forward: list[float] = field(default_factory=list)
    backward: list[float] = field(default_factory=list)
    forward_span: list[tuple[float, float] | None] = field(default_factory=list)
    backward_span: list[tuple[float, float] | None] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int]:
        return self.path, self.call_index


class _Clock:
    """Timestamps that can be read after the repeat: perf_counter on CPU, CUDA events on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def stamp(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


class _Call(TrackedCall):
    __slots__ = ("f0", "f1", "s0", "s1")

    def __init__(self, module, path, depth, call_index, parent, type_=None) -> None:
        super().__init__(module, path, depth, call_index, parent, type_)
        self.f0 = self.f1 = None
        self.s0 = self.s1 = 0


class Recorder(ModuleTracker):
    """Hooks that time every module call of ``model``, step by step: ``attach()``, then per step
    ``begin()`` ... ``end()`` (which returns that step's calls and times), then ``detach()``. With ``backward``, the backward of every graph a root call built is timed too, on
    whatever thread autograd runs it. Nothing is kept from one step to the next."""

    call_class = _Call

    def __init__(self, model: nn.Module, device: torch.device, backward: bool, defer: bool = False) -> None:
        # every thread's calls: a training loop may run its steps on a thread of its own
        super().__init__(this_thread_only=False)
        self.clock = _Clock(device)
        self.defer = defer        # hook the graph at hook_pending(), not in the root's forward hook
        # the next autograd sequence number of this thread (nodes are numbered as the forward creates
        # them); without it (a torch that lacks it) backward passes are not timed
        self.next_seq = _compat.get("sequence_nr")
        self.backward = backward and self.next_seq is not None
        self.named = tracked_modules(list(model.named_modules()))   # each module once, by its first path
        self.param_module: dict[int, int] = {}   # parameter -> the module that registers it
        for _, m in self.named:
            for p in m._parameters.values():
                if p is not None:
                    self.param_module.setdefault(id(p), id(m))
        self._begin_state()

    def _begin_state(self) -> None:
        self.calls: list[_Call] = []
        self.stack: list[int] = []
        self.ncalls = defaultdict(int)
        self.first_call: dict[int, int] = {}   # module -> its first call of the step
        self.events: list[tuple[Any, int]] = []   # backward: (stamp, call), call -1 = a pass ended
        self.node_handles: list = []
        self.hooked_leaves: dict[int, Any] = {}   # gradient accumulators already hooked this step
        self.in_pass = False
        self.pending: list[tuple[int, Any]] = []
        self.hook_seconds = 0.0    # CPU seconds spent putting pre-hooks on graph nodes
        self.marks: list[tuple[str, Any]] = []
        self.t0 = self.clock.stamp()

    def mark(self, name: str) -> None:
        """A named instant of this step (seconds from its start come back from ``end()``)."""
        self.marks.append((name, self.clock.stamp()))

    # hooks ---------------------------------------------------------------------------------
    def entered(self, c: _Call) -> None:
        self.first_call.setdefault(id(c.module), c.index)
        if self.backward:
            c.s0 = self.next_seq()
        c.f0 = self.clock.stamp()

    def _post(self, m, args, kwargs, out) -> None:
        t = self.clock.stamp()                    # first: the forward ended here
        c = self.exit(m, args, kwargs, out)
        if c is None:
            return
        c.f1 = t
        if self.backward:
            c.s1 = self.next_seq()
            if c.parent is None and c.s1 > c.s0 and out is not None:
                self.pending.append((c.index, out))
                if not self.defer:
                    self.hook_pending()

    def hook_pending(self) -> None:
        """Give every node of the graphs the finished root calls built a pre-hook naming its call
        (``defer``: the caller does this between forward and backward, outside both timings)."""
        t = time.perf_counter()
        for root, out in self.pending:
            self._hook_graph(root, out)
        self.pending = []
        self.hook_seconds += time.perf_counter() - t

    def _hook_graph(self, root: int, out) -> None:
        r = self.calls[root]
        base, n = r.s0, r.s1 - r.s0
        owner = [root] * n
        for j in range(root + 1, len(self.calls)):   # pre-order: the root's descendants follow it
            d = self.calls[j]
            if d.parent is None:                     # the next top-level call
                break
            if d.s1 > d.s0:
                owner[d.s0 - base:d.s1 - base] = [j] * (d.s1 - d.s0)
        todo = [t.grad_fn for t in iter_tensors(out) if t.grad_fn is not None]
        seen: dict[int, Any] = {}
        while todo:
            node = todo.pop()
            if id(node) in seen:
                continue
            seen[id(node)] = node
            s = node._sequence_nr() - base
            if 0 <= s < n:
                call = owner[s]
            elif hasattr(node, "variable"):        # AccumulateGrad: a parameter's (or input's) .grad
                if id(node) in self.hooked_leaves:
                    continue
                self.hooked_leaves[id(node)] = node
                call = self.first_call.get(self.param_module.get(id(node.variable)), root)
            else:                                  # made before this call: its inputs' history
                continue
            self.node_handles.append(node.register_prehook(partial(self._node, call)))
            todo.extend(f for f, _ in node.next_functions if f is not None)

    def _node(self, call: int, grad_outputs) -> None:
        t = self.clock.stamp()
        if not self.in_pass:
            self.in_pass = True
            _compat.queue_backward_callback(self._pass_end)
        self.events.append((t, call))

    def _pass_end(self) -> None:
        self.events.append((self.clock.stamp(), -1))
        self.in_pass = False

    # control -------------------------------------------------------------------------------
    def attach(self) -> None:
        self.install(self.named)

    def detach(self) -> None:
        self.remove()
        self._drop_node_hooks()

    def _drop_node_hooks(self) -> None:
        for h in self.node_handles:
            h.remove()
        self.node_handles = []
        self.hooked_leaves = {}

    def begin(self) -> None:
        self._drop_node_hooks()
        self._begin_state()

    def end(self) -> tuple[list[CallTimes], float, list[tuple[str, float]], float]:
        """This step's calls with their seconds (one entry per list), the step's length, its marks
        (seconds from its start) and the CPU seconds spent hooking graph nodes. Node hooks come off."""
        t_end = self.clock.stamp()
        self.clock.sync()
        self._drop_node_hooks()
        self.pending = []
        calls, ev, sec, t0 = self.calls, self.events, self.clock.seconds, self.t0
        marks = [(name, sec(t0, t)) for name, t in self.marks]
        out = [CallTimes(c.path, c.type, c.depth, c.call_index, c.parent, list(c.children)) for c in calls]
        for o, c in zip(out, calls):
            done = c.f1 is not None and c.f0 is not None
            o.forward.append(sec(c.f0, c.f1) if done else 0.0)
            o.forward_span.append((sec(t0, c.f0), sec(t0, c.f1)) if done else None)
        b_self = [0.0] * len(calls)
        span: list[list[float] | None] = [None] * len(calls)
        for k in range(len(ev) - 1):
            t, i = ev[k]
            if i < 0:
                continue
            d = sec(t, ev[k + 1][0])
            b_self[i] += d
            s = sec(t0, t)
            if span[i] is None:
                span[i] = [s, s + d]
            else:
                span[i][0], span[i][1] = min(span[i][0], s), max(span[i][1], s + d)
        incl = b_self[:]
        for i in range(len(calls) - 1, -1, -1):    # children follow their parent in pre-order
            for k in calls[i].children:
                incl[i] += incl[k]
                if span[k] is not None:
                    span[i] = list(span[k]) if span[i] is None else [min(span[i][0], span[k][0]),
                                                                     max(span[i][1], span[k][1])]
        for i, o in enumerate(out):
            o.backward.append(incl[i])
            o.backward_span.append(tuple(span[i]) if span[i] is not None else None)
        return out, sec(t0, t_end), marks, self.hook_seconds


def merge_steps(steps: list[list[CallTimes]]) -> list[CallTimes]:
    """One list of calls from several steps' (each with one entry per list): a call is known by its
    path and call index; one missing from a step gets zero time there (its parent's self time
    holds it). The result is in pre-order."""
    merged: dict[tuple[str, int], CallTimes] = {}
    order: list[tuple[str, int]] = []
    for r, step in enumerate(steps):
        for c in step:
            m = merged.get(c.key)
            if m is None:
                m = merged[c.key] = CallTimes(c.path, c.type, c.depth, c.call_index, None, [],
                                              [0.0] * r, [0.0] * r, [None] * r, [None] * r)
                m.parent = step[c.parent].key if c.parent is not None else None   # a key until the end
                order.append(c.key)
            m.forward += c.forward
            m.backward += c.backward
            m.forward_span += c.forward_span
            m.backward_span += c.backward_span
        for m in merged.values():                 # absent from this step
            if len(m.forward) == r:
                m.forward.append(0.0)
                m.backward.append(0.0)
                m.forward_span.append(None)
                m.backward_span.append(None)
    kids: dict[Any, list[tuple[str, int]]] = {}
    for k in order:
        kids.setdefault(merged[k].parent, []).append(k)
    out: list[CallTimes] = []

    def visit(k, parent: int | None) -> None:
        c = merged[k]
        c.parent = parent
        i = len(out)
        out.append(c)
        c.children = []
        if parent is not None:
            out[parent].children.append(i)
        for kk in kids.get(k, []):
            visit(kk, i)

    for k in kids.get(None, []):
        visit(k, None)
    return out


# Adaptive repeats (``repeats="auto"``) and warm-up (``warmup="auto"``).
#
# The figure a repeat adds to is the median of each time, so the rule asks how well the medians are
# known: the distribution-free 95% confidence interval of a median from order statistics — with n
# runs sorted, [x(k), x(n+1-k)] where k is the largest index with P(Binomial(n, 1/2) < k) <= 2.5% —
# must lie within +-TOL_TOTAL of the median for the whole forward (and backward) with hooks and
# without them, and within +-TOL_CALL for every call that takes at least CALL_SHARE of the whole
# (inclusive, forward or backward). No normality is assumed: the interval holds for any continuous
# distribution of run times, also the skewed one a shared machine gives.
#
# The constants. AUTO_MIN = 6 is the smallest n with a 95% interval at all ([x(1), x(6)] covers the
# median with 1 - 2/64 = 96.9%; with 5 runs the widest interval covers 93.75%). AUTO_MAX = 20 is the
# fixed count profile() used before, so "auto" never runs longer than it did. The tolerances are what
# those 20 repeats give on a typical spread: GPT-2 small (S=1024) on a 2-core CPU had the whole
# forward's IQR/median at 3.5-5% and its 15 calls over 5% at 2-10% (median 4%); at n = 20 the interval
# is [x(6), x(15)], about 0.9 IQR wide for a bell-shaped spread, i.e. +-0.44 x IQR/median: +-1.5-2.2%
# for the whole forward (TOL_TOTAL = 2%) and up to +-4.4% for the noisiest large call (TOL_CALL = 5%).
# A quieter run reaches the same precision sooner and stops (at 6 on a noiseless one); a noisier one
# runs to the maximum, as before. Stopping on the data makes the interval's coverage slightly
# optimistic (optional stopping), which is why the minimum stays at 6 rather than lower.
AUTO_MIN, AUTO_MAX = 6, 20
TOL_TOTAL, TOL_CALL, CALL_SHARE = 0.02, 0.05, 0.05
# Warm-up "auto": at least 1 run (first runs pay for allocations, oneDNN primitive creation and
# cold caches), then a run is warm-up while it was slower than the next one by more than TOL_TOTAL (a
# smaller difference is within the precision the medians are asked for), at most WARMUP_MAX = 3
# (the fixed count used before).
WARMUP_MIN, WARMUP_MAX = 1, 3


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The distribution-free ``confidence`` interval of the median of ``values`` from order
    statistics: (x(k), x(n+1-k)) of the sorted values, k the largest index with
    P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2. None when n is too small for one."""
    import math

    n = len(values)
    alpha, cum, k = (1 - confidence) / 2, 0.0, 0
    for i in range(n + 1):
        cum += math.comb(n, i) / 2 ** n      # P(B <= i)
        if cum > alpha:
            break
        k = i + 1
    if k == 0:
        return None
    s = sorted(values)
    return s[k - 1], s[n - k]


def half_width(values: list[float]) -> float:
    """Half the width of the median's 95% interval over the median (inf: too few values for one)."""
    ci = median_interval(values)
    med = statistics.median(values) if values else 0.0
    if ci is None or med <= 0:
        return float("inf") if ci is None else 0.0
    return (ci[1] - ci[0]) / (2 * med)


def precision(steps: list[list[CallTimes]], plain: dict[str, list[float]], hooked: dict[str, list[float]],
              phases: tuple[str, ...]) -> tuple[float, str]:
    """How far the medians are from the stopping rule: the largest ratio of a half-width to its
    tolerance (<= 1: precise enough) and what it is (for the report)."""
    worst, what = 0.0, ""

    def see(values: list[float], tol: float, name: str) -> None:
        nonlocal worst, what
        r = half_width(values) / tol
        if r > worst:
            worst, what = r, name

    for phase in phases:
        see(hooked[phase], TOL_TOTAL, f"the {phase} with hooks")
        see(plain[phase], TOL_TOTAL, f"the {phase} without hooks")
        if not steps:
            continue
        n = len(steps)
        per_call = [[steps[r][i].forward[0] if phase == "forward" else steps[r][i].backward[0] for r in range(n)]
                    for i in range(len(steps[0]))]
        roots = [i for i, c in enumerate(steps[0]) if c.parent is None]
        whole = statistics.median([sum(per_call[i][r] for i in roots) for r in range(n)])
        for i, vals in enumerate(per_call):
            if whole > 0 and statistics.median(vals) >= CALL_SHARE * whole:
                see(vals, TOL_CALL, f"{steps[0][i].path or '(root)'} {phase}")
    return worst, what


def warm_count(totals: list[float], least: int = WARMUP_MIN, most: int = WARMUP_MAX) -> int | None:
    """How many of the first runs (seconds per run: ``totals``) are warm-up: ``least``, then each
    next one while it was slower than its successor by more than TOL_TOTAL, at most ``most``. None:
    not known yet (the run after the last candidate has not run)."""
    w = least
    while w < most:
        if len(totals) < w + 2:
            return None
        if totals[w] <= totals[w + 1] * (1 + TOL_TOTAL):
            break
        w += 1
    return w


def time_calls(model: nn.Module, run: Callable[[], Any], loss_of: Callable[[Any], torch.Tensor] | None, *,
               device: torch.device, warmup: int | str, repeats: int | str,
               progress: Callable[[], None] | None = None, info: dict | None = None):
    """Time every module call. ``run()`` is one forward; ``loss_of(output)`` the loss whose backward
    is timed (None: forward only). Each repeat runs once without hooks (the reference) and once
    with them, in alternating order, so drift and order effects hit both alike. Returns (calls, plain, hooked): the calls in pre-order with
    their seconds per timed repeat, and the forward and backward seconds of each run without and
    with hooks: ``{"forward": [...], "backward": [...]}``.

    ``repeats="auto"``: at least AUTO_MIN and at most AUTO_MAX repeats, stopping at the first at
    which every median that matters is known within its tolerance (see ``precision``);
    ``warmup="auto"``: see ``warm_count``. ``info`` (a dict) receives what ran: ``warmup``,
    ``repeats``, ``stopped`` ("fixed", "precise" or "maximum") and, for "auto", ``worst`` (the
    least precise median: its half-width over its tolerance, and its name)."""
    clock = _Clock(device)
    rec = Recorder(model, device, backward=loss_of is not None, defer=True)
    phases = ("forward", "backward") if loss_of is not None else ("forward",)

    def once():
        clock.sync()
        t0 = clock.stamp()
        out = run()
        t1 = clock.stamp()
        rec.hook_pending()            # untimed: between the forward and the backward
        t1b = clock.stamp()
        if loss_of is not None:
            loss_of(out).backward()
        del out
        t2 = clock.stamp()
        clock.sync()
        return clock.seconds(t0, t1), clock.seconds(t1b, t2)

    from ..errors import InputError

    runs: list[tuple] = []            # per repeat, warm-up included: (step, f, b, hf, hb)
    first: list | None = None
    warm = warmup if isinstance(warmup, int) else None
    stopped, worst = "fixed", (0.0, "")

    def timed(w: int):
        rs = runs[w:]
        plain = {"forward": [x[1] for x in rs], "backward": [x[2] for x in rs] if loss_of is not None else []}
        hooked = {"forward": [x[3] for x in rs], "backward": [x[4] for x in rs] if loss_of is not None else []}
        return [x[0] for x in rs], plain, hooked

    try:
        r = 0
        while True:
            if r % 2 == 0:
                f, b = once()                 # the reference: no hooks
            rec.attach()
            rec.begin()
            try:
                hf, hb = once()
            finally:
                rec.detach()
            step = rec.end()[0]
            if r % 2 == 1:                    # every other repeat runs the reference second
                f, b = once()
            keys = [c.key for c in step]
            if first is None:
                first = keys
            elif keys != first:
                raise InputError(f"the model made {len(keys)} module calls in one run and {len(first)} "
                                 "in the first: per-call times need the same calls in every run "
                                 "(data-dependent control flow?)")
            runs.append((step, f, b, hf, hb))
            r += 1
            if progress is not None:
                progress()
            if warm is None:
                warm = warm_count([x[1] + x[2] + x[3] + x[4] for x in runs])
                if warm is None:
                    continue
            n = len(runs) - warm
            if isinstance(repeats, int):
                if n >= repeats:
                    break
                continue
            if n < AUTO_MIN:
                continue
            steps, plain, hooked = timed(warm)
            worst = precision(steps, plain, hooked, phases)
            if worst[0] <= 1.0:
                stopped = "precise"
                break
            if n >= AUTO_MAX:
                stopped = "maximum"
                break
    finally:
        rec.detach()
    steps, plain, hooked = timed(warm)
    if info is not None:
        info.update(warmup=warm, repeats=len(steps), stopped=stopped)
        if stopped != "fixed":
            info["worst"] = worst
    return merge_steps(steps), plain, hooked


@dataclass(frozen=True, slots=True)
class LatencyLayer:
    """One module call. Times in seconds; costs of its whole subtree from the capture core."""

    index: int
    path: str
    type: str
    depth: int
    call_index: int
    parent: int | None
    children: tuple[int, ...]
    params: int                    # unique parameters of the module's subtree
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    forward: Timing                # inclusive: the call and everything nested in it
    forward_self: Timing           # inclusive minus the direct children's, per repeat
    backward: Timing | None
    backward_self: Timing | None
    flops: int                     # forward FLOPs of the subtree
    bytes_moved: int               # forward bytes read + written of the subtree
    backward_flops: int = 0
    backward_bytes: int = 0
    # where the call ran in one representative run (the one whose forward is the median), in
    # seconds from that run's start: for traces
    forward_span: tuple[float, float] | None = None
    backward_span: tuple[float, float] | None = None

    @property
    def name(self) -> str:
        return self.path or "(root)"

    @property
    def flops_per_second(self) -> float | None:
        """Achieved forward FLOP/s: the subtree's FLOPs over its median inclusive time."""
        return self.flops / self.forward.median if self.forward.median > 0 and self.flops else None

    @property
    def bytes_per_second(self) -> float | None:
        return self.bytes_moved / self.forward.median if self.forward.median > 0 and self.bytes_moved else None

    @property
    def intensity(self) -> float | None:
        """Arithmetic intensity: FLOPs per byte moved (forward)."""
        return self.flops / self.bytes_moved if self.bytes_moved else None

    def bound(self, roof: Roofline | None) -> str | None:
        """"compute" or "memory": which roof limits this call's forward at its intensity."""
        i = self.intensity
        return roof.bound(i) if roof is not None and i else None

    def roof_fraction(self, roof: Roofline | None) -> float | None:
        """Achieved forward FLOP/s over the roof's attainable FLOP/s at this intensity."""
        return roof.fraction(self.flops, self.bytes_moved, self.forward.median) if roof is not None else None


def _self_times(calls: list[CallTimes], phase: str) -> list[list[float]]:
    """Self seconds per call and run: inclusive minus the direct children's."""
    incl = [getattr(c, phase) for c in calls]
    return [[t - sum(incl[k][r] for k in c.children) for r, t in enumerate(incl[i])]
            for i, c in enumerate(calls)]


def latency_layers(calls: list[CallTimes], costs, backward: bool) -> list[LatencyLayer]:
    """Report rows from timed calls and (optionally) an analysis Report of the same model whose
    records give each call's parameters, shapes and costs."""
    by_call = {(r.path, r.call_index): r for r in costs.layers} if costs is not None else {}
    f_self = _self_times(calls, "forward")
    b_self = _self_times(calls, "backward")
    roots = [i for i, c in enumerate(calls) if c.parent is None]
    runs = len(calls[0].forward) if calls else 0
    per_run = sorted(range(runs), key=lambda r: sum(calls[i].forward[r] for i in roots))
    rep = per_run[len(per_run) // 2] if per_run else 0
    layers = []
    for i, c in enumerate(calls):
        rec = by_call.get((c.path, c.call_index))
        layers.append(LatencyLayer(
            index=i, path=c.path, type=c.type, depth=c.depth, call_index=c.call_index, parent=c.parent,
            children=tuple(c.children), params=rec.subtree_params if rec else 0,
            input_shapes=tuple(s.shape for s in rec.inputs) if rec else (),
            output_shapes=tuple(s.shape for s in rec.outputs) if rec else (),
            forward=timing(c.forward), forward_self=timing(f_self[i]),
            backward=timing(c.backward) if backward else None,
            backward_self=timing(b_self[i]) if backward else None,
            flops=rec.forward_total.flops if rec else 0,
            bytes_moved=rec.forward_total.bytes_moved if rec else 0,
            backward_flops=rec.backward_total.flops if rec else 0,
            backward_bytes=rec.backward_total.bytes_moved if rec else 0,
            forward_span=c.forward_span[rep] if runs else None,
            backward_span=c.backward_span[rep] if runs and backward else None))
    return layers


def latency_totals(calls: list[CallTimes], hooked: dict[str, list[float]],
                   plain: dict[str, list[float]] | None, backward: bool) -> dict[str, float]:
    """Medians over runs of: the measured forward (and backward) with hooks, without them when
    ``plain`` is given (and the overhead: the median of the per-repeat ratios), and the sum of every
    call's self time (the top-level calls' inclusive times, per run). ``spread``: interquartile
    range over median of the runs."""
    roots = [i for i, c in enumerate(calls) if c.parent is None]
    out: dict[str, float] = {"runs": len(hooked["forward"])}
    for phase in ("forward", "backward") if backward else ("forward",):
        self_sums = [sum(getattr(calls[i], phase)[r] for i in roots) for r in range(out["runs"])]
        h = timing(hooked[phase])
        out[f"{phase}_instrumented"] = h.median
        out[f"{phase}_self_sum"] = timing(self_sums).median
        out[f"{phase}_spread"] = h.spread
        if plain is not None:
            p = timing(plain[phase])
            out[f"{phase}_plain"] = p.median
            # the median over repeats of each repeat's own ratio (both runs of a repeat are
            # back to back, so the machine's drift cancels)
            out[f"{phase}_overhead"] = timing([a / b - 1 for a, b in zip(hooked[phase], plain[phase])
                                               if b > 0] or [0.0]).median
            out[f"{phase}_spread"] = p.spread
    return out
