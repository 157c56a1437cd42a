"""Per-module latency, as pure functions of what the timed runs recorded (capture/timing.py runs
and times the model; capture/repeats.py decides how often): statistics over repeats, one list of
calls from several steps, and the report's rows and totals.

Forward: a module call's self time is its inclusive time minus its direct children's, per repeat,
so self times add up to the root's inclusive time exactly in every repeat; backward likewise, from
the autograd nodes each call's forward made (capture/backward.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

# the timing loop and its records, where they have always been importable from
from ..capture.repeats import (AUTO_MAX, AUTO_MIN, CALL_SHARE, TOL_CALL, TOL_TOTAL, WARMUP_MAX, WARMUP_MIN,
                               half_width, median_interval, precision, time_steps, warm_count)
from ..capture.timing import CallTimes, Recorder
from ..capture.timing import Clock as _Clock  # noqa: F401  (its old name here: tests patch its stamp)
from .roofline import Roofline

__all__ = ["Timing", "timing", "CallTimes", "Recorder", "merge_steps", "time_calls", "median_interval", "half_width",
           "precision", "warm_count", "LatencyLayer", "latency_layers", "latency_totals", "AUTO_MIN", "AUTO_MAX",
           "TOL_TOTAL", "TOL_CALL", "CALL_SHARE", "WARMUP_MIN", "WARMUP_MAX"]


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




def time_calls(model: nn.Module, run: Callable[[], Any], loss_of: Callable[[Any], torch.Tensor] | None, *,
               device: torch.device, warmup: int | str, repeats: int | str,
               progress: Callable[[], None] | None = None, info: dict | None = None):
    """capture.repeats.time_steps (see there), its steps merged into one list of calls (pre-order,
    one entry per timed repeat): (calls, plain, hooked)."""
    steps, plain, hooked = time_steps(model, run, loss_of, device=device, warmup=warmup, repeats=repeats,
                                      progress=progress, info=info)
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
