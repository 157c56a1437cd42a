"""Two reports side by side, layer by layer: what changed between two models, or two runs of one.

Works on the reports' tables as their JSON holds them (``to_dict()`` or a saved file: each layer's
column ``values`` and the columns' units), so a report saved last month compares with one made now;
each metric is one column of the compared kind's table. Layers are matched by module path and call index; a layer only one side
has is shown with "--" on the other. Both sides must be the same kind of report.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import InputError
from .base import ReportRecord
from .table import Column, Fact, Table, tree_table

__all__ = ["compare", "Comparison", "ComparedLayer"]


# kind -> metric -> the column of that kind's table it reads (each layer's ``values``), whose unit it takes
_METRICS: dict[str, dict[str, str]] = {
    "summary": {"params": "params", "macs": "macs", "flops": "flops"},
    "memory": {"memory": "total", "saved": "saved_total"},
    "latency": {"forward": "forward", "backward": "backward"},
}

# each metric's header, cased as the main tables case it (summary's Params, MACs, FLOPs; latency's
# Fwd, Bwd)
_HEADERS = {"params": "Params", "macs": "MACs", "flops": "FLOPs", "memory": "Memory", "saved": "Saved",
            "forward": "Fwd", "backward": "Bwd"}


def _reader(column: str) -> Callable[[dict], Any]:
    def read(r: dict) -> Any:
        if "values" not in r:
            raise InputError("this report's JSON has no column values (saved before schema 1.2): save it again")
        # a module's later calls use the parameters its first call counted
        return 0 if column == "params" and r["call_index"] else r["values"].get(column)
    return read


def _units(kind: str, *sides: dict) -> dict[str, str]:
    """Each metric's unit: its column's, as either side's table declares it."""
    declared = {c["key"]: c["unit"] for d in sides for c in d.get("columns", ())}
    # a column neither side has (a profile without backward) is all "--": the kind's unit will do
    fallback = next((declared[c] for c in _METRICS[kind].values() if c in declared), "count")
    return {m: declared.get(col, fallback) for m, col in _METRICS[kind].items()}


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
    index: int = 0              # row position
    parent: int | None = None   # the row of the enclosing layer

    @property
    def changed(self) -> bool:
        return self.type_a != self.type_b or self.a != self.b

    @property
    def type(self) -> str:
        return self.type_a if self.type_a == self.type_b else f"{self.type_a or '--'} -> {self.type_b or '--'}"


def _delta(m: str):
    def value(r: ComparedLayer, cmp) -> Any:
        a, b = r.a.get(m), r.b.get(m)
        return None if a is None or b is None else b - a
    return value


def _delta_text(m: str):
    def text(r: ComparedLayer, cmp) -> str | None:
        a, b = r.a.get(m), r.b.get(m)
        return "--" if a is None or b is None else ("=" if a == b else None)
    return text


def _relative(m: str):
    def suffix(r: ComparedLayer, cmp) -> str:
        a, b = r.a.get(m), r.b.get(m)
        return f" ({100 * (b - a) / a:+.1f}%)" if a and b is not None and a != b else ""
    return suffix


def _delta_fact(m: str, unit: str, a, b) -> tuple:
    if a is None or b is None:
        return ("--",)
    if a == b:
        return ("=",)
    return ((b - a, "+" + unit), f" ({100 * (b - a) / a:+.1f}%)" if a else "")


