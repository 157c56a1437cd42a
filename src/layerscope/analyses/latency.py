"""Per-module latency: timed runs with hooks on every module, beside uninstrumented runs.

Each repeat runs the model once without hooks (the reference) and once with them, in that order,
so drift (frequency scaling, caches) hits both alike. A module call's inclusive time is from its
forward pre-hook to its forward hook; its self time is that minus its direct children's inclusive
times, per repeat, so self times add up to the root's inclusive time exactly in every repeat.
Backward (``backward=True``): from a module's full backward pre-hook (gradients of its outputs are
ready) to its full backward hook (gradients of its inputs are computed).

CPU clocks are ``time.perf_counter``; on CUDA the hooks record CUDA events (no synchronize inside a
hook, which would stall the kernel stream and inflate every layer) and the times are read after one
synchronize at the end of each repeat.
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["Timing", "timing", "CallTimes", "time_calls"]


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
    """One module call, in pre-order, with its inclusive seconds per repeat."""

    path: str
    type: str
    depth: int
    call_index: int
    parent: int | None
    children: list[int]
    forward: list[float]
    backward: list[float]


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


def time_calls(model: nn.Module, run: Callable[[], Any], backward_of: Callable[[Any], None] | None, *,
               device: torch.device, warmup: int, repeats: int, progress: Callable[[], None] | None = None):
    """Time every module call. ``run()`` is one forward; ``backward_of(output)`` its backward (None:
    forward only). Returns (calls, plain_forward, plain_backward): the calls in pre-order with their
    inclusive seconds per timed repeat, and the seconds of each uninstrumented repeat."""
    from ..errors import InputError

    clock = _Clock(device)
    paths = {id(m): p for p, m in model.named_modules(remove_duplicate=False)}
    modules = list(dict.fromkeys(model.modules()))
    calls: list[CallTimes] = []
    fwd: list[list] = []             # per call of this repeat: [start, end] stamps
    stack: list[int] = []
    seen: dict[str, int] = {}
    fwd_of: dict[int, list[int]] = {}   # module id -> its calls this repeat, in forward order
    bwd_of: dict[int, list[int]] = {}   # module id -> its calls whose backward has begun
    seq: list[tuple] = []            # backward events in order: (stamp, "b" begin / "e" end / "end")
    bpos: dict[int, int] = {}        # call -> place of its backward begin in seq
    epos: dict[int, int] = {}        # call -> place of its backward end
    no_grad_in: set[int] = set()     # calls none of whose tensor inputs needs a gradient
    building = [True]

    def pre(m, args):
        path = paths.get(id(m), "?")
        k = seen.get(path, 0)
        seen[path] = k + 1
        i = len(fwd)
        if building[0]:
            parent = stack[-1] if stack else None
            calls.append(CallTimes(path, type(m).__name__, len(stack), k, parent, [], [], []))
            if parent is not None:
                calls[parent].children.append(i)
        fwd.append([clock.stamp(), None])
        if backward_of is not None and not any(isinstance(t, torch.Tensor) and t.requires_grad for t in args):
            no_grad_in.add(i)
        stack.append(i)
        fwd_of.setdefault(id(m), []).append(i)

    def post(m, args, out):
        fwd[stack.pop()][1] = clock.stamp()

    def bpre(m, grad_out):
        queue = fwd_of.get(id(m))
        if queue:   # a module's calls run backward in reverse order of their forwards
            i = queue.pop()
            bpos[i] = len(seq)
            seq.append((clock.stamp(), "b"))
            bwd_of.setdefault(id(m), []).append(i)

    def bpost(m, grad_in, grad_out):
        started = bwd_of.get(id(m))
        if started:
            epos[started.pop()] = len(seq)
            seq.append((clock.stamp(), "e"))

    def backward_ends() -> dict[int, int]:
        """Where each call's backward ends in seq. PyTorch fires a module's full backward hook as
        soon as its backward begins when none of its inputs needs a gradient (the first layer),
        before its weight gradients are computed: such a leaf runs to the next backward begin (or
        the backward's end). A module with children ends no earlier than they do."""
        end: dict[int, int] = {}
        for i in range(len(fwd) - 1, -1, -1):     # children come after their parent in pre-order
            kids = [end[k] for k in calls[i].children if k in end]
            if i not in bpos:
                if not kids:
                    continue
                # no hooks fired (an output that is not a tensor, e.g. a ModelOutput): the span of
                # its children's backwards
                bpos[i] = min(bpos[k] for k in calls[i].children if k in end)
                end[i] = max(kids)
                continue
            e = epos.get(i, len(seq) - 1)
            if kids:
                e = max([e] + kids) if i not in no_grad_in else max(kids)
            elif i in no_grad_in:
                e = next(p for p in range(bpos[i] + 1, len(seq)) if seq[p][1] != "e")
            end[i] = e
        return end

    def attach() -> list:
        hs = []
        for m in modules:
            hs += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
            if backward_of is not None:
                hs += [m.register_full_backward_pre_hook(bpre), m.register_full_backward_hook(bpost)]
        return hs

    def once():
        clock.sync()
        t0 = clock.stamp()
        out = run()
        t1 = clock.stamp()
        if backward_of is not None:
            backward_of(out)
        del out
        t2 = clock.stamp()
        clock.sync()
        return t0, t1, t2

    plain_f: list[float] = []
    plain_b: list[float] = []
    handles: list = []
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Full backward hook is firing")
            # a module returning a non-tensor (ModelOutput) gets no backward hooks: spanned by its children
            warnings.filterwarnings("ignore", message="For backward hooks to be called")
            for r in range(warmup + repeats):
                timed = r >= warmup
                t0, t1, t2 = once()            # the reference: no hooks
                if timed:
                    plain_f.append(clock.seconds(t0, t1))
                    if backward_of is not None:
                        plain_b.append(clock.seconds(t1, t2))
                for d in (fwd, stack, seq):
                    d.clear()
                for d in (seen, fwd_of, bwd_of, bpos, epos):
                    d.clear()
                no_grad_in.clear()
                handles = attach()
                try:
                    _, _, t2 = once()
                finally:
                    for h in handles:
                        h.remove()
                seq.append((t2, "end"))
                if building[0]:
                    building[0] = False
                elif len(fwd) != len(calls):
                    raise InputError(f"the model made {len(fwd)} module calls in one run and "
                                     f"{len(calls)} in the first: per-call times need the same calls "
                                     "in every run (data-dependent control flow?)")
                ends = backward_ends() if backward_of is not None else {}
                if timed:
                    for i, (c, st) in enumerate(zip(calls, fwd)):
                        c.forward.append(clock.seconds(st[0], st[1]) if st[1] is not None else 0.0)
                        if backward_of is not None:
                            c.backward.append(clock.seconds(seq[bpos[i]][0], seq[ends[i]][0])
                                              if i in ends else 0.0)
                if progress is not None:
                    progress()
    finally:
        for h in handles:
            h.remove()
    return calls, plain_f, plain_b
