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
           "latency_row", "render_latency_csv"]


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
    body = []
    for name, r in zip(names, rows):
        row = [name, _shape(r.input_shapes), _shape(r.output_shapes), si(r.params) if r.params else "--",
               _ms(r.forward), _ms(r.forward_self), f"{100 * r.forward_self.median / total:.1f}%"]
        if back:
            row += [_ms(r.backward), _ms(r.backward_self)]
        row += [si(r.flops_per_second) if r.flops_per_second else "--",
                f"{r.intensity:.2f}" if r.intensity is not None else "--"]
        body.append(row)
    return header, body


def latency_footer(rep: "LatencyReport") -> list[tuple[str, str]]:
    t, o = rep.totals, rep.options
    lines = [("Run", f"{o['repeats']} timed repeats after {o['warmup']} warm-up on {rep.device}; "
                     f"medians")]
    lines.append(("Forward", f"{t['forward_plain'] * 1e3:.3f} ms uninstrumented, "
                             f"{t['forward_instrumented'] * 1e3:.3f} ms with hooks "
                             f"({100 * t['forward_overhead']:+.1f}%), sum of self times "
                             f"{t['forward_self_sum'] * 1e3:.3f} ms; spread (IQR/median) "
                             f"{100 * t['forward_spread']:.1f}%"))
    if o.get("backward"):
        lines.append(("Backward", f"{t['backward_plain'] * 1e3:.3f} ms uninstrumented, "
                                  f"{t['backward_instrumented'] * 1e3:.3f} ms with hooks "
                                  f"({100 * t['backward_overhead']:+.1f}%), sum of self times "
                                  f"{t['backward_self_sum'] * 1e3:.3f} ms"))
    for note in rep.notes:
        lines.append(("Note", note))
    return lines


def render_latency_text(rep: "LatencyReport", depth: int | None = None) -> str:
    from .text import text_table
    header, body = latency_rows(rep, depth)
    return text_table(header, body, latency_footer(rep))


def render_latency_rich(rep: "LatencyReport", depth: int | None = None):
    from .table import rich_table
    header, body = latency_rows(rep, depth)
    return rich_table(f"layerscope profile: {rep.model_name}", header, body, latency_footer(rep))


def _timing(t: "Timing | None") -> dict[str, float] | None:
    return None if t is None else {"median": t.median, "p25": t.p25, "p75": t.p75, "min": t.min, "max": t.max}


def _layer_dict(r: "LatencyLayer") -> dict[str, Any]:
    return {
        "index": r.index, "path": r.path, "type": r.type, "depth": r.depth, "call_index": r.call_index,
        "parent": r.parent, "children": list(r.children), "params": r.params,
        "input_shapes": [list(s) for s in r.input_shapes], "output_shapes": [list(s) for s in r.output_shapes],
        "forward_s": _timing(r.forward), "forward_self_s": _timing(r.forward_self),
        "backward_s": _timing(r.backward), "backward_self_s": _timing(r.backward_self),
        "flops": r.flops, "bytes_moved": r.bytes_moved, "backward_flops": r.backward_flops,
        "backward_bytes": r.backward_bytes, "flops_per_second": r.flops_per_second,
        "bytes_per_second": r.bytes_per_second, "intensity": r.intensity,
    }


def latency_dict(rep: "LatencyReport") -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "kind": "latency",
            "model": {"name": rep.model_name, "device": rep.device, "options": dict(rep.options)},
            "totals": dict(rep.totals), "layers": [_layer_dict(r) for r in rep.layers],
            "notes": list(rep.notes)}


_CSV_FIELDS = ("index", "path", "type", "depth", "call_index", "parent", "params", "forward_ms",
               "forward_p25_ms", "forward_p75_ms", "forward_self_ms", "backward_ms", "backward_self_ms",
               "flops", "bytes_moved", "flops_per_second", "intensity")


def latency_row(r: "LatencyLayer") -> dict[str, Any]:
    def ms(t, k="median"):
        return "" if t is None else getattr(t, k) * 1e3
    return {"index": r.index, "path": r.path, "type": r.type, "depth": r.depth, "call_index": r.call_index,
            "parent": "" if r.parent is None else r.parent, "params": r.params,
            "forward_ms": ms(r.forward), "forward_p25_ms": ms(r.forward, "p25"),
            "forward_p75_ms": ms(r.forward, "p75"), "forward_self_ms": ms(r.forward_self),
            "backward_ms": ms(r.backward), "backward_self_ms": ms(r.backward_self), "flops": r.flops,
            "bytes_moved": r.bytes_moved, "flops_per_second": r.flops_per_second or "",
            "intensity": "" if r.intensity is None else r.intensity}


def render_latency_csv(rep: "LatencyReport") -> str:
    from .csv import csv_text
    return csv_text(_CSV_FIELDS, (latency_row(r) for r in rep.layers))
