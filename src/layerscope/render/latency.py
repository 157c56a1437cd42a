"""Rendering of a LatencyReport: the seed's tree view (params, latency, % latency, shapes), JSON, CSV."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .columns import _tree_names, _visible
from .json import SCHEMA_VERSION
from .units import si

if TYPE_CHECKING:
    from ..analyses.latency import Timing
    from ..latency_report import LatencyLayer, LatencyReport

__all__ = ["latency_rows", "latency_footer", "render_latency_text", "render_latency_rich", "latency_dict",
           "latency_row", "render_latency_csv", "chrome_trace"]


def _ms(t: "Timing | None") -> str:
    return "--" if t is None else f"{t.median * 1e3:.3f}"


def _shape(shapes) -> str:
    return ", ".join(str(list(s)) for s in shapes) if shapes else "--"


def latency_rows(rep: "LatencyReport", depth: int | None) -> tuple[list[str], list[list[str]]]:
    rows = _visible(rep, depth)
    names = _tree_names(rows, rep)
    back = rep.options.get("backward")
    total = sum(r.forward_self.median for r in rep.layers) or 1.0
    header = ["Layer (type)", "Input shape", "Output shape", "Params", "Fwd ms", "Fwd self ms", "% self"]
    if back:
        header += ["Bwd ms", "Bwd self ms"]
    header += ["FLOP/s", "FLOP/B"]
    roof = rep.roofline
    if roof is not None:
        header += ["Bound", "% of roof"]
    body = []
    for name, r in zip(names, rows):
        row = [name, _shape(r.input_shapes), _shape(r.output_shapes), si(r.params) if r.params else "--",
               _ms(r.forward), _ms(r.forward_self), f"{100 * r.forward_self.median / total:.1f}%"]
        if back:
            row += [_ms(r.backward), _ms(r.backward_self)]
        row += [si(r.flops_per_second) if r.flops_per_second else "--",
                f"{r.intensity:.2f}" if r.intensity is not None else "--"]
        if roof is not None:
            frac = r.roof_fraction(roof)
            row += [r.bound(roof) or "--", "--" if frac is None else f"{100 * frac:.1f}%"]
        body.append(row)
    return header, body


def _phase_line(t: dict, phase: str) -> str:
    line = ""
    if f"{phase}_plain" in t:
        line = (f"{t[f'{phase}_plain'] * 1e3:.3f} ms uninstrumented, {t[f'{phase}_instrumented'] * 1e3:.3f} ms "
                f"with hooks ({100 * t[f'{phase}_overhead']:+.1f}%), ")
    inst = t[f"{phase}_instrumented"]
    share = f" ({100 * t[f'{phase}_self_sum'] / inst:.1f}% of it)" if inst and line else ""
    return line + f"sum of self times {t[f'{phase}_self_sum'] * 1e3:.3f} ms{share}"


def latency_footer(rep: "LatencyReport", top: int = 3) -> list[tuple[str, str]]:
    t, o = rep.totals, rep.options
    if o.get("unit") == "step":
        lines = [("Run", f"{o['steps']} steps after {o['warmup']} warm-up on {rep.device}; medians per step")]
        lines.append(("Step", f"{t['step'] * 1e3:.3f} ms = forward {t['forward'] * 1e3:.3f} + backward "
                              f"{t['backward'] * 1e3:.3f} + optimizer {t['optimizer'] * 1e3:.3f} + other "
                              f"(loss, data, loop) {t['other'] * 1e3:.3f}, of which {t['graph_hooks'] * 1e3:.3f} "
                              f"the profiler's graph hooks; spread (IQR/median) {100 * t['step_spread']:.1f}%"))
    else:
        lines = [("Run", f"{o['repeats']} timed repeats after {o['warmup']} warm-up on {rep.device}; medians")]
        lines.append(("Forward", _phase_line(t, "forward") +
                      f"; spread (IQR/median) {100 * t['forward_spread']:.1f}%"))
        if o.get("backward"):
            lines.append(("Backward", _phase_line(t, "backward")))
    if rep.roofline is not None:
        r = rep.roofline
        lines.append(("Roofline", f"{r.name}: {si(r.peak_flops)}FLOP/s, {si(r.peak_bandwidth)}B/s, ridge "
                                  f"{r.ridge:.1f} FLOP/B ({r.source}); % of roof = achieved / attainable "
                                  "at the call's intensity"))
    if top > 0:
        for d, rows in rep.top_per_depth(top).items():
            lines.append((f"Top depth {d}", ", ".join(f"{r.name} {r.forward.median * 1e3:.3f} ms" +
                                                       (f" + {r.backward.median * 1e3:.3f} bwd" if r.backward else "")
                                                       for r in rows)))
    for note in rep.notes:
        lines.append(("Note", note))
    return lines


def render_latency_text(rep: "LatencyReport", depth: int | None = None, top: int = 3) -> str:
    from .text import text_table
    header, body = latency_rows(rep, depth)
    return text_table(header, body, latency_footer(rep, top))


def render_latency_rich(rep: "LatencyReport", depth: int | None = None, top: int = 3):
    from .table import rich_table
    header, body = latency_rows(rep, depth)
    return rich_table(f"layerscope profile: {rep.model_name}", header, body, latency_footer(rep, top))


def _timing(t: "Timing | None") -> dict[str, float] | None:
    return None if t is None else {"median": t.median, "p25": t.p25, "p75": t.p75, "min": t.min, "max": t.max}


def _layer_dict(r: "LatencyLayer", roof) -> dict[str, Any]:
    return {"bound": r.bound(roof), "roof_fraction": r.roof_fraction(roof), **{
        "index": r.index, "path": r.path, "type": r.type, "depth": r.depth, "call_index": r.call_index,
        "parent": r.parent, "children": list(r.children), "params": r.params,
        "input_shapes": [list(s) for s in r.input_shapes], "output_shapes": [list(s) for s in r.output_shapes],
        "forward_s": _timing(r.forward), "forward_self_s": _timing(r.forward_self),
        "backward_s": _timing(r.backward), "backward_self_s": _timing(r.backward_self),
        "flops": r.flops, "bytes_moved": r.bytes_moved, "backward_flops": r.backward_flops,
        "backward_bytes": r.backward_bytes, "flops_per_second": r.flops_per_second,
        "bytes_per_second": r.bytes_per_second, "intensity": r.intensity,
        "forward_span_s": r.forward_span, "backward_span_s": r.backward_span,
    }}


def latency_dict(rep: "LatencyReport") -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "kind": "latency",
            "model": {"name": rep.model_name, "device": rep.device, "options": dict(rep.options)},
            "totals": dict(rep.totals), "roofline": rep.roofline.to_dict() if rep.roofline else None,
            "layers": [_layer_dict(r, rep.roofline) for r in rep.layers], "notes": list(rep.notes)}


_CSV_FIELDS = ("index", "path", "type", "depth", "call_index", "parent", "params", "forward_ms",
               "forward_p25_ms", "forward_p75_ms", "forward_self_ms", "backward_ms", "backward_self_ms",
               "flops", "bytes_moved", "flops_per_second", "intensity", "bound", "roof_fraction")


def latency_row(r: "LatencyLayer", roof=None) -> dict[str, Any]:
    def ms(t, k="median"):
        return "" if t is None else getattr(t, k) * 1e3
    return {"index": r.index, "path": r.path, "type": r.type, "depth": r.depth, "call_index": r.call_index,
            "parent": "" if r.parent is None else r.parent, "params": r.params,
            "forward_ms": ms(r.forward), "forward_p25_ms": ms(r.forward, "p25"),
            "forward_p75_ms": ms(r.forward, "p75"), "forward_self_ms": ms(r.forward_self),
            "backward_ms": ms(r.backward), "backward_self_ms": ms(r.backward_self), "flops": r.flops,
            "bytes_moved": r.bytes_moved, "flops_per_second": r.flops_per_second or "",
            "intensity": "" if r.intensity is None else r.intensity, "bound": r.bound(roof) or "",
            "roof_fraction": "" if r.roof_fraction(roof) is None else r.roof_fraction(roof)}


def render_latency_csv(rep: "LatencyReport") -> str:
    from .csv import csv_text
    return csv_text(_CSV_FIELDS, (latency_row(r, rep.roofline) for r in rep.layers))


def _lanes(spans: list[tuple[float, float, Any]]) -> list[tuple[int, float, float, Any]]:
    """Put spans on as few tracks as keep every track properly nested (a trace viewer drops or
    cuts slices that overlap without nesting): (track, start, end, payload)."""
    lanes: list[list[float]] = []          # per track: the ends of the spans still open
    out = []
    for start, end, payload in sorted(spans, key=lambda s: (s[0], -s[1])):
        for k, open_ends in enumerate(lanes):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            if not open_ends or open_ends[-1] >= end:
                break
        else:
            k = len(lanes)
            lanes.append([])
        lanes[k].append(end)
        out.append((k, start, end, payload))
    return out


def chrome_trace(rep: "LatencyReport") -> dict[str, Any]:
    """Trace Event Format (Chrome's, which Perfetto reads): one complete event per module call and
    phase of the representative run, in microseconds from its start; forward on the first tracks,
    backward after them."""
    events: list[dict[str, Any]] = []
    tid = 0
    for phase in ("forward", "backward"):
        spans = [(s[0], s[1], r) for r in rep.layers if (s := getattr(r, f"{phase}_span")) is not None]
        placed = _lanes(spans)
        n = 1 + max((k for k, *_ in placed), default=-1)
        for k in range(n):
            events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid + k,
                           "args": {"name": phase if n == 1 else f"{phase} {k + 1}"}})
        for k, start, end, r in placed:
            events.append({"ph": "X", "name": r.name, "cat": phase, "pid": 1, "tid": tid + k,
                           "ts": start * 1e6, "dur": (end - start) * 1e6,
                           "args": {"type": r.type, "call_index": r.call_index, "depth": r.depth,
                                    "flops": r.flops if phase == "forward" else r.backward_flops}})
        tid += n
    events.insert(0, {"ph": "M", "name": "process_name", "pid": 1,
                      "args": {"name": f"layerscope {rep.model_name} on {rep.device}"}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"tool": "layerscope", "model": rep.model_name, "device": rep.device}}
