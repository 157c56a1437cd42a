"""The report objects users receive: each kind's record (``layerscope.reports``) with its views.

Why a subclass here and not methods on the records: the reports sit below render in the layering
(DESIGN.md), so a record cannot reach a renderer without importing upward, and handing it one at
import time (a module-level renderer that importing ``layerscope.render`` sets) is global state
another import order can miss. So the records stay plain data, and each public kind is the record
class plus ``Views``: the same constructor and fields, and methods that call the renderers
directly. Nothing is registered and nothing is stored at module level; whoever hands a report to a
user (the API's entry points) builds the view class, or turns a record into one with ``view()``.

Every kind is a rich renderable too: ``rich.console.Console().print(report)`` prints its table
fitted to the console's width.
"""

from __future__ import annotations

import json as _json
import sys
from typing import Any, TextIO

from ..errors import InputError
from ..reports import compare as _compare
from ..reports import latency as _latency
from ..reports import memory as _memory
from ..reports import parallel as _parallel
from ..reports import plan as _plan
from ..reports import summary as _summary
from ..reports.table import Table
from .csv import render_csv, table_rows
from .json import report_json
from .output import dataframe, notebook_html, write_text
from .table import render_rich
from .text import render_text

__all__ = ["Views", "Report", "MemoryReport", "LatencyReport", "StagePlan", "Comparison", "ParallelReport", "view", "compare",
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


class Views:
    """What every report kind shows, the same way: ``table()`` (plain text), ``rich_table()``,
    ``print()`` (rich on a terminal, fitted to it; plain text otherwise), ``to_dict()`` /
    ``to_json()`` (the versioned JSON of docs/json.md), ``to_csv()``, ``to_dataframe()``,
    ``to_html()`` / ``save_html()`` (the self-contained page; pass the other reports of the same
    model to put them on one page), ``_repr_html_()`` and rich's ``__rich_console__``. Each kind
    keeps its own ``table()`` signature and calls these."""

    __slots__ = ()

    def _text(self, depth=None, columns=None, fold: bool = True, width: int | None = None, **view) -> str:
        return table_text(self.table_model(depth, columns, **view), fold, width)

    def _rich(self, depth=None, columns=None, fold: bool = True, width: int | None = None, **view):
        return table_rich(self.table_model(depth, columns, **view), fold, width)

    def _print(self, file: TextIO | None = None, depth=None, columns=None, fold: bool = True, **view) -> None:
        """A rich table on a terminal, fitted to its width; plain text otherwise."""
        print_table(self.table_model(depth, columns, **view), file, fold)

    def _full_table(self) -> Table:
        """Every column and row: what CSV and pandas hold."""
        return self.table_model(None, "all", **self._csv_view())

    def __rich_console__(self, console, options):
        # the table a plain ``print()`` draws, fitted to what the console gives it
        yield self.rich_table(width=options.max_width)

    def to_dict(self) -> dict[str, Any]:
        return report_json(self)

    def to_json(self, path: str | None = None, indent: int | None = 2) -> str:
        return write_text(_json.dumps(self.to_dict(), indent=indent), path)

    def to_csv(self, path: str | None = None) -> str:
        return write_text(render_csv(self._full_table()), path)

    def to_dataframe(self):
        """The rows as a pandas DataFrame (needs the ``pandas`` extra)."""
        return dataframe(table_rows(self._full_table()))

    def to_html(self, *, summary=None, memory=None, latency=None, plan=None, parallel=None,
                title: str | None = None) -> str:
        from .html import html_page
        parts = {"summary": summary, "memory": memory, "latency": latency, "plan": plan, "parallel": parallel}
        parts[self._html_part] = self
        return html_page(title, **{k: v for k, v in parts.items() if v is not None})

    def save_html(self, path: str, **others) -> str:
        """Write the page to ``path``; returns the HTML."""
        return write_text(self.to_html(**others), path)

    def _repr_html_(self) -> str:
        return notebook_html(self.table_model(3, None))

    def __str__(self) -> str:
        return self.table()

    def table(self, *args, **kwargs) -> str:  # pragma: no cover - every kind defines its own
        return self._text(*args, **kwargs)

    def rich_table(self, *args, **kwargs):  # pragma: no cover - every kind defines its own
        return self._rich(*args, **kwargs)


class Report(Views, _summary.Report):
    """Results of ``layerscope.analyze`` (the record: ``layerscope.reports.summary.Report``)."""

    def table(self, depth: int | None = None, columns=None, fold: bool = True, width: int | None = None) -> str:
        """The layer table as plain text. ``fold``: runs of 3 or more identical blocks show as one
        row, ``layers.0-79: LlamaDecoderLayer x80 (each)`` (``fold=False`` shows every block);
        ``width``: fit to that many characters (names shrink, then low-priority columns drop)."""
        return self._text(depth, columns, fold, width)

    def rich_table(self, depth: int | None = None, columns=None, fold: bool = True, width: int | None = None):
        return self._rich(depth, columns, fold, width)

    def print(self, depth: int | None = None, columns=None, file: TextIO | None = None, fold: bool = True) -> None:
        """Print the table: a rich table fitted to the terminal, plain text otherwise."""
        self._print(file, depth, columns, fold)


class MemoryReport(Views, _memory.MemoryReport):
    """Results of ``layerscope.memory`` (the record: ``layerscope.reports.memory.MemoryReport``)."""

    def table(self, depth: int | None = None, fold: bool = True, columns=None, width: int | None = None) -> str:
        """The per-layer table as plain text (``fold``: runs of identical blocks as one row)."""
        return self._text(depth, columns, fold, width)

    def rich_table(self, depth: int | None = None, fold: bool = True, columns=None, width: int | None = None):
        return self._rich(depth, columns, fold, width)

    def print(self, depth: int | None = None, file: TextIO | None = None, fold: bool = True, columns=None) -> None:
        """Print the table: a rich table fitted to the terminal, plain text otherwise."""
        self._print(file, depth, columns, fold)

    def to_dict(self, timeline: bool = True) -> dict[str, Any]:
        return report_json(self, timeline=timeline)

    def to_json(self, path: str | None = None, indent: int | None = 2, timeline: bool = True) -> str:
        return write_text(_json.dumps(self.to_dict(timeline), indent=indent), path)


class LatencyReport(Views, _latency.LatencyReport):
    """Results of ``layerscope.profile`` (the record: ``layerscope.reports.latency.LatencyReport``)."""

    def table(self, depth: int | None = None, top: int = 3, fold: bool = True, columns=None,
              width: int | None = None) -> str:
        """The tree table; the footer names the ``top`` slowest calls at each depth (0: none)."""
        return self._text(depth, columns, fold, width, top=top)

    def rich_table(self, depth: int | None = None, top: int = 3, fold: bool = True, columns=None,
                   width: int | None = None):
        return self._rich(depth, columns, fold, width, top=top)

    def print(self, depth: int | None = None, top: int = 3, file: TextIO | None = None, fold: bool = True,
              columns=None) -> None:
        self._print(file, depth, columns, fold, top=top)

    def to_chrome_trace(self, path: str | None = None) -> str:
        """Chrome trace / Perfetto JSON of the module spans of one repeat (the one whose forward is
        the median), forward and backward on separate tracks; open in ui.perfetto.dev or
        chrome://tracing."""
        from .latency import chrome_trace
        return write_text(_json.dumps(chrome_trace(self)), path)


class StagePlan(Views, _plan.StagePlan):
    """Result of ``layerscope.partition`` (the record: ``layerscope.reports.plan.StagePlan``)."""

    def table(self, depth: int | None = None, columns=None, width: int | None = None, **_: Any) -> str:
        return self._text(None, columns, True, width)

    def rich_table(self, columns=None, width: int | None = None, **_: Any):
        return self._rich(None, columns, True, width)

    def print(self, file: TextIO | None = None, columns=None, **_: Any) -> None:
        self._print(file, None, columns, True)


class Comparison(Views, _compare.Comparison):
    """Result of ``layerscope.compare`` (the record: ``layerscope.reports.compare.Comparison``)."""

    def table(self, depth: int | None = 2, changed: bool = False, fold: bool = True, width: int | None = None) -> str:
        """A row per layer: each metric for A, for B and B - A. ``changed``: only rows that differ."""
        return self._text(depth, None, fold, width, changed=changed)

    def rich_table(self, depth: int | None = 2, changed: bool = False, fold: bool = True, width: int | None = None):
        return self._rich(depth, None, fold, width, changed=changed)

    def print(self, depth: int | None = 2, changed: bool = False, file=None, fold: bool = True) -> None:
        self._print(file, depth, None, fold, changed=changed)

    def to_html(self, **others) -> str:
        # the page shows one model's reports; a comparison has none yet (it raised a TypeError from
        # page_data before): one clear line instead
        raise InputError("a comparison has no HTML page: use its table, to_json(), to_csv() or "
                         "to_dataframe(), or put each side on its own page (report.save_html)")


class ParallelReport(Views, _parallel.ParallelReport):
    """Result of ``layerscope.parallel`` (the record: ``layerscope.reports.parallel.ParallelReport``): a
    row per role (ranks that hold the same bytes), the parts of each one's peak."""

    def table(self, columns=None, width: int | None = None, **_: Any) -> str:
        return self._text(None, columns, True, width)

    def rich_table(self, columns=None, width: int | None = None, **_: Any):
        return self._rich(None, columns, True, width)

    def print(self, file: TextIO | None = None, columns=None, **_: Any) -> None:
        self._print(file, None, columns, True)


_VIEW_OF: dict[type, type] = {_summary.Report: Report, _memory.MemoryReport: MemoryReport,
                               _latency.LatencyReport: LatencyReport, _plan.StagePlan: StagePlan,
                               _compare.Comparison: Comparison,
                               _parallel.ParallelReport: ParallelReport}   # read only


def view(record):
    """The record as the report object users receive (the view class of its kind), the same fields
    without running the constructor again; a view, or anything not a report record, comes back as
    it is."""
    if isinstance(record, Views):
        return record
    cls = _VIEW_OF.get(type(record))
    if cls is None:
        return record
    out = object.__new__(cls)
    out.__dict__.update(record.__dict__)
    return out


def as_dict(x) -> dict:
    """A report's JSON dict (a report object or a record), or ``x`` itself (a saved JSON)."""
    if isinstance(x, Views):
        return x.to_dict()
    return report_json(x) if hasattr(x, "table_model") else x


def compare(a, b, names: tuple[str, str] = ("A", "B")) -> Comparison:
    """Compare two reports of one kind (``analyze``, ``memory`` or ``profile`` results, or their
    ``to_dict()`` / saved JSON) layer by layer."""
    return view(_compare.compare(as_dict(a), as_dict(b), names))