class Comparison(ReportRecord):
    """Result of ``layerscope.compare``: per-layer values of both sides and their totals."""

    kind = "comparison"
    _html_part = "comparison"

    def __init__(self, kind: str, names: tuple[str, str], layers: tuple[ComparedLayer, ...],
                 totals: tuple[dict, dict], units: dict[str, str]) -> None:
        self.compared, self.names, self.layers, self.totals = kind, names, layers, totals
        self.metrics = tuple(_METRICS[kind])
        self.units = dict(units)       # metric -> unit

    @property
    def model_name(self) -> str:
        return f"{self.names[0]} vs {self.names[1]}"

    def columns(self) -> tuple[Column, ...]:
        cols = []
        # a narrow terminal keeps the differences (what a comparison is for) longest: the absolute
        # columns go first, the last metric's before the first's and A before B, then the
        # differences, the last metric's first; the first metric's difference never goes
        for k, m in enumerate(self.metrics):
            unit, head = self.units[m], _HEADERS.get(m, m.capitalize())
            cols += [Column(f"{m}_a", f"{head} A", unit, lambda r, c, m=m: r.a.get(m), drop=4 + 2 * k + 1),
                     Column(f"{m}_b", f"{head} B", unit, lambda r, c, m=m: r.b.get(m), drop=4 + 2 * k),
                     Column(f"{m}_delta", f"{head} B-A", "+" + unit, _delta(m), text=_delta_text(m),
                            suffix=_relative(m), drop=k)]
        return tuple(cols)

    def _footer(self) -> tuple[Fact, ...]:
        ta, tb = self.totals
        lines = [Fact("A", self.names[0]), Fact("B", self.names[1])]
        for m in self.metrics:
            unit = self.units[m]
            a, b = ta.get(m), tb.get(m)
            lines.append(Fact(f"Total {m}", ((a, unit), " -> ", (b, unit), ": ") + _delta_fact(m, unit, a, b)))
        only_a = sum(r.type_b is None for r in self.layers)
        only_b = sum(r.type_a is None for r in self.layers)
        lines.append(Fact("Layers", f"{sum(r.changed for r in self.layers)} of {len(self.layers)} differ; "
                                    f"{only_a} only in A, {only_b} only in B"))
        return tuple(lines)

    def table_model(self, depth: int | None = 2, columns=None, changed: bool = False, **_: Any) -> Table:
        rows = [r for r in self.layers if not changed or r.changed]
        return tree_table("comparison", f"layerscope compare ({self.compared}): {self.names[0]} vs {self.names[1]}",
                          self, rows, self.columns(), depth, context=(Fact("Compared", f"{self.compared} reports"),),
                          footer=self._footer(), first_header="Layer")

    def table(self, depth: int | None = 2, changed: bool = False, fold: bool = True, width: int | None = None) -> str:
        """A row per layer: each metric for A, for B and B - A. ``changed``: only rows that differ."""
        return self._text(depth, None, fold, width, changed=changed)

    def rich_table(self, depth: int | None = 2, changed: bool = False, fold: bool = True, width: int | None = None):
        return self._rich(depth, None, fold, width, changed=changed)

    def print(self, depth: int | None = 2, changed: bool = False, file=None, fold: bool = True) -> None:
        self._print(file, depth, None, fold, changed=changed)

    def to_html(self, **others) -> str:
        # the page shows one model's reports; a comparison has none yet (it raised a TypeError from
        # page_data before): one clear line instead
        raise InputError("a comparison has no HTML page: use its table, to_json(), to_csv() or "
                         "to_dataframe(), or put each side on its own page (report.save_html)")

    def json_fields(self, **_: Any) -> tuple:
        return (("compared", "compared"), ("a", lambda c, _: c.names[0]), ("b", lambda c, _: c.names[1]),
                ("totals", lambda c, _: {"a": c.totals[0], "b": c.totals[1]}), ("layers", lambda c, _: c.rows()))

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
    metrics = {m: _reader(col) for m, col in _METRICS[kind].items()}

    def index(d: dict) -> dict[tuple[str, int], dict]:
        return {(r["path"], r["call_index"]): r for r in d["layers"]}

    ia, ib = index(da), index(db)
    # A's layers in order, each of B's own layers right after the layer that precedes it in B
    order = list(ia)
    at = {k: i for i, k in enumerate(order)}
    prev = None
    for k in ib:
        if k not in at:
            i = at[prev] + 1 if prev is not None else 0
            order.insert(i, k)
            at = {key: j for j, key in enumerate(order)} if i < len(order) - 1 else {**at, k: i}
        prev = k
    layers: list[ComparedLayer] = []
    row_of: dict[tuple[str, int], int] = {}
    for k in order:
        ra, rb = ia.get(k), ib.get(k)
        parent = None
        path = k[0]
        while path:                          # the nearest enclosing layer, by path
            path = path.rpartition(".")[0]
            if (path, 0) in row_of:
                parent = row_of[(path, 0)]
                break
        row_of[k] = len(layers)
        layers.append(ComparedLayer(
            path=k[0], call_index=k[1], depth=(ra or rb)["depth"], type_a=ra and ra["type"],
            type_b=rb and rb["type"], a={m: get(ra) for m, get in metrics.items()} if ra else {},
            b={m: get(rb) for m, get in metrics.items()} if rb else {}, index=len(layers), parent=parent))
    return Comparison(kind, names, tuple(layers), (_totals(kind, da), _totals(kind, db)), _units(kind, da, db))
