"""``RunResult`` (what ``launch()`` returns) is a report kind: it lives in ``layerscope.reports.run``.
This module keeps the import path ``layerscope.torchrun.result`` working."""

from __future__ import annotations

from ..reports.run import RunResult

__all__ = ["RunResult"]
