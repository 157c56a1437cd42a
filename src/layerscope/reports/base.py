"""What every report kind renders the same way, without importing a renderer.

A report says what it is (``table_model()``: its rows through its columns, with its header and
footer); ``layerscope.render`` says how that looks and plugs itself in here when layerscope is
imported (``use_renderer``). The reports sit below render in the layering, so they reach it only
through this one seam: ``render`` imports the reports, never the reverse.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol, TextIO

from .table import Table

__all__ = ["Renderer", "Rendered", "use_renderer", "renderer", "Totals"]


class Renderer(Protocol):
    def text(self, table: Table, fold: bool, width: int | None) -> str: ...
    def rich(self, table: Table, fold: bool, width: int | None) -> Any: ...
    def csv(self, report: "Rendered") -> str: ...
    def table_csv(self, table: Table) -> str: ...
    def onnx_node(self, node: Any) -> dict: ...
    def chrome_trace(self, report: Any) -> dict: ...
    def json(self, report: "Rendered", **options: Any) -> dict: ...
    def dataframe(self, report: "Rendered") -> Any: ...
    def notebook(self, table: Table) -> str: ...
    def html_page(self, title: str | None, **reports: Any) -> str: ...
    def write(self, text: str, path: str | None) -> str: ...


_RENDERER: list[Renderer] = []


def use_renderer(r: Renderer) -> None:
    """Called once, by ``layerscope.render`` as it is imported."""
    _RENDERER[:] = [r]


def renderer() -> Renderer:
    if not _RENDERER:   # pragma: no cover - layerscope/__init__ imports render, which plugs itself in
        raise RuntimeError("layerscope.render is not imported: import layerscope first")
    return _RENDERER[0]


class Rendered:
    """``table()`` (plain text), ``rich_table()``, ``print()`` (rich on a terminal, fitted to it;
    plain text otherwise), ``to_dict()`` / ``to_json()`` (the versioned JSON of docs/json.md),
    ``to_csv()``, ``to_dataframe()``, ``to_html()`` / ``save_html()`` (the self-contained page;
    pass the other reports of the same model to put them on one page) and ``_repr_html_()``.
    A kind defines ``table_model(depth, columns, **view)`` and sets ``_html_part``."""

    _html_part = "summary"
    kind = "summary"

    def _csv_view(self) -> dict[str, Any]:
        """View options of the table that CSV and pandas take (every column, every row)."""
        return {}

    def table_model(self, depth: int | None = None, columns=None, **view: Any) -> Table:  # pragma: no cover
        raise NotImplementedError

    # ---- the views (each kind keeps its own signature and calls these) ---------------------
    def _text(self, depth=None, columns=None, fold: bool = True, width: int | None = None, **view) -> str:
        return renderer().text(self.table_model(depth, columns, **view), fold, width)

    def _rich(self, depth=None, columns=None, fold: bool = True, width: int | None = None, **view):
        return renderer().rich(self.table_model(depth, columns, **view), fold, width)

    def _print(self, file: TextIO | None = None, depth=None, columns=None, fold: bool = True, **view) -> None:
        """A rich table on a terminal, fitted to its width; plain text otherwise."""
        file = file or sys.stdout
        if getattr(file, "isatty", lambda: False)():
            from rich.console import Console
            console = Console(file=file)
            console.print(self._rich(depth, columns, fold, console.width, **view))
        else:
            file.write(self._text(depth, columns, fold, None, **view))

    def to_dict(self) -> dict[str, Any]:
        return renderer().json(self)

    def to_json(self, path: str | None = None, indent: int | None = 2) -> str:
        import json
        return renderer().write(json.dumps(self.to_dict(), indent=indent), path)

    def to_csv(self, path: str | None = None) -> str:
        return renderer().write(renderer().csv(self), path)

    def to_dataframe(self):
        """The rows as a pandas DataFrame (needs the ``pandas`` extra)."""
        return renderer().dataframe(self)

    def to_html(self, *, summary=None, memory=None, latency=None, plan=None, title: str | None = None) -> str:
        parts = {"summary": summary, "memory": memory, "latency": latency, "plan": plan}
        parts[self._html_part] = self
        return renderer().html_page(title, **{k: v for k, v in parts.items() if v is not None})

    def save_html(self, path: str, **others) -> str:
        """Write the page to ``path``; returns the HTML."""
        return renderer().write(self.to_html(**others), path)

    def _repr_html_(self) -> str:
        return renderer().notebook(self.table_model(3, None))

    def __str__(self) -> str:
        return self.table()

    def table(self, *args, **kwargs) -> str:  # pragma: no cover - every kind defines its own
        return self._text(*args, **kwargs)


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
