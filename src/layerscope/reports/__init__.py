"""Every report kind users receive, complete (one class per kind: its record, its columns, its views),
and the table model every view is drawn from. No rendering code: the views ask render for its
functions by name (``base.RENDERERS``); render/ imports this package, never the reverse."""

from .table import Column, Fact, Row, Table, flat_table, select_columns, tree_table

__all__ = ["Column", "Fact", "Row", "Table", "flat_table", "select_columns", "tree_table"]
