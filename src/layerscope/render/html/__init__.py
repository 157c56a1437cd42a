"""Self-contained HTML report: one file, no network at view time.

The page embeds the data of the reports it shows (the same dicts as their JSON, slimmed: the memory
timeline is cut to at most ``MAX_POINTS`` points, keeping each bucket's highest point so the peak
survives) and draws its charts with inline JavaScript into SVG. The layer table is a tree whose rows
fold and unfold. Sections: summary cards, layer tree, per-layer charts (MACs, params, memory,
latency), the memory timeline by category, the pipeline stages, coverage.
"""

from __future__ import annotations

import html
import json
from importlib import resources
from string import Template
from typing import Any

__all__ = ["html_page", "page_data", "MAX_POINTS", "TOP"]

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


def page_data(summary: dict | None = None, memory: dict | None = None, latency: dict | None = None,
              plan: dict | None = None) -> dict[str, Any]:
    """What the page embeds, from the reports' ``to_dict()`` (or their saved JSON)."""
    data: dict[str, Any] = {}
    if summary is not None:
        data["summary"] = {
            "model": summary["model"], "totals": summary["totals"], "coverage": summary["coverage"],
            "layers": [{"i": r["index"], "path": r["path"], "type": r["type"], "depth": r["depth"],
                        "call": r["call_index"], "parent": r["parent"], "children": r["children"],
                        "out": [o["shape"] for o in r["outputs"]][:1], "params": r["subtree_params"],
                        "own_params": r["num_params"], "macs": r["forward_total"]["macs"],
                        "flops": r["forward_total"]["flops"], "self_macs": r["forward"]["macs"],
                        "read": r["forward_total"]["bytes_read"],
                        "written": r["forward_total"]["bytes_written"],
                        "bwd_macs": r["backward_total"]["macs"]} for r in summary["layers"]]}
    if memory is not None:
        data["memory"] = {k: memory[k] for k in ("model", "peak_bytes", "breakdown", "totals", "steps", "notes")}
        data["memory"]["layers"] = [
            {"i": r["index"], "path": r["path"], "type": r["type"], "depth": r["depth"], "call": r["call_index"],
             "children": r["children"],
             "own": r["saved_bytes"] + r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"],
             "total": r["total"]} for r in memory["layers"]]
        data["memory"]["timeline"] = _slim_timeline(memory.get("timeline"))
    if latency is not None:
        data["latency"] = {"model": latency["model"], "totals": latency["totals"], "notes": latency["notes"],
                           "layers": [{"i": r["index"], "path": r["path"], "type": r["type"],
                                       "depth": r["depth"], "call": r["call_index"], "children": r["children"],
                                       "fwd_self": (r["forward_self_s"] or {}).get("median"),
                                       "bwd_self": (r["backward_self_s"] or {}).get("median")}
                                      for r in latency["layers"]]}
    if plan is not None:
        data["plan"] = {k: plan[k] for k in ("model", "by", "schedule", "microbatches", "bottleneck",
                                             "lower_bound", "imbalance", "split_points", "stages", "notes")}
    return data


def html_page(title: str | None = None, **reports: dict | None) -> str:
    """The whole page for the given report dicts (summary=, memory=, latency=, plan=)."""
    data = page_data(**reports)
    if not data:
        from ...errors import InputError
        raise InputError("an HTML report needs at least one of summary, memory, latency, plan")
    name = next(d["model"]["name"] if isinstance(d["model"], dict) else d["model"] for d in data.values())
    template = Template(resources.files(__name__).joinpath("report.html").read_text(encoding="utf-8"))
    # inside <script>, "</" could close the tag early: JSON allows "<\/" for it
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    from ... import __version__
    return template.substitute(title=html.escape(title or f"layerscope: {name}"), data=blob,
                               version=html.escape(__version__))
