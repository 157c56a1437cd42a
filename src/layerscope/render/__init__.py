"""Renderers: they format a report's table model (``layerscope.reports``), never change it.

The reports sit below render and never import it: each kind is complete in ``layerscope.reports``
and its views ask for render's functions by name (``reports.base.RENDERERS``), which importing this
package registers (``render.views``). The package root imports render, so every report a user
holds is drawn.
"""

from __future__ import annotations

from .csv import render_csv
from .json import SCHEMA_VERSION
from .table import render_rich
from .text import render_text
from . import views  # noqa: F401 (registers render's drawings with the reports)

__all__ = ["render_csv", "render_rich", "render_text", "SCHEMA_VERSION"]
