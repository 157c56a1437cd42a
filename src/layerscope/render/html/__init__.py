"""Self-contained HTML report: one file, no network at view time.

The page embeds the data of the reports it shows and draws it with inline JavaScript into SVG:

* ``context``: what the numbers are for (inputs and their dtypes, bytes per weight, mode, device,
  optimizer, pipeline schedule), the page's first card;
* ``tree``: the layer tree, one row per module call with the values its columns show, and the folds
  of repeated blocks (``layers.0-79: LlamaDecoderLayer x80 (each)``) found by
  :func:`layerscope.render.fold.find_folds` on a :class:`~layerscope.reports.Table` of those rows:
  the same folding the terminal does. The page shows a fold as one row and unfolds it on a click;
* ``charts``: per-layer charts whose bars are roles (:func:`layerscope.render.fold.role`: the 80
  copies of ``model.layers.*.mlp.down_proj`` are one bar, their sum, ``x80``), the ``TOP`` largest;
  the rest is a line of text under the chart, never a bar that would set the scale;
* the reports' own dicts, slimmed (no per-layer lists: the tree and charts carry what is drawn; the
  memory timeline cut to at most ``MAX_POINTS`` points, each bucket's highest kept so the peak
  survives), for the cards, the timeline (a fixed colour per memory category, ``COLORS``), the
  pipeline stages and coverage.

``html_page`` and ``page_data`` take report objects or their ``to_dict()`` dicts (saved JSON).
"""

from __future__ import annotations

import html
import json
from importlib import resources
from string import Template
from types import SimpleNamespace
from typing import Any

from ...capture.storage import CATEGORIES
from ...reports import Column, tree_table
from ..fold import find_folds, role, subtree_ends

__all__ = ["html_page", "page_data", "tree_data", "role_chart", "chart_role", "context_facts", "visible_rows", "MAX_POINTS", "TOP",
           "COLORS"]

MAX_POINTS = 1500        # memory timeline points kept
TOP = 20                 # bars per chart

# one colour per memory category, the same on every page (a category missing from a run leaves a gap
# in the palette, it does not shift the others)
COLORS = dict(zip(CATEGORIES, ("#2f6fde", "#8c8c8c", "#e8833a", "#c94f7c", "#4fb3bf", "#d4b232", "#3aa35b",
                               "#8a63d2")))


