"""What every report kind has in common, below any renderer.

A report is a frozen record that says what it is: ``table_model()`` reads its rows through its
columns, with its header and footer; ``json_fields()`` names what its JSON holds besides. Each kind
is ONE class, defined here in reports/ (``layerscope.Report`` is ``reports.summary.Report``), and
users receive it with every view (``table()``, ``to_json()``, ``to_csv()``, ``save_html()``...).
How those look is ``layerscope.render``'s job; the views reach it through ``RENDERERS`` below,
never by importing it (render sits above the reports: it imports them, never the reverse).
"""

from __future__ import annotations

import json as _json
from typing import Any, Callable, TextIO

from ..errors import LayerscopeError
from .table import Table

__all__ = ["RENDERERS", "VIEWS", "register", "rendered", "write_text", "Views", "ReportRecord", "Totals"]

# What the views ask render for, by name (the arguments each function takes):
#   text(table, fold, width) -> str        rich(table, fold, width) -> a rich renderable
#   print(table, file, fold) -> None       csv(table) -> str           dataframe(table) -> DataFrame
#   json(report, **options) -> dict        notebook(table) -> str      html(title, parts) -> str
#   chrome_trace(latency_report) -> dict
VIEWS = ("text", "rich", "print", "csv", "dataframe", "json", "notebook", "html", "chrome_trace")

RENDERERS: dict[str, Callable[..., Any]] = {}
"""render's function for each view, by view name (``VIEWS``): the one seam between the reports
and the renderers (dependency inversion: the reports name what they need, render supplies it).

Why this and not what came before: the kinds used to get their views by being SUBCLASSED in
``render/views.py``, so there were two classes per kind (the record here, the report users received
there), and every entry point that hands a user a report had to import render to build the second
one. With this table each kind is one class, complete here, and the entry points build it directly.

Why keyed by view and not by kind: render draws every kind from the same table model, so a view is
one function for all kinds; a new kind (or a new column of one) registers nothing.

Why it is not the module-level state DESIGN.md warns of: it is filled once, by importing
``layerscope.render``, and never changed afterwards (``register`` refuses a second, different
function for a view). The package root imports render, and Python runs a package's ``__init__``
before any of its submodules, so no import order reaches a report without it; a report used where
it is somehow missing says so in one line (``rendered``), it does not fall back to anything."""


def register(**views: Callable[..., Any]) -> None:
    """Called by ``layerscope.render`` as it is imported: its function for each view."""
    unknown = sorted(set(views) - set(VIEWS))
    if unknown:
        raise LayerscopeError(f"no report view named {', '.join(unknown)} (views: {', '.join(VIEWS)})")
    for name, fn in views.items():
        if RENDERERS.get(name, fn) is not fn:
            raise LayerscopeError(f"the {name!r} view is registered already ({RENDERERS[name]!r})")
        RENDERERS[name] = fn


def rendered(view: str) -> Callable[..., Any]:
    """render's function for ``view``; one clear error where render was never imported."""
    try:
        return RENDERERS[view]
    except KeyError:
        raise LayerscopeError(f"a report's {view!r} view needs layerscope.render, which is not imported "
                              "(import layerscope, which imports it)") from None


def write_text(text: str, path: str | None) -> str:
    """Write ``text`` to ``path`` when one is given; return it either way."""
    if path is not None:
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    return text


