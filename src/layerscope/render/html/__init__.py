"""Self-contained HTML report: one file, no network at view time.

The page is built from the reports' JSON (``to_dict()``, or a saved file: the same thing), read
through the columns every report declares (``columns``: key, header, unit; each row's ``values``):
the layer tree shows the same cells as the terminal, formatted by ``render.units`` and folded by
``render.fold`` (``layers.0-79: LlamaDecoderLayer x80 (each)``), and the charts group the copies of
one role (``model.layers.*.mlp.down_proj x80``) instead of ranking hundreds of identical leaves. The
memory timeline is cut to at most ``MAX_POINTS`` points, keeping each bucket's highest point so the
peak survives. Inline JavaScript draws the charts into SVG; every text it shows with a number in it
(the cards, axis labels, sentences) is written here, by ``render.units`` (``texts``), never by the
script. ``PAGE_SCHEMA`` versions the embedded data (docs/html.md).
"""

from __future__ import annotations

import html
import json
from importlib import resources
from string import Template
from types import SimpleNamespace
from typing import Any

from ...reports.table import Column, tree_table
from ..fold import roles
from ..json import report_json
from ..layout import grid
from ..units import fmt
from .texts import (cards, coverage_texts, memory_axis, memory_sentence, parallel_cards, parallel_texts, plan_texts,
                    rest_note)

__all__ = ["html_page", "page_data", "MAX_POINTS", "TOP", "PAGE_SCHEMA"]

PAGE_SCHEMA = 3          # 2: the shown texts come built (cards, axis, sentences); the script formats no number;
#                          3: a sharded-training section (``parallel``)

MAX_POINTS = 1500        # memory timeline points kept
TOP = 20                 # bars per chart


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


def _key(r: dict) -> tuple[str, int]:
    return r["path"], r["call_index"]


def _values(r: dict) -> dict:
    return r.get("values") or {}


def _column(meta: dict, by_key: dict[tuple[str, int], dict]) -> Column:
    """A column of a report on the page, as its JSON declares it (the kind's own definition: key,
    header, unit, how it folds), reading its values and shown texts from that report's rows."""
    k = meta["key"]

    def row(r) -> dict | None:
        return by_key.get((r.path, r.call_index))

    def value(r, rep) -> Any:
        other = row(r)
        return _freeze(_values(other).get(k)) if other else None

    def text(r, rep) -> str | None:
        other = row(r)
        return (other.get("shown") or {}).get(k) if other else "--"
    return Column(k, meta["header"], meta["unit"], value, text=text, fold=meta.get("fold", True),
                  fold_with=meta.get("fold_with", "max"))


