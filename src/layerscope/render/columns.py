"""Table columns and rows, shared by the rich table and the plain-text renderer.

A renderer never changes what it renders: both take the rows built here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..errors import InputError
from ..trace import LayerRecord
from .units import iec, si

if TYPE_CHECKING:
    from ..report import Report

__all__ = ["COLUMNS", "DEFAULT_COLUMNS", "resolve_columns", "build_rows", "footer_lines", "shape_str",
           "rf_str", "fold_runs", "shorten"]

import re

NAME_WIDTH = 40          # a layer name longer than this loses its middle
FOLD_MIN = 3             # runs of at least this many identical blocks fold into one row


def shape_str(specs) -> str:
    if not specs:
        return "--"
    first = "[" + ", ".join(str(s) for s in specs[0].shape) + "]"
    return first if len(specs) == 1 else f"{first} +{len(specs) - 1}"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.2f}"


def rf_str(rf) -> str:
    if rf is None:
        return "--"
    if len(set(rf.size)) == 1:
        return _num(rf.size[0])
    return "x".join(_num(s) for s in rf.size)


def _params(rec: LayerRecord, rep: "Report") -> str:
    if rec.call_index > 0:
        return "(reused)"
    shared = any(p.shared for p in rec.params)
    return f"{rec.subtree_params:,}" + (" *" if shared else "")


def _percent(rec: LayerRecord, rep: "Report") -> str:
    if rec.call_index > 0 or not rep.totals.params:
        return "--"
    return f"{100.0 * rec.subtree_params / rep.totals.params:.2f}%"


def _trainable(rec: LayerRecord, rep: "Report") -> str:
    flags = {p.trainable for p in rec.params}
    if not flags:
        return "--"
    return "True" if flags == {True} else ("False" if flags == {False} else "Partial")


def _kernel(rec: LayerRecord, rep: "Report") -> str:
    return "x".join(str(k) for k in rec.kernel_size) if rec.kernel_size else "--"


def _count(get: Callable[[LayerRecord], int]):
    return lambda rec, rep: si(get(rec)) if get(rec) else "--"


def _bytes(get: Callable[[LayerRecord], int]):
    return lambda rec, rep: iec(get(rec)) if get(rec) else "--"


# key -> (header, cell function)
COLUMNS: dict[str, tuple[str, Callable]] = {
    "input_shape": ("Input shape", lambda r, rep: shape_str(r.inputs)),
    "output_shape": ("Output shape", lambda r, rep: shape_str(r.outputs)),
    "params": ("Params", _params),
    "params_percent": ("Params %", _percent),
    "kernel": ("Kernel", _kernel),
    "macs": ("MACs", _count(lambda r: r.forward_total.macs)),
    "flops": ("FLOPs", _count(lambda r: r.forward_total.flops)),
    "bytes_read": ("Read", _bytes(lambda r: r.forward_total.bytes_read)),
    "bytes_written": ("Written", _bytes(lambda r: r.forward_total.bytes_written)),
    "backward_macs": ("Bwd MACs", _count(lambda r: r.backward_total.macs)),
    "backward_flops": ("Bwd FLOPs", _count(lambda r: r.backward_total.flops)),
    "trainable": ("Trainable", _trainable),
    "receptive_field": ("RF", lambda r, rep: rf_str(r.receptive_field)),
}
# torchinfo's col_names, accepted as aliases
ALIASES = {"input_size": "input_shape", "output_size": "output_shape", "num_params": "params",
           "kernel_size": "kernel", "mult_adds": "macs"}
DEFAULT_COLUMNS = ("output_shape", "params", "macs", "flops")


def resolve_columns(columns) -> tuple[str, ...]:
    if columns is None:
        return DEFAULT_COLUMNS
    if isinstance(columns, str):
        columns = [c.strip() for c in columns.split(",") if c.strip()]
    out = []
    for c in columns:
        key = ALIASES.get(c, c)
        if key not in COLUMNS:
            raise InputError(f"unknown column {c!r}; choose from {', '.join(COLUMNS)}")
        out.append(key)
    return tuple(out)


def _visible(rep: "Report", depth: int | None) -> list[LayerRecord]:
    return [r for r in rep.layers if depth is None or r.depth <= depth]


def _tree_names(rows: list[LayerRecord], rep: "Report") -> list[str]:
    """Layer names drawn as a tree, torchinfo style: each row shows its last path part and type."""
    visible = {r.index for r in rows}
    last_child: dict[int, bool] = {}
    for r in rows:
        if r.parent is not None:
            sibs = [c for c in rep.layers[r.parent].children if c in visible]
            last_child[r.index] = bool(sibs) and sibs[-1] == r.index
    names = []
    for r in rows:
        if r.parent is None:
            names.append(r.type)
            continue
        chain, p = [], rep.layers[r.parent]
        while p.parent is not None:
            chain.append("    " if last_child.get(p.index, True) else "│   ")
            p = rep.layers[p.parent]
        parent_path = rep.layers[r.parent].path
        local = r.path[len(parent_path) + 1:] if parent_path and r.path.startswith(parent_path + ".") \
            else (r.path or r.type)
        local = shorten(local)
        call = f" #{r.call_index + 1}" if r.call_index else ""
        names.append("".join(reversed(chain)) + ("└─" if last_child[r.index] else "├─")
                     + f"{local}: {r.type}{call}")
    return names


def build_rows(rep: "Report", depth: int | None, columns, fold: bool = True) -> tuple[list[str], list[list[str]]]:
    keys = resolve_columns(columns)
    rows = _visible(rep, depth)
    names = _tree_names(rows, rep)
    header = ["Layer (type)"] + [COLUMNS[k][0] for k in keys]
    body = [[n] + [COLUMNS[k][1](r, rep) for k in keys] for n, r in zip(names, rows)]
    return header, fold_runs(rows, body) if fold else body


def shorten(name: str, width: int = NAME_WIDTH) -> str:
    """A long dotted path keeps its first part and as much of its end as fits: the end says which
    layer it is, the start where it lives."""
    if len(name) <= width:
        return name
    head = name.split(".", 1)[0][: width // 3]
    return head + "…" + name[-(width - len(head) - 1):]


_INDEXED = re.compile(r"^(.*?)(\d+)$")


def fold_runs(rows: list, body: list[list[str]], min_run: int = FOLD_MIN,
              volatile: dict[int, tuple[Callable, Callable]] | None = None) -> list[list[str]]:
    """Fold runs of identical blocks into one row: ``layers.0-79: LlamaDecoderLayer x80 (each)``,
    followed by the first block's own rows. Blocks are siblings whose paths end in consecutive
    numbers, of one type, whose rows (their own and every descendant's, names aside) render the same:
    nothing shown is hidden by the fold, it only stops repeating. ``rows`` are the records behind
    ``body`` (anything with index, path, type, depth, parent, call_index), in pre-order.

    ``volatile``: columns that depend on when a block ran, not on what it is (memory live at a
    call's peak): column -> (value of a record, its text). They are left out of the comparison;
    the fold row shows the highest over the run's blocks and the rows under it show "··"."""
    volatile = volatile or {}
    n = len(rows)
    end = list(range(n))               # end[i]: the last row of i's subtree
    for i in range(n - 1, -1, -1):
        j = i + 1
        while j < n and rows[j].depth > rows[i].depth:
            j = end[j] + 1
        end[i] = j - 1

    def signature(i: int) -> tuple:
        rel = len(rows[i].path)
        return tuple((rows[k].path[rel:], rows[k].type,
                      tuple(c for j, c in enumerate(body[k]) if j and j not in volatile))
                     for k in range(i, end[i] + 1))

    out: list[list[str]] = []
    i = 0
    while i < n:
        r = rows[i]
        m = _INDEXED.match(r.path) if r.call_index == 0 else None
        run = [i]
        if m:
            prefix, num, sig = m.group(1), int(m.group(2)), None
            k = end[i] + 1
            while k < n and rows[k].depth == r.depth and rows[k].parent == r.parent and rows[k].type == r.type \
                    and rows[k].path == f"{prefix}{num + len(run)}" and rows[k].call_index == 0:
                sig = sig or signature(i)
                if signature(k) != sig:
                    break
                run.append(k)
                k = end[k] + 1
        if len(run) < min_run:
            out.append(body[i])
            i += 1
            continue
        first, last = rows[run[0]], rows[run[-1]]
        name = body[i][0]
        at = 4 * (first.depth - 1)                 # where _tree_names put this row's connector
        tree = name[:at + 2] if first.depth > 0 else ""
        local = name[len(tree):].split(": ", 1)[0]
        label = f"{local}-{last.path[len(prefix):]}: {first.type} x{len(run)} (each)"
        # when the run's last block closes its parent's branch, the fold row closes it instead
        closes = first.depth > 0 and body[run[-1]][0][at:at + 2] == "└─"
        if closes:
            tree = tree[:at] + "└─"
        folded = [tree + label] + body[i][1:]
        for col, (get, text) in volatile.items():
            vals = [v for v in (get(rows[k]) for k in run) if v is not None]
            folded[col] = text(max(vals)) if vals else folded[col]
        out.append(folded)
        for k in range(i + 1, end[i] + 1):
            row = list(body[k])
            for col in volatile:
                row[col] = "··"
            if closes and row[0][at:at + 1] == "│":
                row[0] = row[0][:at] + " " + row[0][at + 1:]
            out.append(row)
        i = end[run[-1]] + 1
    return out


def footer_lines(rep: "Report") -> list[tuple[str, str]]:
    t, cov = rep.totals, rep.coverage
    lines = [
        ("Total params", f"{t.params:,}"),
        ("Trainable params", f"{t.trainable_params:,}"),
        ("Non-trainable params", f"{t.frozen_params:,}"),
    ]
    if t.shared_params:
        lines.append(("Shared params (* counted once)", f"{t.shared_params:,}"))
    lines += [
        ("Forward MACs", si(t.forward.macs)),
        ("Forward FLOPs", si(t.forward.flops)),
    ]
    if rep.trace.backward:
        lines += [("Backward MACs", si(t.backward.macs)), ("Backward FLOPs", si(t.backward.flops))]
    lines += [
        ("Input size", iec(t.input_bytes)),
        ("Params size", iec(t.param_bytes)),
        ("Forward bytes read / written", f"{iec(t.forward.bytes_read)} / {iec(t.forward.bytes_written)}"),
    ]
    if cov.complete:
        lines.append(("Coverage", "complete: every op has a cost formula"))
    else:
        ops = ", ".join(f"{u.op} x{u.count}" for u in cov.uncounted[:4])
        more = f" and {len(cov.uncounted) - 4} more" if len(cov.uncounted) > 4 else ""
        lines.append(("Coverage", f"INCOMPLETE: no formula for {ops}{more}"))
    if cov.uncalled_modules:
        lines.append(("Modules never called", str(len(cov.uncalled_modules))))
    return lines
