"""JSON export with a versioned schema, described in docs/json.md, built the same way for every kind.

Every report: schema_version, kind (summary, memory, latency, stage_plan, comparison), the kind's own
keys read from its record through the fields it declares (``json_fields()``: a summary's model,
totals, layers, coverage), then context (what the numbers are for) and columns (the kind's table
columns: key, header, unit); each row of its table (``layers``, a plan's ``stages``) adds its
columns' plain ``values`` and, where a table shows more than the unit says, the ``shown`` text.
Bump SCHEMA_VERSION's major number when a key changes meaning or disappears; adding keys is a minor
bump.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import TYPE_CHECKING, Any

from ..reports.base import Totals
from ..reports.table import OMIT
from .units import fmt

if TYPE_CHECKING:
    from ..reports.summary import Report

__all__ = ["SCHEMA_VERSION", "report_json", "record_json", "plain", "table_meta"]

SCHEMA_VERSION = "1.5"   # 1.1: every report names its kind; 1.2: context and columns; 1.3: plan step times;
#                          1.4: zero bubble's weight_time (stages), weight_flops and deferred_bytes (units);
#                          1.5: a unit's measured_weight_share
#                          (docs/json.md)


def plain(v: Any) -> Any:
    """A value as JSON holds it: dataclasses as dicts of their fields, a report's totals as the
    fields that have a value, tuples as lists."""
    if isinstance(v, Totals):
        return {k: plain(x) for k, x in v.items()}
    if is_dataclass(v) and not isinstance(v, type):
        return {f.name: plain(getattr(v, f.name)) for f in fields(v)}
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, (tuple, list)):
        return [plain(x) for x in v]
    return v


def record_json(obj: Any, spec, report: Any) -> dict[str, Any]:
    """``obj`` read through ``spec`` (reports.table.JsonField: the fields a kind declares)."""
    out: dict[str, Any] = {}
    for field in spec:
        key, get, sub = (field, field, None) if isinstance(field, str) else (*field, None)[:3]
        v = getattr(obj, get) if isinstance(get, str) else get(obj, report)
        if v is OMIT:
            continue
        if sub is None:
            v = plain(v)
        elif v is not None:
            v = [record_json(x, sub, report) for x in v] if isinstance(v, (tuple, list)) else record_json(v, sub, report)
        if key is None:
            out.update(v)
        else:
            out[key] = v
    return out


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


def report_json(report: "Report", **options) -> dict[str, Any]:
    """The versioned JSON of any report kind (docs/json.md): schema_version, kind, the kind's own
    keys, then context and columns. ``options``: the kind's own (a memory report's ``timeline``)."""
    d = record_json(report, report.json_fields(**options), report)
    table = report.table_model(None, "all", **report._csv_view())
    rows = d.get(report.json_rows)
    if rows is not None and len(rows) == len(table.rows):
        for row, r in zip(rows, table.rows):
            row["values"] = {c.key: plain(v) for c, v in zip(table.columns, r.values)}
            shown = {c.key: (t if t is not None else fmt(c.unit, v)) + x
                     for c, v, t, x in zip(table.columns, r.values, r.texts, r.suffixes) if t is not None or x}
            if shown:
                row["shown"] = shown
    return {"schema_version": SCHEMA_VERSION, "kind": report.kind, **d, **table_meta(table)}
