"""Number formatting, one unit system for every view: SI prefixes for counts (K, M, G, T, P, E), IEC
for bytes (KiB ... EiB), parameters with thousands separators in tables and SI in charts, seconds
with their unit."""

from __future__ import annotations

from typing import Any

# bytes are parsed and written in options (the base layer: a planner's error message states sizes too)
from ..options import iec
from ..options import parse_bytes  # noqa: F401 (tests/planning/pipeline/test_partition_options.py pins it here)

__all__ = ["si", "seconds", "params", "percent", "decimals", "digits", "shapes", "fmt",
           "megabytes", "torchinfo_number", "deepspeed_number", "torchscan_scale", "torchscan_amount",
           "modelsummary_mult_adds"]

_SI = (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("K", 1e3))


def si(n: float | int | None, digits: int = 2) -> str:
    if n is None:
        return "--"
    n = float(n)
    for unit, scale in _SI:
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)}" if n == int(n) else f"{n:.{digits}f}"


def seconds(s: float | None) -> str:
    if s is None:
        return "--"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def params(n: int | None) -> str:
    """A parameter count in a table: every digit, with thousands separators (124,439,808)."""
    return "--" if n is None else f"{int(n):,}"


def percent(v: float | None, digits: int = 2) -> str:
    """A fraction as a percentage: ``0.175`` is ``17.50%`` (a pipeline's bubble: ``digits=1``)."""
    return "--" if v is None else f"{100 * v:.{digits}f}%"


def decimals(v: float | None, digits: int = 2) -> str:
    """A plain number to ``digits`` decimals (a plan's imbalance: ``1.163``; torchscan's Mb and
    receptive fields, torchModelSummary's MB columns: "0.02", "3")."""
    return "--" if v is None else f"{v:.{digits}f}"


def shapes(value) -> str:
    """The first of a call's tensor shapes, and how many more there are: ``[1, 32, 64] +1``."""
    if not value:
        return "--"
    first = "[" + ", ".join(str(d) for d in value[0]) + "]"
    return first if len(value) == 1 else f"{first} +{len(value) - 1}"


def _ratio(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.2f}"


def fmt(unit: str, value: Any, chart: bool = False) -> str:
    """A value of a column or fact shown by its unit; None is ``--``. ``chart``: the short form a
    chart's labels use (parameters in SI there)."""
    if value is None:
        return "--"
    if unit.startswith("+"):                  # a difference: its sign always shown
        text = fmt(unit[1:], value, chart)
        return "+" + text if value > 0 else text
    if unit in ("count", "rate"):
        return si(value)
    if unit == "params":
        return si(value) if chart else params(value)
    if unit == "bytes":
        return iec(value)
    if unit == "seconds":
        return seconds(value)
    if unit == "percent":
        return percent(value)
    if unit == "ratio":
        return _ratio(value)
    if unit == "shape":
        return shapes(value)
    if unit == "milliseconds":                # a run's measured times, to a tenth of a millisecond
        return f"{value * 1e3:.1f} ms"
    if unit == "change":                      # a relative error, its sign always shown
        return f"{100 * value:+.1f}%"
    if unit == "ratio3":                      # a ratio that is close to 1 (a plan's imbalance)
        return decimals(value, 3)
    if unit == "percent1":                    # a share to a tenth of a percent (a pipeline's bubble)
        return percent(value, 1)
    return str(value)


# ---- other tools' number styles: their front ends (layerscope.compat) print what those tools print --

def megabytes(n: int | float | None, base: float = 1e6) -> str:
    """torchinfo's and torchscan's "(MB)" figures: ``n / base`` with two decimals; None is ``n/a``."""
    return "n/a" if n is None else f"{n / base:0.2f}"


def digits(n: int) -> str:
    """A count with every digit and no separators (torchModelSummary's "Total # of Params: 1022")."""
    return f"{int(n)}"


TORCHINFO_UNITS = {"T": 1e12, "G": 1e9, "M": 1e6}


def torchinfo_number(n: int, auto: bool = False, units: str | None = None) -> str:
    """torchinfo 1.8's format_output_num: ': 1,234', or with auto units ' (M): 376.85' (T, G, else M);
    ``units`` (its Units values: "auto", "T", "G", "M", "" for none) overrides ``auto``."""
    units = ("auto" if auto else "") if units is None else str.__str__(units)     # a Units member: its value
    unit, value = "", float(n)
    if units == "auto":
        unit, value = next(((u, n / f) for u, f in TORCHINFO_UNITS.items() if n >= f and u != "M"), ("M", n / 1e6))
    elif units:
        unit, value = units, n / TORCHINFO_UNITS[units]
    shown = f"{int(value):,d}" if value.is_integer() else f"{value:,.2f}"
    return f"{f' ({unit})' if unit else ''}: {shown}"


def deepspeed_number(num, units=None, precision: int = 2) -> str:
    """DeepSpeed's number_to_string: "1.23 G", "512 ", "1.5 m" (``units`` forces a prefix)."""
    scales = {"T": 1e12, "G": 1e9, "M": 1e6, "K": 1e3, "": 1, "m": 1e-3, "u": 1e-6}
    if units is None:
        if num >= 1e12:
            units = "T"
        elif num >= 1e9:
            units = "G"
        elif num >= 1e6:
            units = "M"
        elif num >= 1e3:
            units = "K"
        elif num >= 1 or num == 0:
            units = ""
        elif num >= 1e-3:
            units = "m"
        else:
            units = "u"
    return f"{round(num / scales.get(units, 1), precision):g} {units}"


def torchscan_scale(val: float) -> tuple[float, str]:
    """torchscan's unit_scale: the value in T, G, M or k (lower case), or as it is."""
    for f, u in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if val // f > 0:
            return val / f, u
    return val, ""



def torchscan_amount(val: float, unit: str) -> str:
    """torchscan's footer amount: "16.75 kFLOPs", "7.00 MACs" (its unit_scale, two decimals)."""
    v, prefix = torchscan_scale(val)
    return f"{decimals(v)} {prefix}{unit}"


def modelsummary_mult_adds(n: float) -> str:
    """torchModelSummary's mult-adds line: "(G): 1.07" from 1e9 on, else "(M): 0.06"."""
    big = n >= 1e9
    return f"({'G' if big else 'M'}): {decimals(n / (1e9 if big else 1e6))}"
