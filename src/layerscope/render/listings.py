"""The listings' report objects (``reports.listings``' records plus the views every kind has)."""

from __future__ import annotations

from typing import Any

from ..reports import listings as _listings
from .views import Views

__all__ = ["PresetList", "RunTable"]


class _Flat(Views):
    """A table without a tree: no depth, no folding."""

    __slots__ = ()

    def table(self, columns=None, width: int | None = None, **_: Any) -> str:
        return self._text(None, columns, False, width)

    def rich_table(self, columns=None, width: int | None = None, **_: Any):
        return self._rich(None, columns, False, width)

    def print(self, file=None, columns=None, **_: Any) -> None:
        self._print(file, None, columns, False)


class PresetList(_Flat, _listings.PresetList):
    """``layerscope list-presets``: the architectures ``hf:NAME`` builds."""


class RunTable(_Flat, _listings.RunTable):
    """What ``layerscope split --run`` prints after a torchrun run: a row per rank."""
