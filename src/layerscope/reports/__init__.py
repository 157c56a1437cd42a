"""Result records of every report kind and their columns: the table model every view is drawn from.
No rendering code: render/ imports this package, never the reverse."""

from .table import Column, Fact, Row, Table, flat_table, select_columns, tree_table

__all__ = ["Column", "Fact", "Row", "Table", "flat_table", "select_columns", "tree_table"]
