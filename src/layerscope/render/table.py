"""Rich terminal table, fitted to the console: names shrink and low-priority columns drop before any
number is cut."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.table import Table as RichTable
from rich.text import Text

from ..reports.table import Table
from .layout import Grid, fit, grid

__all__ = ["render_rich", "rich_grid"]

# rich's SIMPLE_HEAVY table: one space of padding each side of a cell, a one-space divider between
# columns and a one-space edge each side: width = sum of cells + 3 per column + 1
_SEP, _EDGE = 3, 4


def render_rich(table: Table, fold: bool = True, width: int | None = None) -> Group:
    return rich_grid(fit(grid(table, fold), width, sep=_SEP, edge=_EDGE))


def _facts(lines) -> RichTable:
    t = RichTable.grid(padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    for k, v, alert in lines:
        t.add_row(Text(k), Text(v, style="red" if alert else ""))
    return t


def rich_grid(g: Grid) -> Group:
    parts: list = [Text(g.title, style="bold")]
    if g.context:
        parts.append(_facts(g.context))
    table = RichTable(box=box.SIMPLE_HEAVY, header_style="bold")
    widths = g.widths
    table.add_column(g.header[0], no_wrap=True, overflow="ellipsis")
    # a number column never narrows: when the terminal is narrower still, the name column gives way
    for h, w in zip(g.header[1:], widths[1:]):
        table.add_column(h, justify="right", no_wrap=True, min_width=w)
    for row in g.body:
        table.add_row(*(Text(c) for c in row))
    parts.append(table)
    footer = list(g.footer)
    if g.dropped:
        footer.append(("Columns left out", f"{', '.join(g.dropped)} (the terminal is too narrow)", False))
    parts.append(_facts(footer))
    return Group(*parts)
