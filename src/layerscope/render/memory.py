"""Rendering of a MemoryReport: the per-layer memory table (text, rich), JSON and CSV.

Per layer (subtree of each module call): input bytes, bytes saved for backward, parameter,
gradient and optimizer-state bytes, and their total; the footer gives the step peaks and the
breakdown by category at the peak.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .columns import _tree_names, _visible, fold_runs
from .json import SCHEMA_VERSION
from .units import iec

if TYPE_CHECKING:
    from ..memory_report import MemoryLayer, MemoryReport

__all__ = ["memory_rows", "memory_footer", "render_memory_text", "render_memory_rich", "memory_dict",
           "memory_row", "render_memory_csv"]

_HEADER = ["Layer (type)", "Input", "Saved for bwd", "Params", "Grads", "Optimizer", "Total",
           "Fwd peak", "Bwd peak"]


def _b(n: int | None) -> str:
    return iec(n) if n else "--"


def memory_rows(rep: "MemoryReport", depth: int | None, fold: bool = True) -> tuple[list[str], list[list[str]]]:
    rows = _visible(rep, depth)
    names = _tree_names(rows, rep)
    body = []
    for name, r in zip(names, rows):
        body.append([name, _b(r.input_bytes), _b(r.saved_total), _b(r.param_total), _b(r.grad_total),
                     _b(r.optimizer_total), _b(r.total), _b(r.forward.peak if r.forward else None),
                     _b(r.backward.peak if r.backward else None)])
    # the peaks depend on when a call ran (what earlier blocks left alive), not on the block
    volatile = {7: (lambda r: r.forward.peak if r.forward else None, _b),
                8: (lambda r: r.backward.peak if r.backward else None, _b)}
    return list(_HEADER), fold_runs(rows, body, volatile=volatile) if fold else body


def memory_footer(rep: "MemoryReport") -> list[tuple[str, str]]:
    o, t = rep.options, rep.totals
    what = "training step" if o["training"] else "inference forward (no grad)"
    extras = [f"optimizer {o['optimizer']}" if o.get("optimizer") else None,
              f"autocast {o['autocast']}" if o.get("autocast") else None,
              f"accumulation x{o['accumulation']}" if o.get("accumulation", 1) > 1 else None]
    lines = [("Run", ", ".join([what] + [e for e in extras if e])
              + f" on {o['device']}" + (" (simulated)" if o.get("simulated") else " (real tensors)"))]
    for s in rep.steps:
        where = s.peak_layer if s.peak_layer else ("(root)" if s.peak_layer == "" else "outside the model")
        label = f"Peak, step {s.step + 1}" if len(rep.steps) > 1 else "Peak"
        lines.append((label, f"{iec(s.peak_bytes)} in {s.peak_phase} at {where}"))
    bd = rep.breakdown
    lines.append(("At the peak", ", ".join(f"{k.replace('_', ' ')} {iec(v)}" for k, v in bd.items() if v)
                  or "nothing"))
    lines += [
        ("Parameters", iec(t["parameter_bytes"])),
        ("Gradients", iec(t["gradient_bytes"])),
        ("Optimizer state", iec(t["optimizer_bytes"])),
        ("Saved for backward", iec(t["saved_activation_bytes"])),
    ]
    if o.get("allocation_block", 1) > 1:
        lines.append(("Allocator", f"sizes rounded to {o['allocation_block']}-byte blocks"))
    m = rep.measured
    if m is not None:
        diff = (rep.peak_bytes - m.peak_bytes) / m.peak_bytes * 100 if m.peak_bytes else 0.0
        lines.append(("Measured peak", f"{iec(m.peak_bytes)} ({m.method}); predicted {diff:+.2f}%"))
        if m.reserved_bytes is not None:
            lines.append(("Allocator reserved", f"{iec(m.reserved_bytes)} "
                          f"({iec(m.reserved_bytes - m.peak_bytes)} reserved but unused at most)"))
        if m.context_bytes is not None:
            lines.append(("Outside the allocator", f"{iec(m.context_bytes)} (CUDA context and other)"))
    limit = o.get("limit")
    if limit:
        fits = rep.peak_bytes <= limit
        lines.append(("Limit", f"{iec(limit)}: " + ("fits" if fits else "DOES NOT FIT")))
    for note in rep.notes:
        lines.append(("Note", note))
    return lines


def render_memory_text(rep: "MemoryReport", depth: int | None = None, fold: bool = True) -> str:
    from .text import text_table
    header, body = memory_rows(rep, depth, fold)
    return text_table(header, body, memory_footer(rep))


def render_memory_rich(rep: "MemoryReport", depth: int | None = None, fold: bool = True):
    from .table import rich_table
    header, body = memory_rows(rep, depth, fold)
    return rich_table(f"layerscope memory: {rep.model_name}", header, body, memory_footer(rep))


def _call(c) -> dict[str, int] | None:
    return None if c is None else {"entry": c.entry, "exit": c.exit, "peak": c.peak}


def _layer_dict(r: "MemoryLayer") -> dict[str, Any]:
    return {
        "index": r.index, "path": r.path, "type": r.type, "depth": r.depth, "call_index": r.call_index,
        "parent": r.parent, "children": list(r.children), "input_bytes": r.input_bytes,
        "saved_bytes": r.saved_bytes, "param_bytes": r.param_bytes, "grad_bytes": r.grad_bytes,
        "optimizer_bytes": r.optimizer_bytes, "saved_total": r.saved_total,
        "param_total": r.param_total, "grad_total": r.grad_total, "optimizer_total": r.optimizer_total,
        "total": r.total, "forward": _call(r.forward), "backward": _call(r.backward),
    }


def memory_dict(rep: "MemoryReport", timeline: bool = True) -> dict[str, Any]:
    m = rep.measured
    out: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "kind": "memory",
        "model": {"name": rep.model_name, "options": dict(rep.options)},
        "peak_bytes": rep.peak_bytes,
        "breakdown": rep.breakdown,
        "static": dict(rep.static),
        "totals": dict(rep.totals),
        "steps": [{"step": s.step, "peak_bytes": s.peak_bytes, "peak_op": s.peak_op,
                   "peak_phase": s.peak_phase, "peak_layer": s.peak_layer, "breakdown": dict(s.breakdown),
                   "start_bytes": s.start_bytes, "end_bytes": s.end_bytes,
                   "phases": [{"phase": p.phase, "first_op": p.first_op, "last_op": p.last_op,
                               "peak_bytes": p.peak_bytes} for p in s.phases]} for s in rep.steps],
        "layers": [_layer_dict(r) for r in rep.layers],
        "measured": None if m is None else {
            "method": m.method, "device": m.device, "peak_bytes": m.peak_bytes,
            "before_bytes": m.before_bytes, "step_peaks": list(m.step_peaks),
            "reserved_bytes": m.reserved_bytes, "context_bytes": m.context_bytes, "notes": list(m.notes)},
        "notes": list(rep.notes),
    }
    if timeline:
        tl = rep.timeline
        out["timeline"] = {
            "categories": list(tl.categories),
            "bytes": {c: list(col) for c, col in zip(tl.categories, tl.bytes)},
            "step": list(tl.step), "phase": list(tl.phase),
            "markers": [{"kind": k.kind, "label": k.label, "first_op": k.first_op, "last_op": k.last_op}
                        for k in tl.markers],
        }
    return out


_CSV_FIELDS = ("index", "path", "type", "depth", "call_index", "parent", "input_bytes", "saved_bytes",
               "param_bytes", "grad_bytes", "optimizer_bytes", "saved_total", "param_total",
               "grad_total", "optimizer_total", "total", "forward_entry", "forward_exit", "forward_peak",
               "backward_entry", "backward_exit", "backward_peak")


def memory_row(r: "MemoryLayer") -> dict[str, Any]:
    row = {k: v for k, v in _layer_dict(r).items() if k in _CSV_FIELDS}
    row["parent"] = "" if r.parent is None else r.parent
    for phase, c in (("forward", r.forward), ("backward", r.backward)):
        for k in ("entry", "exit", "peak"):
            row[f"{phase}_{k}"] = "" if c is None else getattr(c, k)
    return row


def render_memory_csv(rep: "MemoryReport") -> str:
    from .csv import csv_text
    return csv_text(_CSV_FIELDS, (memory_row(r) for r in rep.layers))
