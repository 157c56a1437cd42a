"""Two reports side by side, layer by layer: what changed between two models, or two runs of one.

Works on the reports' dicts (``to_dict()`` or their saved JSON), so a report saved last month
compares with one made now. Layers are matched by module path and call index; a layer only one side
has is shown with "--" on the other. Both sides must be the same kind of report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from .errors import InputError
from .render.csv import csv_text
from .render.json import SCHEMA_VERSION
from .render.text import text_table
from .render.units import iec, si

__all__ = ["compare", "Comparison", "ComparedLayer"]


def _ms(v: float | None) -> str:
    return "--" if v is None else f"{v * 1e3:.3f} ms"


def _median(t: dict | None) -> float | None:
    return None if not t else t.get("median")


# kind -> metric -> (how to read it from a layer dict, how to show it)
_METRICS: dict[str, dict[str, tuple[Callable[[dict], Any], Callable[[Any], str]]]] = {
    "summary": {
        "params": (lambda r: r["subtree_params"] if r["call_index"] == 0 else 0, lambda v: f"{v:,}"),
        "macs": (lambda r: r["forward_total"]["macs"], si),
        "flops": (lambda r: r["forward_total"]["flops"], si),
    },
    "memory": {
        "memory": (lambda r: r["total"], iec),
        "saved": (lambda r: r["saved_total"], iec),
    },
    "latency": {
        "forward": (lambda r: _median(r.get("forward_s")), _ms),
        "backward": (lambda r: _median(r.get("backward_s")), _ms),
    },
}


def _totals(kind: str, d: dict) -> dict[str, Any]:
    if kind == "summary":
        t = d["totals"]
        return {"params": t["params"], "macs": t["macs"], "flops": t["flops"]}
    if kind == "memory":
        return {"memory": d["peak_bytes"], "saved": d["totals"].get("saved_activation_bytes")}
    t = d["totals"]
    return {"forward": t.get("forward_plain", t.get("forward_instrumented")),
            "backward": t.get("backward_plain", t.get("backward_instrumented"))}


@dataclass(frozen=True, slots=True)
class ComparedLayer:
    path: str
    call_index: int
    depth: int
    type_a: str | None          # None: the layer is not in A
    type_b: str | None
    a: dict[str, Any]
    b: dict[str, Any]

    @property
    def changed(self) -> bool:
        return self.type_a != self.type_b or self.a != self.b


class Comparison:
    """Result of ``layerscope.compare``: per-layer values of both sides and their totals."""

    def __init__(self, kind: str, names: tuple[str, str], layers: tuple[ComparedLayer, ...],
                 totals: tuple[dict, dict]) -> None:
        self.kind, self.names, self.layers, self.totals = kind, names, layers, totals
        self.metrics = tuple(_METRICS[kind])

    def _delta(self, m: str, a, b) -> str:
        if a is None or b is None:
            return "--"
        show = _METRICS[self.kind][m][1]
        d = b - a
        if d == 0:
            return "="
        rel = f" ({100 * d / a:+.1f}%)" if a else ""
        return ("+" if d > 0 else "-") + show(abs(d)).lstrip("-") + rel

    def table(self, depth: int | None = 2, changed: bool = False) -> str:
        """A row per layer: each metric for A, for B and B - A. ``changed``: only rows that differ."""
        header = ["Layer"]
        for m in self.metrics:
            header += [f"{m} A", f"{m} B", f"{m} B-A"]
        body = []
        for r in self.layers:
            if (depth is not None and r.depth > depth) or (changed and not r.changed):
                continue
            typ = r.type_a if r.type_a == r.type_b else f"{r.type_a or '--'} -> {r.type_b or '--'}"
            name = "  " * r.depth + (r.path or "(root)") + (f" #{r.call_index + 1}" if r.call_index else "") \
                + f": {typ}"
            row = [name]
            for m in self.metrics:
                show = _METRICS[self.kind][m][1]
                a, b = r.a.get(m), r.b.get(m)
                row += ["--" if a is None else show(a), "--" if b is None else show(b), self._delta(m, a, b)]
            body.append(row)
        ta, tb = self.totals
        footer = [("A", self.names[0]), ("B", self.names[1])]
        for m in self.metrics:
            show = _METRICS[self.kind][m][1]
            a, b = ta.get(m), tb.get(m)
            footer.append((f"Total {m}", f"{'--' if a is None else show(a)} -> {'--' if b is None else show(b)} "
                                         f"({self._delta(m, a, b)})"))
        only_a = sum(r.type_b is None for r in self.layers)
        only_b = sum(r.type_a is None for r in self.layers)
        footer.append(("Layers", f"{sum(r.changed for r in self.layers)} of {len(self.layers)} differ; "
                                 f"{only_a} only in A, {only_b} only in B"))
        return text_table(header, body, footer)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for r in self.layers:
            row: dict[str, Any] = {"path": r.path, "call_index": r.call_index, "depth": r.depth,
                                   "type_a": r.type_a or "", "type_b": r.type_b or ""}
            for m in self.metrics:
                a, b = r.a.get(m), r.b.get(m)
                row.update({f"{m}_a": "" if a is None else a, f"{m}_b": "" if b is None else b,
                            f"{m}_delta": "" if a is None or b is None else b - a})
            out.append(row)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "comparison", "compared": self.kind,
                "a": self.names[0], "b": self.names[1], "totals": {"a": self.totals[0], "b": self.totals[1]},
                "layers": self.rows()}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def to_csv(self) -> str:
        rows = self.rows()
        return csv_text(list(rows[0]) if rows else ["path"], rows)

    def __str__(self) -> str:
        return self.table()


def _as_dict(x) -> dict:
    d = x.to_dict() if hasattr(x, "to_dict") else x
    if not isinstance(d, dict) or "layers" not in d:
        raise InputError(f"compare() takes reports or their dicts, got {type(x).__name__}")
    return {**d, "kind": d.get("kind", "summary")}


def compare(a, b, names: tuple[str, str] = ("A", "B")) -> Comparison:
    """Compare two reports of one kind (``analyze``, ``memory`` or ``profile`` results, or their
    ``to_dict()`` / saved JSON) layer by layer."""
    da, db = _as_dict(a), _as_dict(b)
    if da["kind"] != db["kind"]:
        raise InputError(f"cannot compare a {da['kind']} report with a {db['kind']} report")
    kind = da["kind"]
    if kind not in _METRICS:
        raise InputError(f"{kind} reports cannot be compared layer by layer (summary, memory, latency can)")
    metrics = _METRICS[kind]

    def index(d: dict) -> dict[tuple[str, int], dict]:
        return {(r["path"], r["call_index"]): r for r in d["layers"]}

    ia, ib = index(da), index(db)
    order = list(ia) + [k for k in ib if k not in ia]
    layers = []
    for k in order:
        ra, rb = ia.get(k), ib.get(k)
        layers.append(ComparedLayer(
            path=k[0], call_index=k[1], depth=(ra or rb)["depth"], type_a=ra and ra["type"],
            type_b=rb and rb["type"], a={m: get(ra) for m, (get, _) in metrics.items()} if ra else {},
            b={m: get(rb) for m, (get, _) in metrics.items()} if rb else {}))
    return Comparison(kind, names, tuple(layers), (_totals(kind, da), _totals(kind, db)))
