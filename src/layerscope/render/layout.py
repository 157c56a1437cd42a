"""From a Table to the cells a text view draws: the tree of names, folded runs, units, and a width.

Every text view (rich terminal, plain text, notebook HTML) takes a ``Grid`` built here, so they fold,
format and fit the same way. Fitting never cuts a number: names lose their middle first, then the
columns a report marks as least important drop, and only then do names shrink further.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..reports.table import Fact, Row, Table
from .fold import find_folds
from .units import fmt

__all__ = ["Grid", "grid", "fit", "fact_text", "shorten", "tree_names", "wrap_text", "NAME_WIDTH"]

NAME_WIDTH = 40          # a layer's local name longer than this loses its middle
_MIN_NAME = 16           # names (after their tree drawing) shrink to this before any column is dropped
_MIN_UNIT = 4            # a stage range's unit cut to its end keeps "…" and 3 characters at least


@dataclass(frozen=True)
class Grid:
    title: str
    header: tuple[str, ...]              # the name column first
    body: tuple[tuple[str, ...], ...]
    drop: tuple[int, ...]                # per column: when to drop it (0: never)
    prefixes: tuple[str, ...]            # per body row: the tree drawing in front of its name
    context: tuple[tuple[str, str, bool], ...]
    footer: tuple[tuple[str, str, bool], ...]
    dropped: tuple[str, ...] = ()        # headers of columns left out to fit the width
    tree: bool = True                    # names are module paths under a tree drawing

    @property
    def widths(self) -> list[int]:
        return [max(len(row[i]) for row in (self.header, *self.body)) for i in range(len(self.header))]


def fact_text(f: Fact) -> str:
    """A header or footer line's value: by its unit, or parts joined (text and (value, unit) pairs)."""
    if isinstance(f.value, tuple) and f.unit == "text":
        return "".join(p if isinstance(p, str) else fmt(p[1], p[0]) for p in f.value)
    return fmt(f.unit, f.value)


