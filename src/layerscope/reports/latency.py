"""LatencyReport: per module call, forward (and backward) time, inclusive and self, over repeats;
its columns, header and footer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TextIO

from ..analyses.latency import (SPREAD_LIMIT, LatencyLayer, latency_layers, latency_totals, over_roof, wide,
                                wide_totals)
from ..analyses.roofline import Roofline
from ..capture.repeats import AUTO_MAX, AUTO_MIN, CALL_SHARE, TOL_CALL, TOL_TOTAL
from ..errors import InputError
from .base import ReportRecord, Totals, rendered, write_text
from .table import Column, Fact, Table, select_columns, tree_table

__all__ = ["LatencyLayer", "LatencyReport", "LatencyTotals", "latency_layers", "latency_totals", "latency_columns",
           "latency_title", "latency_warnings"]


def _med(phase: str):
    return lambda r, rep: getattr(r, phase).median if getattr(r, phase) is not None else None


def _q(phase: str, k: str):
    return lambda r, rep: getattr(getattr(r, phase), k) if getattr(r, phase) is not None else None


_T = {"fold": False, "fold_with": "median"}   # times differ from block to block


def _imprecise(phase: str):
    """The marks after a time: `` ~`` where its median is less precise than profile()'s stopping rule
    asks (a call over CALL_SHARE of the whole whose 95% interval is wider than +-TOL_CALL, issue 34),
    ``!`` where its spread is over SPREAD_LIMIT (issue 58)."""
    def mark(r, rep) -> str:
        tilde = IMPRECISE if imprecise(r, rep, phase) else ""
        return tilde + (("" if tilde else " ") + WIDE if wide(getattr(r, phase)) else "")
    return mark


IMPRECISE = " ~"
WIDE = "!"          # after a time whose spread (IQR/median) is over SPREAD_LIMIT
OVER_ROOF = " ?"    # after a % of roof over 100%


def _over_roof(r, rep) -> str:
    f = r.roof_fraction(rep.roofline)
    return OVER_ROOF if f is not None and f > 1.0 else ""


def imprecise(r, rep, phase: str) -> bool:
    t = getattr(r, phase)
    whole = rep.totals.get(f"{phase}_self_sum") or 0.0
    return t is not None and whole > 0 and t.median >= CALL_SHARE * whole and \
        (t.half_width is None or t.half_width > TOL_CALL)


def latency_columns(rep: "LatencyReport") -> tuple[Column, ...]:
    """Every column of a latency report (backward and roofline ones when the run has them). Times
    differ from block to block, so a fold shows the median of the folded blocks' times."""
    total = sum(r.forward_self.median for r in rep.layers) or 1.0
    roof = rep.roofline
    cols = [
        Column("input_shape", "Input shape", "shape", lambda r, rep: r.input_shapes, drop=4, default=False),
        Column("output_shape", "Output shape", "shape", lambda r, rep: r.output_shapes, drop=3),
        Column("params", "Params", "params", lambda r, rep: r.params, drop=2),
        Column("forward", "Fwd", "seconds", _med("forward"), suffix=_imprecise("forward"), **_T,
               description=f"median inclusive time (~: known less precisely than +-5%; {WIDE}: spread "
                           f"(IQR/median) over {100 * SPREAD_LIMIT:g}%)"),
        Column("forward_self", "Fwd self", "seconds", _med("forward_self"), **_T,
               description="inclusive minus the direct children's"),
        Column("self_percent", "% self", "percent", lambda r, rep: r.forward_self.median / total, **_T,
               drop=1),
        Column("forward_p25", "Fwd p25", "seconds", _q("forward", "p25"), **_T, drop=6, default=False),
        Column("forward_p75", "Fwd p75", "seconds", _q("forward", "p75"), **_T, drop=6, default=False),
    ]
    if rep.options.get("backward"):
        cols += [Column("backward", "Bwd", "seconds", _med("backward"), suffix=_imprecise("backward"), **_T,
                        description=f"median inclusive backward time (~ and {WIDE} as for Fwd)"),
                 Column("backward_self", "Bwd self", "seconds", _med("backward_self"), **_T, drop=1)]
    cols += [Column("flops", "FLOPs", "count", lambda r, rep: r.flops, drop=6, default=False),
             Column("bytes_moved", "Bytes", "bytes", lambda r, rep: r.bytes_moved, drop=6, default=False),
             Column("flops_per_second", "FLOP/s", "rate", lambda r, rep: r.flops_per_second, **_T, drop=5),
             Column("intensity", "FLOP/B", "ratio", lambda r, rep: r.intensity, drop=5)]
    if roof is not None:
        cols += [Column("bound", "Bound", "text", lambda r, rep: r.bound(roof), drop=5),
                 Column("roof_fraction", "% of roof", "percent", lambda r, rep: r.roof_fraction(roof),
                        suffix=_over_roof, **_T, drop=5,
                        description="achieved / attainable FLOP/s at the call's intensity (?: over 100%, "
                                    "which cannot be: see the Over roof line)")]
    return tuple(cols)


