"""The views every report kind shows, drawn here and handed to the reports (``reports.base.RENDERERS``).

The report types users receive are complete in ``layerscope.reports`` (one class per kind, with
``table()``, ``to_json()``, ``to_csv()``, ``save_html()``...); their views ask render for each
drawing by name, and this module registers render's function for each name when
``layerscope.render`` is imported (the package root imports it). Nothing here subclasses a report:
a new kind, or a new column of one, is drawn by the same functions from its table model.
"""

from __future__ import annotations

import sys
from typing import TextIO

from ..reports import base as _base
# kept: the kinds' old home, public to the tests (tests/render/test_views.py, tests/test_public_api.py pin it)
from ..reports.compare import Comparison, compare  # noqa: F401
from ..reports.latency import LatencyReport  # noqa: F401
from ..reports.memory import MemoryReport  # noqa: F401
from ..reports.parallel import ParallelReport  # noqa: F401
from ..reports.plan import StagePlan  # noqa: F401
from ..reports.summary import Report  # noqa: F401
from ..reports.table import Table
from .csv import render_csv, table_rows
from .json import report_json
from .latency import chrome_trace
from .output import dataframe, notebook_html
from .table import render_rich
from .text import render_text

__all__ = ["Report", "MemoryReport", "LatencyReport", "StagePlan", "Comparison", "ParallelReport", "compare",
           "table_text", "table_rich", "print_table"]


def table_text(table: Table, fold: bool = True, width: int | None = None) -> str:
    """A table as plain text; a stage plan's simulated step below it."""
    out = render_text(table, fold, width)
    if table.meta.get("timeline") is not None:
        from .timeline import timeline_text
        out = out.rstrip("\n") + "\n\n" + timeline_text(table.meta["timeline"], width)
    return out


def table_rich(table: Table, fold: bool = True, width: int | None = None):
    """A table as a rich renderable; a stage plan's simulated step below it."""
    out = render_rich(table, fold, width)
    if table.meta.get("timeline") is not None:
        from rich.console import Group

        from .timeline import timeline_rich
        out = Group(out, timeline_rich(table.meta["timeline"], width))
    return out


def print_table(table: Table, file: TextIO | None = None, fold: bool = True) -> None:
    """A table as rich draws it on a terminal, fitted to the terminal's width; plain text (no
    width) to a file or a pipe."""
    file = file or sys.stdout
    if getattr(file, "isatty", lambda: False)():
        from rich.console import Console
        console = Console(file=file)
        console.print(table_rich(table, fold, console.width))
    else:
        file.write(table_text(table, fold, None))


def table_dataframe(table: Table):
    """The rows as a pandas DataFrame (needs the ``pandas`` extra)."""
    return dataframe(table_rows(table))


def html(title: str | None, parts: dict) -> str:
    """The self-contained page of one model's reports (``parts``: summary, memory, latency, plan,
    parallel)."""
    from .html import html_page      # the page's template and charts: read only when a page is made
    return html_page(title, **parts)


_base.register(text=table_text, rich=table_rich, print=print_table, csv=render_csv, dataframe=table_dataframe,
               json=report_json, notebook=notebook_html, html=html, chrome_trace=chrome_trace)
