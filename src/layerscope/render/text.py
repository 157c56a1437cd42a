"""Plain-text table (for files, pipes and logs), from a Table or from rows already formatted."""

from __future__ import annotations

from ..reports.table import Table
from .layout import Grid, fit, grid

__all__ = ["render_text", "grid_text", "text_table"]


def render_text(table: Table, fold: bool = True, width: int | None = None) -> str:
    """The table as text: what it is for, a tree column on the left, right-aligned numbers, the
    footer. ``width``: fit to that many characters (names shrink and low-priority columns drop
    before any number is cut)."""
    return grid_text(fit(grid(table, fold), width))


def _facts(lines, out: list[str]) -> None:
    kw = max((len(k) for k, _, _ in lines), default=0)
    out += [f"{k.ljust(kw)}  {v}".rstrip() for k, v, _ in lines]


def grid_text(g: Grid) -> str:
    widths = g.widths

    def line(row):
        first = row[0].ljust(widths[0])
        rest = [cell.rjust(w) for cell, w in zip(row[1:], widths[1:])]
        return "  ".join([first] + rest).rstrip()

    total = sum(widths) + 2 * (len(widths) - 1)
    out: list[str] = []
    if g.context:
        out.append(g.title)
        _facts(g.context, out)
    out += ["=" * total, line(g.header), "=" * total]
    out += [line(r) for r in g.body]
    out.append("=" * total)
    footer = list(g.footer)
    if g.dropped:
        footer.append(("Columns left out", f"{', '.join(g.dropped)} (too narrow)", False))
    _facts(footer, out)
    out.append("=" * total)
    return "\n".join(out) + "\n"


def text_table(header: list[str], body: list[list[str]], footer: list[tuple[str, str]]) -> str:
    """Rows formatted elsewhere (a listing, not a report) in the same layout."""
    g = Grid(title="", header=tuple(header), body=tuple(tuple(r) for r in body), drop=(0,) * len(header),
             prefixes=("",) * len(body), context=(), footer=tuple((k, v, False) for k, v in footer))
    return grid_text(g)
