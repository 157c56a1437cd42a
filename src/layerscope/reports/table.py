"""The table model every view of every report is drawn from.

A report kind declares its columns once (key, header, unit, how to read the value from a record, how
to show it when the unit alone cannot say, whether a fold may hide it); ``Table`` is one report's
rows read through those columns: plain values, no formatted numbers. The renderers (terminal, text,
CSV, JSON, pandas, notebook HTML, the HTML report) format the values by their unit, fold repeated
blocks and fit the table to the width they have; none of that lives here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Sequence

__all__ = ["Unit", "Column", "Row", "Table", "Fact", "select_columns", "tree_table", "flat_table", "JsonField",
           "OMIT"]

# count: SI (K M G T P E); params: thousands separators in tables, SI in charts; bytes: IEC;
# seconds: s / ms / us; rate: SI per second; percent: a fraction shown as %; ratio: a plain number;
# shape: a tuple of shapes; text: shown as it is; milliseconds: a measured time to 0.1 ms; change: a
# relative difference as a signed %; ratio3: a ratio to three decimals; percent1: a share to 0.1%
Unit = Literal["count", "params", "bytes", "seconds", "rate", "percent", "ratio", "shape", "text", "index",
               "milliseconds", "change", "ratio3", "percent1"]


# What a report kind's JSON holds besides its table, read from its record (render.json builds every
# kind's JSON from these and the columns; docs/json.md). A field is the name of an attribute, or
# (key, attribute name or getter(record, report)[, fields]): with fields, the value (or each item of
# it) is read through them in turn; without, it is taken whole (dataclasses as dicts, tuples as
# lists). A key of None spreads a getter's dict into the enclosing one; a getter returning OMIT
# leaves its key out.
JsonField = Any
OMIT: Any = type("Omit", (), {"__slots__": (), "__repr__": lambda self: "OMIT"})()


@dataclass(frozen=True)
class Column:
    """One column of a report kind.

    ``value(record, report)``: the plain value (a number, a tuple of shapes, a word; None: no value).
    ``text(record, report)``: what a table shows instead of the formatted value, where the unit alone
    cannot say it (``(reused)`` for a module's second call), or None to format the value.
    ``suffix(record, report)``: a mark after the formatted value (`` *`` for shared parameters).
    ``fold``: False for a value that depends on when a call ran, not on what the block is (memory
    live at a call's peak, a time): a fold ignores it and its row shows the highest (``fold_with``
    "max") or the median of the folded blocks' values.
    ``drop``: when a terminal is too narrow, columns with a higher ``drop`` go first; 0 never goes.
    ``default``: shown when no columns are chosen."""

    key: str
    header: str
    unit: Unit
    value: Callable[[Any, Any], Any]
    text: Callable[[Any, Any], str | None] | None = None
    suffix: Callable[[Any, Any], str] | None = None
    fold: bool = True
    fold_with: Literal["max", "median"] = "max"   # what a fold row shows of a column that does not fold
    drop: int = 0
    default: bool = True
    aliases: tuple[str, ...] = ()
    description: str = ""


@dataclass(frozen=True, slots=True)
class Row:
    """One record read through the columns. ``path``/``depth``/``parent`` place it in the module
    tree (``depth`` is None for a flat table: stages, ONNX nodes)."""

    index: int
    path: str
    type: str
    depth: int | None
    call_index: int
    parent: int | None
    values: tuple[Any, ...]
    texts: tuple[str | None, ...]      # per column: text shown instead of the formatted value
    suffixes: tuple[str, ...]          # per column: a mark after it

    @property
    def name(self) -> str:
        return self.path or "(root)"


@dataclass(frozen=True, slots=True)
class Fact:
    """One line of a table's header (what the numbers are for) or footer (totals, notes).
    ``value`` is shown by ``unit`` when given, else as text; ``alert``: a warning (INCOMPLETE,
    DOES NOT FIT) that a terminal shows in red."""

    label: str
    value: Any
    unit: Unit = "text"
    alert: bool = False


@dataclass(frozen=True)
class Table:
    kind: str                           # summary, memory, latency, stage_plan, comparison, onnx_nodes
    title: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    context: tuple[Fact, ...] = ()      # the inputs, dtypes, mode, device, optimizer the numbers are for
    footer: tuple[Fact, ...] = ()
    first_header: str = "Layer (type)"  # the name column's header
    tree: bool = True                   # rows form a module tree: names drawn as one, folding applies
    meta: dict = field(default_factory=dict)


def select_columns(all_columns: Sequence[Column], chosen, error: Callable[[str], Exception]) -> tuple[Column, ...]:
    """The columns a caller chose (keys or aliases, a list or a comma-separated string), or the
    default ones."""
    if chosen is None:
        return tuple(c for c in all_columns if c.default)
    if isinstance(chosen, str):
        chosen = [c.strip() for c in chosen.split(",") if c.strip()]
    by_key = {c.key: c for c in all_columns}
    for c in all_columns:
        for a in c.aliases:
            by_key.setdefault(a, c)
    out = []
    for k in chosen:
        if k not in by_key:
            raise error(f"unknown column {k!r}; choose from {', '.join(c.key for c in all_columns)}")
        out.append(by_key[k])
    return tuple(out)


def _row(rec, rep, columns: Sequence[Column], tree: bool, name: Callable[[Any], str] | None = None) -> Row:
    return Row(index=rec.index, path=name(rec) if name else getattr(rec, "path", ""), type=getattr(rec, "type", ""),
               depth=rec.depth if tree else None,
               call_index=getattr(rec, "call_index", 0), parent=getattr(rec, "parent", None),
               values=tuple(c.value(rec, rep) for c in columns),
               texts=tuple(c.text(rec, rep) if c.text else None for c in columns),
               suffixes=tuple(c.suffix(rec, rep) if c.suffix else "" for c in columns))


def tree_table(kind: str, title: str, rep, records: Sequence, columns: Sequence[Column],
               depth: int | None = None, **kw) -> Table:
    """A table of module-call records (anything with index, path, type, depth, call_index, parent),
    down to ``depth``."""
    rows = tuple(_row(r, rep, columns, True) for r in records if depth is None or r.depth <= depth)
    return Table(kind=kind, title=title, columns=tuple(columns), rows=rows, **kw)


def flat_table(kind: str, title: str, rep, records: Sequence, columns: Sequence[Column],
               name: Callable[[Any], str] | None = None, **kw) -> Table:
    """A table of records that are not module calls (stages, ONNX nodes): no tree, no folding;
    ``name(record)``: the first column's text."""
    rows = tuple(_row(r, rep, columns, False, name) for r in records)
    return Table(kind=kind, title=title, columns=tuple(columns), rows=rows, tree=False, **kw)
