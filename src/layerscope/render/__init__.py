"""Renderers: they format a report's table model (``layerscope.reports``), never change it.

Importing this package plugs it into the reports (``reports.base.use_renderer``): the reports sit
below render and never import it.
"""

from __future__ import annotations

from typing import Any

from ..reports.base import use_renderer
from ..reports.table import Table
from .csv import render_csv, table_rows
from .json import SCHEMA_VERSION, report_json
from .output import dataframe, notebook_html, write_text
from .table import render_rich
from .text import render_text

__all__ = ["render_csv", "render_rich", "render_text", "SCHEMA_VERSION"]


class _Renderer:
    def text(self, table: Table, fold: bool, width: int | None) -> str:
        out = render_text(table, fold, width)
        if table.meta.get("timeline") is not None:     # a stage plan's simulated step, below its table
            from .timeline import timeline_text
            out = out.rstrip("\n") + "\n\n" + timeline_text(table.meta["timeline"], width)
        return out

    def rich(self, table: Table, fold: bool, width: int | None):
        out = render_rich(table, fold, width)
        if table.meta.get("timeline") is not None:
            from rich.console import Group

            from .timeline import timeline_rich
            out = Group(out, timeline_rich(table.meta["timeline"], width))
        return out

    def csv(self, report) -> str:
        return render_csv(report.table_model(None, "all", **report._csv_view()))

    def table_csv(self, table: Table) -> str:
        return render_csv(table)

    def onnx_node(self, node) -> dict:
        from .onnx import node_dict
        return node_dict(node)

    def json(self, report, **options: Any) -> dict:
        return report_json(report, **options)

    def dataframe(self, report):
        return dataframe(table_rows(report.table_model(None, "all", **report._csv_view())))

    def notebook(self, table: Table) -> str:
        return notebook_html(table)

    def html_page(self, title: str | None, **reports: Any) -> str:
        from .html import html_page
        return html_page(title, **reports)

    def chrome_trace(self, report) -> dict:
        from .latency import chrome_trace
        return chrome_trace(report)

    def write(self, text: str, path: str | None) -> str:
        return write_text(text, path)


use_renderer(_Renderer())
