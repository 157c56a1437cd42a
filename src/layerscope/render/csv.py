"""CSV of a report's rows: where each row sits (index, path, type, depth, call, parent), then every
column of its kind, values unformatted (shapes as 1x32x64, several joined by ;)."""

from __future__ import annotations

import csv
import io
from typing import Any, Iterable

from ..reports.table import Table

__all__ = ["csv_text", "table_rows", "render_csv"]


def _plain(unit: str, v: Any) -> Any:
    if v is None:
        return ""
    if unit == "shape":
        return ";".join("x".join(str(d) for d in s) for s in v)
    if unit == "ratio" and isinstance(v, tuple):
        return "x".join(str(int(x)) if float(x).is_integer() else str(x) for x in v)
    return v


def table_rows(table: Table) -> list[dict[str, Any]]:
    """One dict per row: place in the tree (for tree tables), then each column's plain value."""
    out = []
    for r in table.rows:
        row: dict[str, Any] = {table.meta.get("index_key", "index"): r.index}
        if table.tree:
            row.update(path=r.path, type=r.type, depth=r.depth, call_index=r.call_index,
                       parent="" if r.parent is None else r.parent)
        for c, v in zip(table.columns, r.values):
            row[c.key] = _plain(c.unit, v)
        out.append(row)
    return out


def csv_text(fields, rows: Iterable[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(fields), lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow(row)
    return buf.getvalue()


def render_csv(table: Table) -> str:
    rows = table_rows(table)
    fields = [table.meta.get("index_key", "index")] + (["path", "type", "depth", "call_index", "parent"] if table.tree else []) \
        + [c.key for c in table.columns]
    return csv_text(fields, rows)
