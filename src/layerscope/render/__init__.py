"""Renderers: they format a Report, never change it."""

from .csv import render_csv
from .json import SCHEMA_VERSION
from .table import render_rich
from .text import render_text

__all__ = ["render_csv", "render_rich", "render_text", "SCHEMA_VERSION"]
