"""Pandas frames and the notebook's HTML table."""

from __future__ import annotations

from html import escape
from typing import Iterable

from ..errors import InputError
from ..reports.table import Table
from .layout import Grid, grid

__all__ = ["dataframe", "notebook_html", "grid_html"]


def dataframe(rows: Iterable[dict]):
    """The rows as a pandas DataFrame (needs the ``pandas`` extra)."""
    try:
        import pandas as pd
    except ImportError as e:
        raise InputError("to_dataframe() needs pandas: pip install 'layerscope[pandas]'") from e
    return pd.DataFrame(list(rows))


def grid_html(g: Grid) -> str:
    """A plain HTML table (no script: notebook front ends may strip scripts) of a grid."""
    def cells(tag: str, row) -> str:
        first, rest = row[0], row[1:]
        return (f"<{tag} style='text-align:left;white-space:pre;font-family:monospace'>{escape(first)}</{tag}>"
                + "".join(f"<{tag} style='text-align:right'>{escape(c)}</{tag}>" for c in rest))

    def facts(lines) -> str:
        return "".join(f"<tr><td style='text-align:left'><b>{escape(k)}</b></td>"
                       f"<td colspan='{max(len(g.header) - 1, 1)}' style='text-align:left'>{escape(v)}</td></tr>"
                       for k, v, _ in lines)
    rows = "".join(f"<tr>{cells('td', r)}</tr>" for r in g.body)
    head = f"<table>{facts(g.context)}</table>" if g.context else ""
    return (f"<div><b>{escape(g.title)}</b>{head}<table><thead><tr>{cells('th', g.header)}</tr></thead>"
            f"<tbody>{rows}</tbody><tfoot>{facts(g.footer)}</tfoot></table></div>")


def notebook_html(table: Table) -> str:
    return grid_html(grid(table))