def shorten(name: str, width: int = NAME_WIDTH) -> str:
    """A long name keeps its start and as much of its end as fits: the end says which layer it is,
    the start where it lives."""
    if len(name) <= width:
        return name
    if width <= 2:
        return name[:width]
    head = name.split(".", 1)[0][: max(1, width // 3)]
    return head + "…" + name[-(width - len(head) - 1):]


_STAGE = re.compile(r"^(\d+: )(.*)$")


def shorten_start(name: str, width: int) -> str:
    """A flat table's name (a stage's ``3: model.layers.4 .. model.layers.7``, an ONNX node's
    ``node_Conv_54``) in ``width`` characters, keeping its end, the part that tells rows apart: the
    stage number stays, the last unit stays whole while it can, then both units lose their start, the
    first down to ``…`` and 3 characters (a ``…`` says where): a range never loses its first unit
    entirely (``0: … .. blocks.1`` at 80 columns, issue 58) until even that cannot fit."""
    if len(name) <= width:
        return name
    m = _STAGE.match(name)
    prefix, rest = (m.group(1), m.group(2)) if m else ("", name)
    room = width - len(prefix)
    if room < 2:
        return shorten(name, width)
    first, sep, last = rest.rpartition(" .. ")

    def end(part: str, n: int) -> str:
        return part if len(part) <= n else "…" + part[len(part) - n + 1:]
    if sep:
        avail = room - len(sep)
        if avail - len(last) >= _MIN_UNIT:
            return prefix + end(first, avail - len(last)) + sep + last
        if avail >= 2 * _MIN_UNIT:
            n = min(len(first), _MIN_UNIT)
            return prefix + end(first, n) + sep + end(last, avail - n)
    return prefix + end(rest, room)


def name_floor(names, width: int) -> int:
    """The width a flat table's names (stage ranges) keep before a column is dropped: each range's
    first unit by at least ``…`` and 5 characters and its last unit whole, at most a third of
    ``width`` (and never under _MIN_NAME)."""
    need = _MIN_NAME
    for name in names:
        m = _STAGE.match(name)
        first, sep, last = (m.group(2) if m else name).rpartition(" .. ")
        if sep:
            need = max(need, len(m.group(1) if m else "") + min(len(first), 6) + len(sep) + len(last))
    return min(need, max(_MIN_NAME, width // 3))


_SUFFIX = re.compile(r"( x\d+ \(each\)| #\d+)$")


def shorten_name(name: str, width: int) -> str:
    """A row's ``local: Type`` name in ``width`` characters: the type loses its end first, then the
    type goes (the path and a fold's ``x80 (each)`` stay), then the path loses its middle."""
    if len(name) <= width:
        return name
    local, sep, rest = name.partition(": ")
    if sep:
        m = _SUFFIX.search(rest)
        suffix = m.group(1) if m else ""
        typ = rest[: len(rest) - len(suffix)]
        room = width - len(local) - 2 - len(suffix)
        if room >= 4:
            return f"{local}: {typ[: room - 1]}…{suffix}"
        if len(local) + len(suffix) <= width:
            return local + suffix
        return shorten(local, width - len(suffix)) + suffix if width - len(suffix) >= 6 else shorten(name, width)
    return shorten(name, width)


def tree_names(rows: tuple[Row, ...]) -> list[tuple[str, str]]:
    """(tree drawing, name) per row, torchinfo style: each row shows its path's last part and type."""
    if not rows or rows[0].depth is None:
        return [("", r.path or r.type) for r in rows]
    by_index = {r.index: r for r in rows}
    last_child: dict[int, int] = {}
    for r in rows:
        if r.parent is not None:
            last_child[r.parent] = r.index
    out = []
    for r in rows:
        parent = by_index.get(r.parent) if r.parent is not None else None
        if parent is None:
            out.append(("", r.type if r.parent is None else f"{r.path}: {r.type}"))
            continue
        chain, p = [], parent
        while p is not None and p.parent is not None:
            chain.append("    " if last_child.get(p.parent) == p.index else "│   ")
            p = by_index.get(p.parent)
        local = r.path[len(parent.path) + 1:] if parent.path and r.path.startswith(parent.path + ".") \
            else (r.path or r.type)
        local = shorten(local)
        call = f" #{r.call_index + 1}" if r.call_index else ""
        prefix = "".join(reversed(chain)) + ("└─" if last_child.get(r.parent) == r.index else "├─")
        out.append((prefix, f"{local}: {r.type}{call}"))
    return out


def _cells(table: Table, r: Row) -> list[str]:
    return [(t if t is not None else fmt(c.unit, v)) + s
            for c, v, t, s in zip(table.columns, r.values, r.texts, r.suffixes)]


def grid(table: Table, fold: bool = True) -> Grid:
    """The cells of ``table``: names drawn as a tree, values by their units, runs of identical
    blocks folded into one row (``layers.0-79: LlamaDecoderLayer x80 (each)``) unless ``fold`` is
    False."""
    rows = table.rows
    names = tree_names(rows)
    body = [[n] + _cells(table, r) for (_, n), r in zip(names, rows)]
    prefixes = [p for p, _ in names]
    folds = find_folds(table) if fold else []
    volatile = [j for j, c in enumerate(table.columns) if not c.fold]
    keep = [True] * len(rows)
    for f in folds:
        first = f.blocks[0]
        local = body[first][0].partition(": ")[0]
        body[first][0] = f"{local}-{f.last}: {rows[first].type} x{f.count} (each)"
        # a value that differs from block to block (a peak, a time): each row of the fold shows the
        # highest or the median over the same row of every folded block (the blocks have the same
        # rows in the same order: that is what made them fold)
        for off in range(f.blocks[1] - first):
            for j in volatile:
                col = table.columns[j]
                vals = sorted(v for v in (rows[b + off].values[j] for b in f.blocks) if v is not None)
                if vals:
                    v = vals[-1] if col.fold_with == "max" else vals[len(vals) // 2]
                    body[first + off][j + 1] = fmt(col.unit, v) + rows[first + off].suffixes[j]
        # the run's last block may close its parent's branch: then the fold row closes it
        closes = prefixes[f.blocks[-1]].endswith("└─")
        if closes:
            prefixes[first] = prefixes[first][:-2] + "└─"
            at = len(prefixes[first]) - 2
            for k in range(first + 1, f.blocks[1]):
                if prefixes[k][at:at + 1] == "│":
                    prefixes[k] = prefixes[k][:at] + " " + prefixes[k][at + 1:]
        for k in range(f.blocks[1], f.end + 1):
            keep[k] = False
    footer = [(f.label, fact_text(f), f.alert) for f in table.footer]
    if folds and volatile:
        how = {}
        for j in volatile:
            how.setdefault("the median" if table.columns[j].fold_with == "median" else "the highest", []).append(
                table.columns[j].header)
        footer.append(("Folded rows", "; ".join(f"{', '.join(h)}: {w} over the folded blocks" for w, h in how.items())
                       + " (--expand shows each block)", False))
    header = (table.first_header,) + tuple(c.header for c in table.columns)
    return Grid(title=table.title, header=header,
                body=tuple((prefixes[k] + body[k][0],) + tuple(body[k][1:]) for k in range(len(rows)) if keep[k]),
                drop=(0,) + tuple(c.drop for c in table.columns),
                prefixes=tuple(prefixes[k] for k in range(len(rows)) if keep[k]),
                context=tuple((f.label, fact_text(f), f.alert) for f in table.context),
                footer=tuple(footer), tree=table.tree)


def _with_names(g: Grid, width: int) -> Grid:
    """``g`` with every name (the part after its tree drawing) at most ``width`` characters wide."""
    body = []
    for p, row in zip(g.prefixes, g.body):
        name = row[0][len(p):]
        short = shorten_name if g.tree else shorten_start
        body.append((p + short(name, max(width - len(p), 6)),) + row[1:])
    header = (shorten(g.header[0], width),) + g.header[1:]
    return replace(g, body=tuple(body), header=header)


def _without(g: Grid, col: int) -> Grid:
    keep = [i for i in range(len(g.header)) if i != col]
    return replace(g, header=tuple(g.header[i] for i in keep), body=tuple(tuple(r[i] for i in keep) for r in g.body),
                   drop=tuple(g.drop[i] for i in keep), dropped=g.dropped + (g.header[col],))


def fit(g: Grid, width: int | None, sep: int = 2, edge: int = 0) -> Grid:
    """``g`` narrowed to ``width`` characters (columns apart by ``sep``, ``edge`` more in all): names
    first lose their middle down to a floor, then the columns with the highest ``drop`` go, then
    names shrink to what is left. Numbers are never cut: a table whose numbers alone are wider than
    ``width`` is returned as wide as they need."""
    if width is None:
        return g

    def total(x: Grid) -> int:
        return sum(x.widths) + sep * (len(x.header) - 1) + edge

    if total(g) <= width:
        return g
    natural = g
    floor = min(max((len(p) for p in g.prefixes), default=0) + _MIN_NAME, natural.widths[0])
    if not g.tree:            # stage ranges: both ends readable before a column goes (name_floor)
        floor = min(max(floor, name_floor((r[0] for r in g.body), width)), natural.widths[0])
    while True:
        rest = total(natural) - natural.widths[0]
        room = width - rest
        if room >= floor:
            return _with_names(natural, max(room, floor))
        droppable = [i for i, d in enumerate(natural.drop) if d > 0]
        if not droppable:
            return _with_names(natural, max(room, 8))
        natural = _without(natural, max(droppable, key=lambda i: (natural.drop[i], i)))



_HANG = re.compile(r"^(\s*\S+(?: \S+)*?\s{2,})\S")     # "  hf:PRESET      a shipped ...": the second column


def _column(line: str) -> int | None:
    m = _HANG.match(line)
    return len(m.group(1)) if m and line[:1] == " " else None


def _logical(text: str) -> list[str]:
    """The lines of ``text`` with their hand-made wrapping undone: a prose line (no indentation)
    joins the prose line before it, a line indented to the second column of a listing line joins
    that line. Blank lines and listing lines stay apart."""
    out: list[str] = []
    for line in text.splitlines():
        lead = len(line) - len(line.lstrip())
        prev = out[-1] if out else ""
        if line.strip() and prev.strip():
            if (lead == 0 and prev[:1] != " ") or (lead and lead == _column(prev)):
                out[-1] = prev.rstrip() + " " + line.strip()
                continue
        out.append(line)
    return out or [""]


def wrap_text(text: str, width: int) -> list[str]:
    """Prose and indented listings in ``width`` columns: a line that does not fit wraps at spaces
    (never inside a word), its continuation under its own text (a listing's second column when it
    leaves room, else the indentation plus two); a command line (``layerscope ...``) continues with
    `` \\`` so it still pastes. A word longer than ``width`` stays whole."""
    import textwrap
    out: list[str] = []
    for line in _logical(text):
        if len(line) <= width:
            out.append(line)
            continue
        lead = len(line) - len(line.lstrip())
        col = _column(line)
        hang = col if col is not None and col <= width // 2 else (lead + 2 if lead else 0)
        wrap = dict(break_long_words=False, break_on_hyphens=False)
        if line.lstrip().startswith("layerscope "):
            # a command: its comment goes on a line of its own above it (a `\\` inside a comment
            # would not continue the command), the command continues with `\\`
            command, _, comment = line.partition("  # ")
            if comment:
                out += textwrap.wrap("# " + comment.strip(), width, initial_indent=" " * lead,
                                     subsequent_indent=" " * lead + "# ", **wrap)
            parts = textwrap.wrap(command.rstrip(), width - 2, subsequent_indent=" " * (lead + 4), **wrap)
            out += [p + " \\" for p in parts[:-1]] + parts[-1:]
            continue
        out += textwrap.wrap(line, width, subsequent_indent=" " * hang, **wrap) or [line]
    return out
