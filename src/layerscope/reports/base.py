"""What every report kind has in common, below any renderer.

A report is a frozen record that says what it is: ``table_model()`` reads its rows through its
columns, with its header and footer; ``json_fields()`` names what its JSON holds besides.
How that looks (text, rich, CSV, JSON, pandas, HTML) is ``layerscope.render``'s job: render imports
the reports, never the reverse, and the report objects users receive (``layerscope.Report`` and the
other kinds) are render's thin view classes over these records (``layerscope.render.views``).
"""

from __future__ import annotations

from typing import Any

from .table import Table

__all__ = ["ReportRecord", "Totals"]


class ReportRecord:
    """The record side of a report kind: ``kind``, ``table_model(depth, columns, **view)`` and the
    view options CSV and pandas take (``_csv_view``)."""

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
