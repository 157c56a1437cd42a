"""The listings' report kinds live in ``layerscope.reports.listings`` (complete, with their views);
re-exported here for code that imported them from this module."""

from __future__ import annotations

from ..reports.listings import PresetList, RunTable

__all__ = ["PresetList", "RunTable"]
