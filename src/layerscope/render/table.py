"""Rich terminal table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from .columns import build_rows, footer_lines

if TYPE_CHECKING:
    from ..report import Report


def render_rich(rep: "Report", depth: int | None = None, columns=None, fold: bool = True) -> Group:
    header, body = build_rows(rep, depth, columns, fold)
    return rich_table(f"layerscope: {rep.model_name}", header, body, footer_lines(rep))


def rich_table(title: str, header: list[str], body: list[list[str]], footer: list[tuple[str, str]]) -> Group:
    table = Table(title=title, box=box.SIMPLE_HEAVY, header_style="bold")
    table.add_column(header[0], no_wrap=True)
    for h in header[1:]:
        table.add_column(h, justify="right", no_wrap=True)
    for row in body:
        table.add_row(*(Text(c) for c in row))
    foot = Table.grid(padding=(0, 2))
    foot.add_column(style="bold")
    foot.add_column()
    for k, v in footer:
        foot.add_row(Text(k), Text(v, style="red" if v.startswith(("INCOMPLETE", "DOES NOT FIT")) else ""))
    return Group(table, foot)