def _slim_timeline(tl: dict | None) -> dict | None:
    if not tl:
        return None
    cats = [c for c in tl["categories"] if any(tl["bytes"][c])]
    n = len(tl["step"])
    if not n or not cats:
        return None
    total = [sum(tl["bytes"][c][i] for c in cats) for i in range(n)]
    size = max(1, -(-n // MAX_POINTS))
    keep = []
    for start in range(0, n, size):
        stop = min(n, start + size)
        keep.append(max(range(start, stop), key=total.__getitem__))
    return {"categories": cats, "x": keep, "bytes": {c: [tl["bytes"][c][i] for i in keep] for c in cats},
            "phase": [tl["phase"][i] for i in keep], "ops": n,
            "markers": [m for m in tl["markers"] if m["kind"] in ("step", "phase")]}


def _as_dict(report) -> dict | None:
    return report.to_dict() if hasattr(report, "to_dict") else report


def _median(stat: dict | None):
    return (stat or {}).get("median")


def _key(r: dict) -> tuple[str, int]:
    return r["path"], r["call_index"]


# ---- the layer tree ---------------------------------------------------------------------------------

def _tree_columns(summary: dict | None, memory: dict | None, latency: dict | None) -> list[Column]:
    """The tree's columns; a record is a ``_Rec`` of the base report's layer dict (``raw``)."""
    cols: list[Column] = []
    if summary is not None:
        cols += [
            Column("out", "Output shape", "shape",
                   lambda r, _: tuple(r.raw["outputs"][0]["shape"]) if r.raw.get("outputs") else None),
            Column("params", "Params", "params", lambda r, _: r.raw["subtree_params"],
                   text=lambda r, _: "(reused)" if r.call_index else None),
            Column("macs", "MACs", "count", lambda r, _: r.raw["forward_total"]["macs"]),
            Column("flops", "FLOPs", "count", lambda r, _: r.raw["forward_total"]["flops"]),
            Column("read", "Read", "bytes", lambda r, _: r.raw["forward_total"]["bytes_read"]),
            Column("written", "Written", "bytes", lambda r, _: r.raw["forward_total"]["bytes_written"]),
        ]
    if memory is not None:
        mem = {_key(r): r for r in memory["layers"]}
        cols.append(Column("memory", "Memory", "bytes",
                           lambda r, _: (mem.get((r.path, r.call_index)) or {}).get("total")))
    if latency is not None:
        lat = {_key(r): r for r in latency["layers"]}
        # a timing differs from block to block by noise: a fold ignores it, its row shows the highest
        cols.append(Column("fwd_self", "Fwd self", "seconds",
                           lambda r, _: _median((lat.get((r.path, r.call_index)) or {}).get("forward_self_s")),
                           fold=False))
    return cols


class _Rec(SimpleNamespace):
    """A layer of a report's dict as the table model reads it: index, path, type, depth, call_index,
    parent, and the dict itself (``raw``)."""


def tree_data(summary: dict | None = None, memory: dict | None = None, latency: dict | None = None) -> dict | None:
    """The layer tree the page shows: its columns, its rows (pre-order; ``e``: the position of the
    last row of the row's subtree) and the folds of repeated blocks (positions in ``rows``), found
    by ``find_folds`` on a Table of the base report's layers (the summary's, else memory's, else
    latency's)."""
    base = next((d for d in (summary, memory, latency) if d is not None), None)
    if base is None:
        return None
    columns = _tree_columns(summary, memory, latency)
    recs = [_Rec(index=r["index"], path=r["path"], type=r["type"], depth=r["depth"], call_index=r["call_index"],
                 parent=r["parent"], raw=r) for r in base["layers"]]
    table = tree_table("html", "", base, recs, columns)
    rows = table.rows
    ends = subtree_ends(rows)
    out_rows = []
    for pos, r in enumerate(rows):
        row: dict[str, Any] = {"i": r.index, "path": r.path, "type": r.type, "depth": r.depth, "call": r.call_index,
                               "e": ends[pos], "v": list(r.values)}
        if any(t is not None for t in r.texts):
            row["t"] = list(r.texts)
        out_rows.append(row)
    folds = []
    loose = [j for j, c in enumerate(columns) if not c.fold]
    for f in find_folds(table):
        parent_path = f.prefix[:-1] if f.prefix.endswith(".") else f.prefix
        local = parent_path.rsplit(".", 1)[-1] + "." if parent_path else ""
        fold = {"at": f.blocks[0], "end": f.end, "count": f.count, "label": f"{local}{f.first}-{f.last}",
                "type": rows[f.blocks[0]].type, "blocks": list(f.blocks)}
        if loose:
            # the columns a fold ignores: the highest over the run's blocks, on the fold's row
            top = {}
            for j in loose:
                vals = [rows[b].values[j] for b in f.blocks if rows[b].values[j] is not None]
                if vals:
                    top[str(j)] = max(vals)
            fold["max"] = top
        folds.append(fold)
    return {"columns": [{"key": c.key, "header": c.header, "unit": c.unit, "fold": c.fold} for c in columns],
            "rows": out_rows, "folds": folds}


def visible_rows(tree: dict) -> int:
    """How many rows the tree has with every fold folded (every row open)."""
    jump = {}                 # a fold's first hidden row -> the row after the fold
    for f in tree["folds"]:
        jump[tree["rows"][f["at"]]["e"] + 1] = f["end"] + 1
    n = pos = 0
    while pos < len(tree["rows"]):
        if pos in jump:
            pos = jump[pos]
            continue
        n += 1
        pos += 1
    return n


# ---- charts -----------------------------------------------------------------------------------------

def _block_parents(layers) -> set[str]:
    """Paths of the containers whose numbered children are repeated blocks: two or more of them,
    all of one type (``model.layers``: 80 LlamaDecoderLayer), not a Sequential of different layers
    (``features``: Conv2d, ReLU, MaxPool2d), whose children keep their numbers in a chart."""
    kinds: dict[str, set] = {}
    numbered: dict[str, int] = {}
    for r in layers:
        parent, _, last = r["path"].rpartition(".")
        if last.isdigit() and r["call_index"] == 0:
            kinds.setdefault(parent, set()).add(r["type"])
            numbered[parent] = numbered.get(parent, 0) + 1
    return {p for p, t in kinds.items() if len(t) == 1 and numbered[p] > 1}


def chart_role(path: str, blocks: set[str]) -> str:
    """``role(path)`` where every number in the path is a block number (a child of one of
    ``blocks``); otherwise only the block numbers become ``*`` (``blocks.*.mlp.0``: the first layer
    of a Sequential stays apart from its third)."""
    segs = path.split(".")
    nums = [i for i, x in enumerate(segs) if x.isdigit()]
    if all(".".join(segs[:i]) in blocks for i in nums):
        return role(path)
    return ".".join("*" if i in nums and ".".join(segs[:i]) in blocks else x for i, x in enumerate(segs))


def role_chart(title: str, unit: str, items, top: int = TOP, blocks: set[str] | None = None) -> dict:
    """A chart of roles: ``items`` are (path, type, value); the copies of one role (its path with
    block numbers as ``*``, see ``chart_role``; one type) are one bar, their sum, with their count
    and, when all copies hold the same value, that value (``each``). The ``top`` largest roles are
    bars; the others are summed into ``other`` (shown as text, not as a bar: it would set the
    scale)."""
    items = list(items)
    if blocks is None:
        blocks = _block_parents([{"path": p, "type": t, "call_index": 0} for p, t, _ in items])
    groups: dict[tuple[str, str], dict] = {}
    for path, typ, value in items:
        if not value:
            continue
        r = chart_role(path, blocks)
        g = groups.setdefault((r, typ), {"label": r or "(root)", "value": 0, "count": 0, "values": set()})
        g["value"] += value
        g["count"] += 1
        g["values"].add(value)
    labels: dict[str, int] = {}
    for (r, _) in groups:
        labels[r] = labels.get(r, 0) + 1
    bars = [{"label": g["label"] + (f" ({typ})" if labels[r] > 1 else ""), "type": typ, "value": g["value"],
             "count": g["count"], "each": next(iter(g["values"])) if len(g["values"]) == 1 else None}
            for (r, typ), g in groups.items()]
    bars.sort(key=lambda b: -b["value"])
    rest = bars[top:]
    out = {"title": title, "unit": unit, "bars": bars[:top]}
    if rest:
        out["other"] = {"roles": len(rest), "layers": sum(b["count"] for b in rest),
                        "value": sum(b["value"] for b in rest)}
    return out


def _charts(summary: dict | None, memory: dict | None, latency: dict | None) -> list[dict]:
    charts = []
    leaves = lambda d: [r for r in d["layers"] if not r["children"]]  # noqa: E731
    base = next((d for d in (summary, memory, latency) if d is not None), None)
    if base is None:
        return charts
    blocks = _block_parents(base["layers"])
    if summary is not None:
        charts.append(role_chart("Forward MACs per layer role (leaf modules, summed over copies)", "count",
                                 [(r["path"], r["type"], r["forward"]["macs"]) for r in leaves(summary)], blocks=blocks))
        charts.append(role_chart("Parameters per layer role (each module counted once, summed over copies)",
                                 "params", [(r["path"], r["type"], r["num_params"]) for r in summary["layers"]], blocks=blocks))
    if memory is not None:
        charts.append(role_chart("Memory per layer role: saved activations, params, grads, optimizer state "
                                 "(leaf modules, summed over copies)", "bytes",
                                 [(r["path"], r["type"], r["saved_bytes"] + r["param_bytes"] + r["grad_bytes"]
                                   + r["optimizer_bytes"]) for r in leaves(memory)], blocks=blocks))
    if latency is not None:
        bwd = any(_median(r.get("backward_self_s")) is not None for r in latency["layers"])
        charts.append(role_chart("Self time per layer role, forward" + (" + backward" if bwd else "")
                                 + " (median, summed over copies)", "seconds",
                                 [(r["path"], r["type"], (_median(r.get("forward_self_s")) or 0)
                                   + (_median(r.get("backward_self_s")) or 0)) for r in leaves(latency)], blocks=blocks))
    return charts


# ---- the first card: what the numbers are for -----------------------------------------------------

def _shape(t: dict) -> str:
    return "[" + ", ".join(str(d) for d in t["shape"]) + "]" + (f" {t['dtype']}" if t.get("dtype") else "")


def context_facts(summary: dict | None = None, memory: dict | None = None, latency: dict | None = None,
                  plan: dict | None = None) -> list[list[str]]:
    """(label, text) pairs of the run's inputs, weights, mode, device, optimizer and schedule, as far
    as the reports say them."""
    facts: list[list[str]] = []
    root = summary["layers"][0] if summary and summary["layers"] else None
    if root is not None and root.get("inputs"):
        facts.append(["Inputs", ", ".join(_shape(t) for t in root["inputs"])])
    elif latency and latency["layers"] and latency["layers"][0].get("input_shapes"):
        facts.append(["Inputs", ", ".join("[" + ", ".join(map(str, s)) + "]"
                                          for s in latency["layers"][0]["input_shapes"])])
    if summary is not None:
        t = summary["totals"]
        if t.get("params") and t.get("param_bytes") and t["param_bytes"] % t["params"] == 0:
            facts.append(["Weights", f"{t['param_bytes'] // t['params']} bytes per parameter"])
        if root is not None and root.get("outputs"):
            facts.append(["Outputs", ", ".join(_shape(o) for o in root["outputs"][:3])
                          + (" ..." if len(root["outputs"]) > 3 else "")])
    opts_s = (summary or {}).get("model", {}).get("options", {}) if summary else {}
    opts_m = memory["model"].get("options", {}) if memory else {}
    mode = []
    if opts_s.get("mode"):
        mode.append(f"analysis: {opts_s['mode']}" + (", with backward" if summary["totals"].get("backward") else ""))
    if memory is not None and "training" in opts_m:
        steps = opts_m.get("steps")
        acc = opts_m.get("accumulation")
        mode.append("memory: " + ("training step" if opts_m["training"] else "inference")
                    + (f", {steps} step(s)" if steps else "") + (f", {acc} micro-batches each" if acc and acc > 1 else "")
                    + (" (simulated)" if opts_m.get("simulated") else ""))
    if latency is not None:
        lo = latency["model"].get("options", {})
        mode.append(f"latency: {lo.get('repeats')} repeats" + (", with backward" if lo.get("backward") else ""))
    if mode:
        facts.append(["Mode", "; ".join(mode)])
    devices = []
    for d in (opts_s.get("device"), opts_m.get("device"), latency and latency["model"].get("device"),
              plan and (plan.get("options") or {}).get("device")):
        if d and d not in devices:
            devices.append(d)
    if devices:
        facts.append(["Device", ", ".join(devices)])
    if memory is not None and opts_m.get("training"):
        facts.append(["Optimizer", str(opts_m.get("optimizer") or "none")])
    if opts_m.get("autocast"):
        facts.append(["Autocast", str(opts_m["autocast"])])
    if plan is not None:
        facts.append(["Schedule", f"{plan['schedule']}, {plan['microbatches']} micro-batch(es)"
                      + (f" of {plan['micro_batch_size']}" if plan.get("micro_batch_size") else "")
                      + f", {len(plan['stages'])} stages by {plan['by']}"])
    return facts


# ---- the page ---------------------------------------------------------------------------------------

def page_data(summary=None, memory=None, latency=None, plan=None) -> dict[str, Any]:
    """What the page embeds, from the reports (objects or their ``to_dict()``/saved JSON dicts)."""
    summary, memory, latency, plan = (_as_dict(r) for r in (summary, memory, latency, plan))
    data: dict[str, Any] = {}
    if summary is not None:
        data["summary"] = {k: summary[k] for k in ("model", "totals", "coverage")}
    if memory is not None:
        data["memory"] = {k: memory[k] for k in ("model", "peak_bytes", "breakdown", "totals", "steps", "notes")}
        data["memory"]["timeline"] = _slim_timeline(memory.get("timeline"))
    if latency is not None:
        data["latency"] = {k: latency[k] for k in ("model", "totals", "notes")}
        data["latency"]["backward"] = any(_median(r.get("backward_self_s")) is not None for r in latency["layers"])
    if plan is not None:
        data["plan"] = {k: plan[k] for k in ("model", "by", "schedule", "microbatches", "bottleneck",
                                             "lower_bound", "imbalance", "split_points", "stages", "notes")}
    if not data:
        return data
    data["context"] = context_facts(summary, memory, latency, plan)
    data["colors"] = COLORS
    tree = tree_data(summary, memory, latency)
    if tree is not None:
        data["tree"] = tree
    data["charts"] = _charts(summary, memory, latency)
    return data


def html_page(title: str | None = None, **reports) -> str:
    """The whole page for the given reports or report dicts (summary=, memory=, latency=, plan=)."""
    data = page_data(**reports)
    if not data:
        from ...errors import InputError
        raise InputError("an HTML report needs at least one of summary, memory, latency, plan")
    name = next(d["model"]["name"] if isinstance(d["model"], dict) else d["model"]
                for k, d in data.items() if k in ("summary", "memory", "latency", "plan"))
    template = Template(resources.files(__name__).joinpath("report.html").read_text(encoding="utf-8"))
    # inside <script>, "</" could close the tag early: JSON allows "<\/" for it
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    from ... import __version__
    return template.substitute(title=html.escape(title or f"layerscope: {name}"), data=blob,
                               version=html.escape(__version__))
