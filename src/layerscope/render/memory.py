"""The JSON of a MemoryReport (its tables come from layerscope.reports.memory's columns)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..reports.memory import MemoryLayer, MemoryReport

__all__ = ["memory_dict"]


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
        "model": {"name": rep.model_name, "options": dict(rep.options)},
        "peak_bytes": rep.peak_bytes,
        "breakdown": rep.breakdown,
        "static": dict(rep.static),
        "totals": dict(rep.totals.items()),
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