def _ms(v: float) -> tuple:
    return (v, "seconds")


def _phase_line(t: dict, phase: str) -> tuple:
    parts: list = []
    if f"{phase}_plain" in t:
        parts += [_ms(t[f"{phase}_plain"]), " uninstrumented, ", _ms(t[f"{phase}_instrumented"]),
                  f" with hooks ({100 * t[f'{phase}_overhead']:+.1f}%), "]
    inst = t[f"{phase}_instrumented"]
    parts += ["sum of self times ", _ms(t[f"{phase}_self_sum"])]
    if inst and f"{phase}_plain" in t:
        parts.append(f" ({100 * t[f'{phase}_self_sum'] / inst:.1f}% of it)")
    return tuple(parts)


def repeats_line(o: dict) -> str:
    """How many repeats and warm-up runs ran and why they stopped (``profile(repeats="auto")``)."""
    n = o["repeats"]
    if o.get("repeats_rule") == "auto":
        rule = (f"auto ({AUTO_MIN}-{AUTO_MAX}): stop when the 95% interval of each median lies within "
                f"+-{100 * TOL_TOTAL:g}% for the whole run, +-{100 * TOL_CALL:g}% for calls over "
                f"{100 * CALL_SHARE:g}% of it")
        lp = o.get("least_precise") or {}
        if o.get("stopped") == "precise":
            why = f"stopped: precise enough after {n}"
        else:
            why = f"stopped at the maximum, {n}"
        if lp.get("name"):
            why += f" (least precise: {lp['name']} at {lp['tolerance_ratio']:.2f}x its tolerance)"
    else:
        rule, why = "fixed", f"{n} as asked"
    warm = f"; warm-up {o['warmup']} ({o.get('warmup_rule', 'fixed')})"
    return f"{rule}; {why}{warm}"


def latency_context(rep: "LatencyReport") -> tuple[Fact, ...]:
    o = rep.options
    root = rep.layers[0] if rep.layers else None
    facts = []
    if root is not None and root.input_shapes:
        facts.append(Fact("Inputs", ", ".join("[" + ", ".join(map(str, s)) + "]" for s in root.input_shapes[:4])))
    if o.get("unit") == "step":
        run = f"{o['steps']} training steps after {o['warmup']} warm-up on {rep.device}; medians per step"
        if o.get("optimizer"):
            run += f"; optimizer {o['optimizer']}"
    else:
        run = (f"{o['repeats']} timed repeats after {o['warmup']} warm-up on {rep.device}, forward"
               + (" and backward" if o.get("backward") else "") + "; medians")
    facts.append(Fact("Run", run))
    return tuple(facts)


def _spread(t, phase: str) -> str:
    v = t[f"{phase}_spread"]
    flag = f" {WIDE} over {100 * SPREAD_LIMIT:g}%" if v > SPREAD_LIMIT else ""
    return f"; spread (IQR/median) {100 * v:,.1f}%{flag}"


def latency_title(rep: "LatencyReport") -> str:
    """The table's first line: the model, and a warning where the whole run's times spread over
    SPREAD_LIMIT (issue 58)."""
    title = f"layerscope profile: {rep.model_name}"
    bad = wide_totals(rep.totals)
    if bad:
        title += (" -- UNRELIABLE TIMES: " + ", ".join(f"{ph} spread {100 * v:,.1f}%" for ph, v in bad.items())
                  + f" (over {100 * SPREAD_LIMIT:g}%)")
    return title


