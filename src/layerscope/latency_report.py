"""LatencyReport: per module call, forward (and backward) time, inclusive and self, over repeats."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TextIO

from .analyses.latency import CallTimes, Timing, timing
from .analyses.roofline import Roofline
from .render.output import ReportOutput, dataframe, print_report, write_text

__all__ = ["LatencyLayer", "LatencyReport", "latency_layers", "latency_totals"]


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


@dataclass(frozen=True)
class LatencyReport(ReportOutput):
    model_name: str
    device: str
    options: dict
    layers: tuple[LatencyLayer, ...]
    totals: dict                   # see latency_totals
    notes: tuple[str, ...] = ()
    roofline: Roofline | None = None

    def top(self, k: int = 5, depth: int | None = None, by: str = "forward_self") -> list[LatencyLayer]:
        """The k calls with the largest median ``by`` time (``forward``, ``forward_self``,
        ``backward``, ``backward_self``), optionally only at one depth."""
        rows = [r for r in self.layers if depth is None or r.depth == depth]
        return sorted(rows, key=lambda r: getattr(r, by).median if getattr(r, by) else 0.0, reverse=True)[:k]

    def top_per_depth(self, k: int = 3, by: str = "forward") -> dict[int, list[LatencyLayer]]:
        """The k slowest calls at each depth below the root (DeepSpeed's "top modules at each
        depth"), by median ``by`` time."""
        return {d: self.top(k, depth=d, by=by) for d in sorted({r.depth for r in self.layers}) if d > 0}

    def to_chrome_trace(self, path: str | None = None) -> str:
        """Chrome trace / Perfetto JSON of the module spans of one repeat (the one whose forward is
        the median), forward and backward on separate tracks; open in ui.perfetto.dev or
        chrome://tracing."""
        from .render.latency import chrome_trace
        return write_text(json.dumps(chrome_trace(self)), path)

    def table(self, depth: int | None = None, top: int = 3) -> str:
        """The tree table; the footer names the ``top`` slowest calls at each depth (0: none)."""
        from .render.latency import render_latency_text
        return render_latency_text(self, depth, top)

    def rich_table(self, depth: int | None = None, top: int = 3):
        from .render.latency import render_latency_rich
        return render_latency_rich(self, depth, top)

    def print(self, depth: int | None = None, top: int = 3, file: TextIO | None = None) -> None:
        print_report(lambda: self.rich_table(depth, top), lambda: self.table(depth, top), file)

    def to_dict(self) -> dict[str, Any]:
        from .render.latency import latency_dict
        return latency_dict(self)

    def to_csv(self, path: str | None = None) -> str:
        from .render.latency import render_latency_csv
        return write_text(render_latency_csv(self), path)

    _html_part = "latency"

    def _html_rows(self, depth):
        from .render.latency import latency_footer, latency_rows
        return (*latency_rows(self, depth), latency_footer(self))

    def to_dataframe(self):
        from .render.latency import latency_row
        return dataframe(latency_row(r, self.roofline) for r in self.layers)

    def __repr__(self) -> str:
        t = self.totals
        return (f"<LatencyReport {self.model_name}: forward {t['forward_instrumented'] * 1e3:.3f} ms "
                f"({len(self.layers)} calls, {t['runs']} {self.options.get('unit', 'repeat')}s on "
                f"{self.device})>")


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