class Views:
    """What every report kind shows, the same way: ``table()`` (plain text), ``rich_table()``,
    ``print()`` (rich on a terminal, fitted to it; plain text otherwise), ``to_dict()`` /
    ``to_json()`` (the versioned JSON of docs/json.md), ``to_csv()``, ``to_dataframe()``,
    ``to_html()`` / ``save_html()`` (the self-contained page; pass the other reports of the same
    model to put them on one page), ``_repr_html_()`` and rich's ``__rich_console__`` (so
    ``rich.console.Console().print(report)`` prints its table fitted to the console). Each kind
    keeps its own ``table()`` signature and calls these; render draws them (``RENDERERS``)."""

    __slots__ = ()

    def _text(self, depth=None, columns=None, fold: bool = True, width: int | None = None, **view) -> str:
        return rendered("text")(self.table_model(depth, columns, **view), fold, width)

    def _rich(self, depth=None, columns=None, fold: bool = True, width: int | None = None, **view):
        return rendered("rich")(self.table_model(depth, columns, **view), fold, width)

    def _print(self, file: TextIO | None = None, depth=None, columns=None, fold: bool = True, **view) -> None:
        """A rich table on a terminal, fitted to its width; plain text otherwise."""
        rendered("print")(self.table_model(depth, columns, **view), file, fold)

    def _full_table(self) -> Table:
        """Every column and row: what CSV and pandas hold."""
        return self.table_model(None, "all", **self._csv_view())

    def __rich_console__(self, console, options):
        # the table a plain ``print()`` draws, fitted to what the console gives it
        yield self.rich_table(width=options.max_width)

    def to_dict(self) -> dict[str, Any]:
        return rendered("json")(self)

    def to_json(self, path: str | None = None, indent: int | None = 2) -> str:
        return write_text(_json.dumps(self.to_dict(), indent=indent), path)

    def to_csv(self, path: str | None = None) -> str:
        return write_text(rendered("csv")(self._full_table()), path)

    def to_dataframe(self):
        """The rows as a pandas DataFrame (needs the ``pandas`` extra)."""
        return rendered("dataframe")(self._full_table())

    def to_html(self, *, summary=None, memory=None, latency=None, plan=None, parallel=None,
                title: str | None = None) -> str:
        parts = {"summary": summary, "memory": memory, "latency": latency, "plan": plan, "parallel": parallel}
        parts[self._html_part] = self
        return rendered("html")(title, {k: v for k, v in parts.items() if v is not None})

    def save_html(self, path: str, **others) -> str:
        """Write the page to ``path``; returns the HTML."""
        return write_text(self.to_html(**others), path)

    def _repr_html_(self) -> str:
        return rendered("notebook")(self.table_model(3, None))

    def __str__(self) -> str:
        return self.table()

    def table(self, *args, **kwargs) -> str:  # pragma: no cover - every kind defines its own
        return self._text(*args, **kwargs)

    def rich_table(self, *args, **kwargs):  # pragma: no cover - every kind defines its own
        return self._rich(*args, **kwargs)


class ReportRecord(Views):
    """A report kind: ``kind``, ``table_model(depth, columns, **view)``, ``json_fields()`` and the
    view options CSV and pandas take (``_csv_view``); the views come with it (``Views``)."""

    _html_part = "summary"
    kind = "summary"
    json_rows = "layers"       # the key of its JSON whose items are its table's rows

    def json_fields(self, **options: Any) -> tuple:  # pragma: no cover - every kind declares its own
        """What its JSON holds besides the table (reports.table.JsonField)."""
        raise NotImplementedError

    def _csv_view(self) -> dict[str, Any]:
        """View options of the table that CSV and pandas take (every column, every row)."""
        return {}

    def table_model(self, depth: int | None = None, columns=None, **view: Any) -> Table:  # pragma: no cover
        raise NotImplementedError


class Totals:
    """Typed totals of a report (a frozen dataclass) that still read like the dict they replaced:
    ``totals["peak_bytes"]``, ``totals.get("forward_plain")``, ``"forward_plain" in totals`` and
    ``dict(totals)`` see the fields that have a value."""

    __slots__ = ()

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key in self.__dataclass_fields__ and getattr(self, key) is not None

    def __getitem__(self, key: str) -> Any:
        if key not in self:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if key in self else default

    def keys(self) -> list[str]:
        return [k for k in self.__dataclass_fields__ if getattr(self, k) is not None]

    def __iter__(self):
        return iter(self.keys())

    def items(self) -> list[tuple[str, Any]]:
        return [(k, getattr(self, k)) for k in self.keys()]