def _tree(parts: list[tuple[str, dict, list[str]]]) -> dict:
    """The layer tree of the page: the first part's layers, with the chosen columns of every part
    (matched by path and call), drawn and folded exactly as the terminal draws them (the same
    ``grid``); ``full`` has every block for the page's unfold switch."""
    columns: list[Column] = []
    for _, d, keys in parts:
        meta = {c["key"]: c for c in d.get("columns", [])}
        by_key = {_key(r): r for r in d["layers"]}
        columns += [_column(meta[k], by_key) for k in keys if k in meta]
    # the first part's layers, as the records a table reads (index, path, type, depth, call, parent)
    layers = [SimpleNamespace(**r) for r in parts[0][1]["layers"]]
    table = tree_table("page", "", None, layers, columns)

    def drawn(g) -> list[list]:
        # depth from the tree drawing: "" root, "├─" 1, "│   ├─" 2, ...
        return [[(len(p) + 2) // 4] + list(row) for p, row in zip(g.prefixes, g.body)]
    folded = grid(table, fold=True)
    return {"headers": list(folded.header), "folded": drawn(folded), "full": drawn(grid(table, fold=False)),
            "note": next((v for k, v, _ in folded.footer if k == "Folded rows"), None)}


def _freeze(v: Any) -> Any:
    return tuple(_freeze(x) for x in v) if isinstance(v, list) else v


def _roles(layers: list[dict], value, unit: str, top: int = TOP) -> dict:
    """A chart's bars: the leaves' values summed per role (the copies of one layer across repeated
    blocks: ``layers.*.mlp.down_proj x80``), the largest first; what does not fit is summed in a
    note, not drawn as a bar (it would set the scale and leave the real bars as hairlines)."""
    groups: dict[str, list] = {}
    role = roles([(r["path"], r["type"]) for r in layers])
    for r in layers:
        if r.get("children"):
            continue
        v = value(r)
        if not v:
            continue
        g = groups.setdefault(role[r["path"]] + (f" #{r['call_index'] + 1}" if r["call_index"] else ""), [0, 0])
        g[0] += v
        g[1] += 1
    items = sorted(((k or "(root)", v, n) for k, (v, n) in groups.items()), key=lambda x: -x[1])
    shown, rest = items[:top], items[top:]
    left = None
    if rest:
        left = {"roles": len(rest), "layers": sum(n for _, _, n in rest),
                "text": fmt(unit, sum(v for _, v, _ in rest), chart=True)}
        left["note"] = rest_note(left["roles"], left["layers"], left["text"])
    return {"unit": unit,
            "bars": [{"label": k + (f" x{n}" if n > 1 else ""), "value": v, "text": fmt(unit, v, chart=True)}
                     for k, v, n in shown],
            "rest": left}


def _context(parts: list[dict]) -> list[list[str]]:
    """The page's first card: what the numbers are for, from every report on it (each line once)."""
    seen, out = set(), []
    for d in parts:
        for f in d.get("context", []):
            v = f["value"] if f.get("unit", "text") == "text" else fmt(f["unit"], f["value"])
            label = f["label"] if f["label"] != "Run" or d["kind"] == "summary" else \
                {"memory": "Memory", "latency": "Timing", "stage_plan": "Pipeline"}.get(d["kind"], "Run")
            if label not in seen:                  # the first report that says it (the inputs once)
                seen.add(label)
                out.append([label, str(v)])
    return out


def _as_dict(x) -> dict | None:
    if x is None:
        return None
    if hasattr(x, "to_dict"):       # a report object (a memory report's JSON has its timeline by default)
        return x.to_dict()
    return report_json(x) if hasattr(x, "table_model") else x   # a record


def page_data(summary=None, memory=None, latency=None, plan=None, parallel=None) -> dict[str, Any]:
    """What the page embeds, from the reports (objects, their ``to_dict()`` or their saved JSON)."""
    summary, memory, latency, plan, parallel = (_as_dict(x) for x in (summary, memory, latency, plan, parallel))
    data: dict[str, Any] = {"page_schema": PAGE_SCHEMA}
    present = [d for d in (summary, memory, latency, plan, parallel) if d is not None]
    data["context"] = _context(present)
    data["cards"] = cards(summary, memory, latency, plan) + (parallel_cards(parallel) if parallel is not None else [])
    tree_parts = []
    if summary is not None:
        tree_parts.append(("summary", summary, [c["key"] for c in summary.get("columns", []) if c.get("default")]))
    if memory is not None:
        tree_parts.append(("memory", memory, ["total"] if summary is not None else
                           [c["key"] for c in memory.get("columns", []) if c.get("default")]))
    if latency is not None:
        tree_parts.append(("latency", latency, ["forward_self"] if tree_parts else
                           [c["key"] for c in latency.get("columns", []) if c.get("default")]))
    if tree_parts and all("values" in (d["layers"][0] if d["layers"] else {"values": 1}) for _, d, _ in tree_parts):
        data["tree"] = _tree(tree_parts)
    charts = []
    if summary is not None:
        t = summary["totals"]
        data["summary"] = {"model": summary["model"], "totals": t, "coverage": summary["coverage"],
                           "coverage_text": coverage_texts(summary["coverage"])}
        charts.append(["Forward MACs per layer role (leaf modules, summed over repeated blocks)",
                       _roles(summary["layers"], lambda r: _values(r).get("self_macs"), "count")])
        charts.append(["Parameters per layer role (each counted once)",
                       _roles(summary["layers"], lambda r: _values(r).get("own_params"), "params")])
    if memory is not None:
        data["memory"] = {k: memory[k] for k in ("model", "peak_bytes", "breakdown", "totals", "steps", "notes")}
        tl = data["memory"]["timeline"] = _slim_timeline(memory.get("timeline"))
        if tl:
            data["memory"]["axis"] = memory_axis(tl)
            data["memory"]["sentence"] = memory_sentence(memory, tl)
        own = ("saved_bytes", "param_bytes", "grad_bytes", "optimizer_bytes")
        charts.append(["Memory per layer role: saved activations, params, grads, optimizer state",
                       _roles(memory["layers"], lambda r: sum(r.get(k) or 0 for k in own), "bytes")])
    if latency is not None:
        data["latency"] = {"model": latency["model"], "totals": latency["totals"], "notes": latency["notes"]}

        def self_time(r):
            v = _values(r)
            return (v.get("forward_self") or 0) + (v.get("backward_self") or 0)
        charts.append(["Self time per layer role, forward" + (" + backward" if latency["model"]["options"].get(
            "backward") else "") + " (median, summed over repeated blocks)",
            _roles(latency["layers"], self_time, "seconds")])
    data["charts"] = charts
    if plan is not None:
        data["plan"] = {k: plan.get(k) for k in ("model", "by", "objective", "schedule", "microbatches", "bottleneck",
                                                 "lower_bound", "imbalance", "split_points", "notes", "step_time",
                                                 "bubble", "timeline")}
        data["plan"].update(plan_texts(plan))
        data["plan"]["stages"] = [{k: v for k, v in st.items() if k not in ("values", "shown")} for st in plan["stages"]]
        unit = {"memory": "bytes", "latency": "seconds", "roofline": "seconds"}.get(plan["by"], "count")
        data["plan"]["bars"] = [
            {"label": f"stage {st['stage']}: {st['first_unit']}" + (
                f" .. {st['last_unit']}" if st["last_unit"] != st["first_unit"] else ""),
             "value": st["cost"], "text": fmt(unit, st["cost"], chart=True),
             "memory_bytes": st["memory_total"], "memory_text": fmt("bytes", st["memory_total"]),
             "params_text": fmt("params", st["params"]), "units": st["units"], "units_text": str(st["units"]),
             "limit_text": fmt("bytes", st["limit_bytes"]) if st.get("limit_bytes") else "--"}
            for st in plan["stages"]]
    if parallel is not None:
        data["parallel"] = parallel_texts(parallel)
        data["parallel"]["model"] = parallel["model_name"]
    if not present:
        return {}
    return data


def html_page(title: str | None = None, **reports) -> str:
    """The whole page for the given reports (summary=, memory=, latency=, plan=, parallel=: report
    objects, their ``to_dict()`` or saved JSON)."""
    data = page_data(**reports)
    if not data:
        from ...errors import InputError
        raise InputError("an HTML report needs at least one of summary, memory, latency, plan, parallel")
    first = next(d for d in (data.get("summary"), data.get("memory"), data.get("latency"), data.get("plan"),
                             data.get("parallel")) if d)
    name = first["model"]["name"] if isinstance(first["model"], dict) else first["model"]
    data["name"] = name
    template = Template(resources.files(__name__).joinpath("report.html").read_text(encoding="utf-8"))
    # inside <script>, "</" could close the tag early: JSON allows "<\/" for it
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    from ..._version import __version__
    return template.substitute(title=html.escape(title or f"layerscope: {name}"), data=blob,
                               version=html.escape(__version__))

