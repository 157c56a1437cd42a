"""Number formatting: SI prefixes for counts (K, M, G, T), IEC for bytes (KiB, MiB, GiB)."""

from __future__ import annotations

__all__ = ["si", "iec", "seconds", "parse_bytes"]


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


_BYTE_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "m": 10 ** 6, "mb": 10 ** 6, "g": 10 ** 9,
               "gb": 10 ** 9, "t": 10 ** 12, "tb": 10 ** 12, "kib": 2 ** 10, "mib": 2 ** 20,
               "gib": 2 ** 30, "tib": 2 ** 40}


def parse_bytes(value) -> int:
    """Bytes from an int or a string such as "80GiB", "80 GB", "512MiB" (GB = 10^9, GiB = 2^30)."""
    from ..errors import InputError
    if isinstance(value, bool):
        raise InputError(f"expected a memory size such as 80GiB, got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise InputError(f"a memory size must be positive, got {value!r}")
        return int(value)
    text = str(value).strip().lower().replace(" ", "")
    num = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(num):]
    try:
        n = float(num)
    except ValueError:
        n = -1.0
    if unit not in _BYTE_UNITS or n <= 0:
        raise InputError(f"expected a memory size such as 80GiB, 40GB or 512MiB, got {value!r}")
    return int(n * _BYTE_UNITS[unit])
