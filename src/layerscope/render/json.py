"""JSON export with a versioned schema, described in docs/json.md.

Every report: schema_version, kind (summary, memory, latency, stage_plan, comparison), the kind's own
keys (a summary: model, totals, layers, coverage), then context (what the numbers are for) and
columns (the kind's table columns: key, header, unit). Bump SCHEMA_VERSION's major number when a key
changes meaning or disappears; adding keys is a minor bump.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from .units import fmt

if TYPE_CHECKING:
    from ..reports.summary import Report

SCHEMA_VERSION = "1.4"   # 1.1: every report names its kind; 1.2: context and columns; 1.3: plan step times;
#                          1.4: zero bubble's weight_time (stages), weight_flops and deferred_bytes (units)
#                          (docs/json.md)


def _costs(c) -> dict[str, int]:
    return {"macs": c.macs, "flops": c.flops, "bytes_read": c.bytes_read, "bytes_written": c.bytes_written}


def layer_dict(r) -> dict[str, Any]:
    return {
        "index": r.index, "path": r.path, "type": r.type, "depth": r.depth, "call_index": r.call_index,
        "parent": r.parent, "children": list(r.children),
        "inputs": [asdict(s) for s in r.inputs], "outputs": [asdict(s) for s in r.outputs],
        "params": [asdict(p) for p in r.params], "buffers": [asdict(b) for b in r.buffers],
        "num_params": r.num_params, "trainable_params": r.trainable_params,
        "subtree_params": r.subtree_params,
        "kernel_size": list(r.kernel_size) if r.kernel_size else None,
        "forward": _costs(r.forward), "backward": _costs(r.backward),
        "forward_total": _costs(r.forward_total), "backward_total": _costs(r.backward_total),
        "uncounted_ops": r.uncounted_ops,
        "receptive_field": asdict(r.receptive_field) if r.receptive_field else None,
    }


def report_dict(rep: "Report") -> dict[str, Any]:
    t = rep.totals
    return {
        "model": {"name": rep.model_name, "options": dict(rep.trace.options)},
        "totals": {
            "params": t.params, "trainable_params": t.trainable_params, "frozen_params": t.frozen_params,
            "shared_params": t.shared_params, "param_bytes": t.param_bytes, "buffers": t.buffers,
            "buffer_bytes": t.buffer_bytes, "input_bytes": t.input_bytes, "output_bytes": t.output_bytes,
            "macs": t.forward.macs, "flops": t.forward.flops, "bytes_read": t.forward.bytes_read,
            "bytes_written": t.forward.bytes_written,
            "backward": _costs(t.backward) if rep.trace.backward else None,
            "complete": t.complete,
        },
        "layers": [layer_dict(r) for r in rep.layers],
        "coverage": {
            "complete": rep.coverage.complete,
            "uncounted": [{"op": u.op, "count": u.count, "layers": list(u.layers)}
                          for u in rep.coverage.uncounted],
            "uncalled_modules": list(rep.coverage.uncalled_modules),
        },
        **({"graph": rep.graph.to_dict()} if getattr(rep, "graph", None) is not None else {}),
    }


def _fact(f) -> dict[str, Any]:
    v = f.value
    if isinstance(v, tuple) and f.unit == "text":
        from .layout import fact_text
        v = fact_text(f)
    return {"label": f.label, "value": v, "unit": f.unit}


def table_meta(table) -> dict[str, Any]:
    """What every report's JSON says about its table: the context the numbers are for (inputs,
    dtypes, mode, device, optimizer, schedule) and its columns (key, header, unit)."""
    return {"context": [_fact(f) for f in table.context],
            "columns": [{"key": c.key, "header": c.header, "unit": c.unit, "default": c.default,
                         **({} if c.fold else {"fold": False, "fold_with": c.fold_with})}
                        for c in table.columns]}


def report_json(report, **options) -> dict[str, Any]:
    """The versioned JSON of any report kind (docs/json.md): schema_version, kind, the kind's own
    keys, then context and columns."""
    from .latency import latency_dict
    from .memory import memory_dict
    from .plan import plan_dict
    kinds = {"summary": report_dict, "memory": memory_dict, "latency": latency_dict, "stage_plan": plan_dict,
             "comparison": compare_dict}
    d = kinds[report.kind](report, **options)
    table = report.table_model(None, "all", **report._csv_view())
    rows = d.get("stages") if report.kind == "stage_plan" else d.get("layers")
    if rows is not None and len(rows) == len(table.rows):
        for row, r in zip(rows, table.rows):
            row["values"] = {c.key: _plain(v) for c, v in zip(table.columns, r.values)}
            shown = {c.key: (t if t is not None else fmt(c.unit, v)) + x
                     for c, v, t, x in zip(table.columns, r.values, r.texts, r.suffixes) if t is not None or x}
            if shown:
                row["shown"] = shown
    return {"schema_version": SCHEMA_VERSION, "kind": report.kind, **d, **table_meta(table)}


def _plain(v: Any) -> Any:
    """A column value as JSON holds it: tuples (shapes) as lists."""
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


def compare_dict(cmp) -> dict[str, Any]:
    return {"compared": cmp.compared, "a": cmp.names[0], "b": cmp.names[1],
            "totals": {"a": cmp.totals[0], "b": cmp.totals[1]}, "layers": cmp.rows()}