def latency_warnings(rep: "LatencyReport") -> list[tuple[str, str]]:
    """(label, sentence) for every figure of the report not to take at face value: the whole run's
    spread, calls whose times spread over SPREAD_LIMIT, and % of roof over 100% (issue 58)."""
    out = []
    bad = wide_totals(rep.totals)
    if bad:
        spreads = [f"the {ph}'s {100 * v:,.1f}%" for ph, v in bad.items()]
        out.append(("Unreliable", "spread (IQR/median over the repeats) " + " and ".join(spreads)
                    + f", over the {100 * SPREAD_LIMIT:g}% limit: the machine was busy or the run too short to "
                    "time, so no time here is a reliable figure (re-run on a quiet machine, or with more "
                    "repeats)"))
    rows = {r.name for r in rep.layers for ph in ("forward", "backward") if wide(getattr(r, ph))}
    if rows:
        out.append((WIDE, f"{len(rows)} call{'s' if len(rows) != 1 else ''} whose time spreads over "
                    f"{100 * SPREAD_LIMIT:g}% of its median (IQR over the repeats): not a reliable figure"))
    over = over_roof(rep.layers, rep.roofline)
    if over:
        r = rep.roofline
        names = ", ".join(f"{x.name} {100 * f:,.1f}%" for x, f in over[:3]) + (", ..." if len(over) > 3 else "")
        spread = sum(1 for x, _ in over if wide(x.forward))
        why = (f"{spread} of them spread over {100 * SPREAD_LIMIT:g}%, so their times are unreliable; "
               if spread else "")
        source = {"measured": "measured here, which a busy machine makes too low",
                  "table": "a datasheet's, for a device that may not be this one"}.get(r.source, "given")
        out.append(("Over roof", f"{len(over)} call{'s' if len(over) != 1 else ''} above 100% of the roof "
                    f"({names}): a time below the roofline's floor cannot be right, so either the time is "
                    f"wrong ({why}timing hooks and short calls distort it) or the peaks are ({source}: "
                    f"{r.peak_flops / 1e9:,.2f} GFLOP/s, {r.peak_bandwidth / 1e9:,.2f} GB/s); the figures "
                    "are shown as computed"))
    return out


def latency_footer(rep: "LatencyReport", top: int = 3) -> tuple[Fact, ...]:
    t = rep.totals
    if rep.options.get("unit") == "step":
        lines = [Fact("Step", (_ms(t["step"]), " = forward ", _ms(t["forward"]), " + backward ", _ms(t["backward"]),
                               " + optimizer ", _ms(t["optimizer"]), " + other (loss, data, loop) ",
                               _ms(t["other"]), ", of which ", _ms(t["graph_hooks"]),
                               f" the profiler's graph hooks; spread (IQR/median) {100 * t['step_spread']:.1f}%"))]
    else:
        lines = [Fact("Forward", _phase_line(t, "forward") + (_spread(t, "forward"),))]
        if rep.options.get("backward"):
            lines.append(Fact("Backward", _phase_line(t, "backward") +
                              ((_spread(t, "backward"),) if t.get("backward_spread") is not None else ())))
    if rep.options.get("stopped"):
        lines.append(Fact("Repeats", repeats_line(rep.options)))
    marked = [r.name for r in rep.layers for ph in ("forward", "backward") if imprecise(r, rep, ph)]
    if marked:
        n, runs = len(set(marked)), int(rep.totals.get("runs", 0))
        calls = f"{n} call{'s' if n != 1 else ''} over {100 * CALL_SHARE:g}% of the run"
        lines.append(Fact("~", f"{calls}: {runs} repeats give no 95% interval of a median ({AUTO_MIN} do)"
                          if runs < AUTO_MIN else f"{calls} whose median's 95% interval is wider than "
                          f"+-{100 * TOL_CALL:g}% (more repeats would narrow it)"))
    lines += [Fact(label, text) for label, text in latency_warnings(rep)]
    if rep.roofline is not None:
        r = rep.roofline
        lines.append(Fact("Roofline", (f"{r.name}: ", (r.peak_flops, "rate"), "FLOP/s, ", (r.peak_bandwidth, "rate"),
                                       f"B/s, ridge {r.ridge:.1f} FLOP/B ({r.source}); % of roof = achieved / "
                                       "attainable at the call's intensity")))
    if top > 0:
        for d, rows in rep.top_per_depth(top).items():
            parts: list = []
            for r in rows:
                parts += [", " if parts else "", f"{r.name} ", _ms(r.forward.median)]
                if r.backward:
                    parts += [" + ", _ms(r.backward.median), " bwd"]
            lines.append(Fact(f"Top depth {d}", tuple(parts)))
    lines += [Fact("Note", n) for n in rep.notes]
    return tuple(lines)


_LAYER_JSON = (
    ("bound", lambda r, rep: r.bound(rep.roofline)), ("roof_fraction", lambda r, rep: r.roof_fraction(rep.roofline)),
    "index", "path", "type", "depth", "call_index", "parent", "children", "params", "input_shapes", "output_shapes",
    ("forward_s", "forward"), ("forward_self_s", "forward_self"), ("backward_s", "backward"),
    ("backward_self_s", "backward_self"), "flops", "bytes_moved", "backward_flops", "backward_bytes",
    "flops_per_second", "bytes_per_second", "intensity", ("forward_span_s", "forward_span"),
    ("backward_span_s", "backward_span"),
)
LATENCY_JSON = (
    ("model", lambda rep, _: {"name": rep.model_name, "device": rep.device, "options": dict(rep.options)}),
    "totals", ("roofline", lambda rep, _: rep.roofline.to_dict() if rep.roofline else None),
    ("layers", "layers", _LAYER_JSON),
    # the report's notes, then what the footer warns of (issue 58), as "label: sentence"
    ("notes", lambda rep, _: [*rep.notes, *(f"{label}: {text}" for label, text in latency_warnings(rep))]),
)


