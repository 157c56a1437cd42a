"""A report's note as a record: what it says (``code``, a stable string) and its data (plain values).

Capture is the lowest layer that notes anything (what a simulation made up, which loss ran, how attention
was priced), so the record is defined here, once; the layers above produce records too, and
reports/notes.py words every code in one table (users read the same sentences as before).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

__all__ = ["Note"]


@dataclass(frozen=True)
class Note:
    """What a note says (``code``) and the data its wording needs (a read-only mapping of plain values)."""

    code: str
    data: Mapping[str, Any]

    def __post_init__(self) -> None:
        # read-only, so that wording a note can never change what it records
        object.__setattr__(self, "data", MappingProxyType(dict(self.data)))

    def __reduce__(self):
        # a read-only mapping does not pickle; a report's records travel between processes (torchrun ranks)
        return (Note, (self.code, dict(self.data)))
