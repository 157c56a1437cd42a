"""Number formatting: SI prefixes for counts (K, M, G, T), IEC for bytes (KiB, MiB, GiB)."""

from __future__ import annotations

__all__ = ["si", "iec", "seconds"]


def si(n: float | int | None, digits: int = 2) -> str:
    if n is None:
        return "--"
    n = float(n)
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)}" if n == int(n) else f"{n:.{digits}f}"


def iec(n: float | int | None, digits: int = 2) -> str:
    if n is None:
        return "--"
    n = float(n)
    for unit, scale in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)} B"


def seconds(s: float | None) -> str:
    if s is None:
        return "--"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"