@dataclass(frozen=True, slots=True)
class LatencyTotals(Totals):
    """Medians over the timed runs, in seconds. ``profile()``: the forward (and backward) with the
    timing hooks (``*_instrumented``) and without them (``*_plain``, with ``*_overhead`` the median
    of the per-run ratios), the sum of the calls' self times and the spread (IQR over median). A
    ``Profiler`` of training steps: the step and its forward, backward, optimizer and other time."""

    runs: int
    forward_instrumented: float | None = None
    forward_self_sum: float | None = None
    forward_spread: float | None = None
    forward_plain: float | None = None
    forward_overhead: float | None = None
    backward_instrumented: float | None = None
    backward_self_sum: float | None = None
    backward_spread: float | None = None
    backward_plain: float | None = None
    backward_overhead: float | None = None
    flops: int | None = None           # forward FLOPs of the model
    step: float | None = None
    forward: float | None = None
    backward: float | None = None
    optimizer: float | None = None
    other: float | None = None
    graph_hooks: float | None = None
    step_spread: float | None = None


@dataclass(frozen=True)
class LatencyReport(ReportRecord):
    model_name: str
    device: str
    options: dict
    layers: tuple[LatencyLayer, ...]
    totals: LatencyTotals          # a dict of its fields is taken too
    notes: tuple[str, ...] = ()
    roofline: Roofline | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.totals, LatencyTotals):
            object.__setattr__(self, "totals", LatencyTotals(**self.totals))

    kind = "latency"
    _html_part = "latency"

    def top(self, k: int = 5, depth: int | None = None, by: str = "forward_self") -> list[LatencyLayer]:
        """The k calls with the largest median ``by`` time (``forward``, ``forward_self``,
        ``backward``, ``backward_self``), optionally only at one depth."""
        rows = [r for r in self.layers if depth is None or r.depth == depth]
        return sorted(rows, key=lambda r: getattr(r, by).median if getattr(r, by) else 0.0, reverse=True)[:k]

    def top_per_depth(self, k: int = 3, by: str = "forward") -> dict[int, list[LatencyLayer]]:
        """The k slowest calls at each depth below the root (DeepSpeed's "top modules at each
        depth"), by median ``by`` time."""
        return {d: self.top(k, depth=d, by=by) for d in sorted({r.depth for r in self.layers}) if d > 0}

    def json_fields(self, **_: Any) -> tuple:
        return LATENCY_JSON

    def table_model(self, depth: int | None = None, columns=None, top: int = 3, **_: Any) -> Table:
        cols = latency_columns(self)
        cols = cols if columns == "all" else select_columns(cols, columns, InputError)
        return tree_table("latency", latency_title(self), self, self.layers, cols, depth,
                          context=latency_context(self), footer=latency_footer(self, top))

    def table(self, depth: int | None = None, top: int = 3, fold: bool = True, columns=None,
              width: int | None = None) -> str:
        """The tree table; the footer names the ``top`` slowest calls at each depth (0: none)."""
        return self._text(depth, columns, fold, width, top=top)

    def rich_table(self, depth: int | None = None, top: int = 3, fold: bool = True, columns=None,
                   width: int | None = None):
        return self._rich(depth, columns, fold, width, top=top)

    def print(self, depth: int | None = None, top: int = 3, file: TextIO | None = None, fold: bool = True,
              columns=None) -> None:
        self._print(file, depth, columns, fold, top=top)

    def to_chrome_trace(self, path: str | None = None) -> str:
        """Chrome trace / Perfetto JSON of the module spans of one repeat (the one whose forward is
        the median), forward and backward on separate tracks; open in ui.perfetto.dev or
        chrome://tracing."""
        return write_text(json.dumps(rendered("chrome_trace")(self)), path)

    def __repr__(self) -> str:
        t = self.totals
        return (f"<LatencyReport {self.model_name}: forward {t['forward_instrumented'] * 1e3:.3f} ms "
                f"({len(self.layers)} calls, {t['runs']} {self.options.get('unit', 'repeat')}s on "
                f"{self.device})>")
