"""Per-module latency, as pure functions of what the timed runs recorded (capture/timing.py runs
and times the model; capture/repeats.py decides how often): statistics over repeats and the
report's rows and totals.

Forward: a module call's self time is its inclusive time minus its direct children's, per repeat,
so self times add up to the root's inclusive time exactly in every repeat; backward likewise, from
the autograd nodes each call's forward made (capture/backward.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


from ..capture.repeats import half_width
from ..capture.timing import CallTimes
from .roofline import Roofline

__all__ = ["Timing", "timing", "LatencyLayer", "latency_layers", "latency_totals", "SPREAD_LIMIT", "wide",
           "wide_totals", "over_roof"]

# A time is flagged when the interquartile range of its repeats is over this share of its median
# (issue 58: on a busy machine a profile printed a spread of 2,317% and a "% of roof" of 122.6%
# without a word). Repeats of one call on a quiet machine spread by a few percent (the goldens' hand-
# made timings: 20%); beyond a quarter of the median the quartiles disagree about the time by more
# than the differences a profile is read for, so its median is not a figure to act on.
SPREAD_LIMIT = 0.25


@dataclass(frozen=True, slots=True)
class Timing:
    """Seconds over the timed repeats."""

    median: float
    p25: float
    p75: float
    min: float
    max: float
    # half the width of the median's distribution-free 95% interval over the median (capture/repeats.py;
    # None: too few repeats for one)
    half_width: float | None = 0.0

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
    return Timing(median=statistics.median(vals), p25=p25, p75=p75, min=vals[0], max=vals[-1],
                  half_width=_finite(half_width(vals)))



def _finite(x: float) -> float | None:
    return None if x == float("inf") else x


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


def wide(t: Timing | None) -> bool:
    """Whether a time's spread (IQR over median) is over ``SPREAD_LIMIT``."""
    return t is not None and t.spread > SPREAD_LIMIT


def wide_totals(totals) -> dict[str, float]:
    """The whole run's spreads over ``SPREAD_LIMIT``, by phase ("forward", "backward", "step")."""
    return {ph: v for ph in ("forward", "backward", "step")
            if (v := totals.get(f"{ph}_spread")) is not None and v > SPREAD_LIMIT}


def over_roof(layers, roof: Roofline | None) -> list[tuple[LatencyLayer, float]]:
    """The calls whose achieved FLOP/s is over what the roofline allows at their intensity (% of roof
    over 100%), with that fraction: a time below the roofline's floor, which cannot be where the time
    and the peaks are right."""
    if roof is None:
        return []
    return [(r, f) for r in layers if (f := r.roof_fraction(roof)) is not None and f > 1.0]


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
