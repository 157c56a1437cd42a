"""torchscan's layout as a style: its columns (headers and widest widths), its tree prefixes, its name
wrapping and its footer, byte for byte as torch-scan 0.1 prints them. It draws plain rows and totals;
the numbers are layerscope's (``compat.torchscan`` builds the rows) and every one is written by
``render.units``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import InputError
from .units import decimals, params, torchscan_amount

__all__ = ["HEADERS", "MAX_WIDTHS", "Row", "Totals", "summary_text", "tree_name", "wrap_name"]

HEADERS = ("Layer", "Type", "Output Shape", "Param #", "Receptive field", "Effective stride", "Effective padding")
MAX_WIDTHS = (27, 20, 25, 15, 15, 16, 17)     # torchscan's cap on each column's width
_MARGIN = 4
_WRAP = "[...]"


@dataclass(frozen=True)
class Row:
    """One printed layer: ``count`` is what torchscan's "Param #" shows (parameters + buffers)."""
    name: str
    depth: int
    type: str
    output_shape: Sequence[int] | None
    count: int
    rf: float
    stride: float
    padding: float


@dataclass(frozen=True)
class Totals:
    """The footer: parameters, the model's size and overhead in Mb (1024**2 bytes), and the forward's
    FLOPs, MACs and DMAs."""
    trainable: int
    frozen: int
    model_mb: float
    overhead_mb: float
    flops: float
    macs: float
    dmas: float


def tree_name(name: str, depth: int) -> str:
    """torchscan's format_name: a layer's name with its tree prefix."""
    if depth == 0:
        return name
    if depth == 1:
        return f"├─{name}"
    return f"{'|    ' * (depth - 1)}└─{name}"


def wrap_name(s: str, max_len: int, mode: str | None, delimiter: str = ".", wrap: str = _WRAP) -> str:
    """torchscan's wrap_string: a name longer than ``max_len`` cut at its end ("end") or in its
    middle, keeping its last ``delimiter`` part ("mid"); ``None`` leaves it whole."""
    if len(s) <= max_len or mode is None:
        return s
    if mode == "end":
        return s[: max_len - len(wrap)] + wrap
    if mode == "mid":
        end = f"{wrap}.{s.rpartition(delimiter)[-1]}"
        return s[: max_len - len(end)] + end
    raise InputError(f"wrap_mode must be 'mid', 'end' or None, got {mode!r}")


def _cell(s: str, w: int | None) -> str:
    return s if w is None else f"{s:<{w}}"[:w]


def _cells(row: Row, col_w: Sequence[int] | None, wrap_mode: str | None, n: int) -> list[str]:
    """The first ``n`` cells of a row; unsized (``col_w`` None) when measuring."""
    widths = list(col_w) if col_w else [None] * len(HEADERS)
    max_len = widths[0] + 3 if isinstance(widths[0], int) else 100
    texts = (lambda: wrap_name(tree_name(row.name, row.depth), max_len, wrap_mode), lambda: row.type,
             lambda: str(row.output_shape), lambda: params(row.count), lambda: decimals(row.rf, 0),
             lambda: decimals(row.stride, 0), lambda: decimals(row.padding, 0))
    return [_cell(texts[i](), widths[i]) for i in range(n)]


def summary_text(rows: Sequence[Row], totals: Totals, wrap_mode: str | None = "mid", receptive_field: bool = False,
                 effective_rf_stats: bool = False) -> str:
    """torchscan's printed summary: widths measured over every column (shown or not, as torchscan
    does), capped, then the first 4, 5 or 7 columns drawn."""
    col_w = [len(h) for h in HEADERS]
    for row in rows:
        col_w = [max(v, len(s)) for v, s in zip(col_w, _cells(row, None, wrap_mode, len(HEADERS)))]
    n = 4 if not receptive_field else 5 if not effective_rf_stats else 7
    col_w = [min(v, m) for v, m in zip(col_w, MAX_WIDTHS)][:n]
    width = sum(col_w) + (n - 1) * _MARGIN
    thin, thick, dots, sep = "_" * width, "=" * width, "-" * width, " " * _MARGIN
    lines = [thin, sep.join(f"{h:<{w}}" for h, w in zip(HEADERS, col_w)), thick]
    lines += [sep.join(_cells(row, col_w, wrap_mode, n)) for row in rows]
    t = totals
    lines += [thick, f"Trainable params: {params(t.trainable)}", f"Non-trainable params: {params(t.frozen)}",
              f"Total params: {params(t.trainable + t.frozen)}", dots,
              f"Model size (params + buffers): {decimals(t.model_mb)} Mb",
              f"Framework & CUDA overhead: {decimals(t.overhead_mb)} Mb",
              f"Total RAM usage: {decimals(t.model_mb + t.overhead_mb)} Mb", dots,
              f"Floating Point Operations on forward: {torchscan_amount(t.flops, 'FLOPs')}",
              f"Multiply-Accumulations on forward: {torchscan_amount(t.macs, 'MACs')}",
              f"Direct memory accesses on forward: {torchscan_amount(t.dmas, 'DMAs')}", thin]
    return "\n".join(lines)
