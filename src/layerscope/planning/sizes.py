"""Bytes in IEC units, formatted in one place. It lives in planning, the lowest layer whose messages state
sizes (a memory limit no split fits, planning/split/planner.py; why a search candidate does not fit,
planning/search/space.py); reports/ and render/units.py take it from here, so every size reads alike."""

from __future__ import annotations

__all__ = ["iec"]

_IEC = (("EiB", 2 ** 60), ("PiB", 2 ** 50), ("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10))


def iec(n: float | int | None, digits: int = 2) -> str:
    """Bytes in IEC units (``1.50 GiB``; None: ``--``)."""
    if n is None:
        return "--"
    n = float(n)
    for unit, scale in _IEC:
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)} B"
