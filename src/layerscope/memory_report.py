"""MemoryReport: what a training step (or an inference forward) keeps in memory, when and where.

All byte counts are storage sizes as the target device's allocator hands them out (CUDA: 512-byte
blocks; elsewhere the exact size), each storage counted once however many tensors view it.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import Any, TextIO

from .capture.measure import Measured  # noqa: F401  (made by the measurement; part of a MemoryReport)
from .capture.storage import CATEGORIES
from .render.output import ReportOutput, dataframe, print_report, write_text
from .trace import Trace

__all__ = ["MemoryReport", "MemoryLayer", "CallMemory", "StepMemory", "PhaseSpan", "Timeline", "Marker",
           "Measured", "CATEGORIES"]


@dataclass(frozen=True, slots=True)
class CallMemory:
    """Live bytes (all categories) when a module call starts, when it ends, and the most in between."""

    entry: int
    exit: int
    peak: int


@dataclass(frozen=True, slots=True)
class MemoryLayer:
    """One module call of the last pass. ``*_bytes`` are the call's own; ``*_total`` its subtree's."""

    index: int
    path: str
    type: str
    depth: int
    call_index: int
    parent: int | None
    children: tuple[int, ...]
    input_bytes: int               # bytes of the tensors handed to the call
    saved_bytes: int               # activations this call saved for backward
    param_bytes: int               # parameters it owns (first call of the first owner)
    grad_bytes: int
    optimizer_bytes: int
    saved_total: int
    param_total: int
    grad_total: int
    optimizer_total: int
    forward: CallMemory | None
    backward: CallMemory | None
    first_op: int = 0              # the global op index at which the call began
    # the storages this call itself saved for backward: (global op index of the allocation, bytes)
    saved_blocks: tuple[tuple[int, int], ...] = ()
    # its output tensors: (global op index that produced it, bytes)
    output_allocs: tuple[tuple[int, int], ...] = ()

    @property
    def name(self) -> str:
        return self.path or "(root)"

    @property
    def total(self) -> int:
        """Subtree bytes of saved activations, parameters, gradients and optimizer state."""
        return self.saved_total + self.param_total + self.grad_total + self.optimizer_total


@dataclass(frozen=True, slots=True)
class PhaseSpan:
    step: int
    phase: str                     # forward, loss, backward, optimizer
    first_op: int
    last_op: int
    peak_bytes: int


@dataclass(frozen=True, slots=True)
class StepMemory:
    step: int                      # 0-based
    peak_bytes: int
    peak_op: int                   # global op index of the peak
    peak_phase: str
    peak_layer: str                # module path running at the peak ("" root, None outside the model)
    breakdown: dict                # category -> live bytes at the peak
    start_bytes: int               # live before the step's first op
    end_bytes: int                 # live after its last op
    phases: tuple[PhaseSpan, ...]


@dataclass(frozen=True, slots=True)
class Marker:
    kind: str                      # "step", "phase" or "module"
    label: str
    first_op: int
    last_op: int


@dataclass(frozen=True, slots=True)
class Timeline:
    """Live bytes per category after each op (global op index), with phase and module markers."""

    categories: tuple[str, ...]
    bytes: tuple[tuple[int, ...], ...]   # per category, per op
    step: tuple[int, ...]                # per op
    phase: tuple[str, ...]               # per op
    markers: tuple[Marker, ...]

    @property
    def total(self) -> tuple[int, ...]:
        return tuple(sum(col) for col in zip(*self.bytes)) if self.bytes and self.bytes[0] else ()

    def __len__(self) -> int:
        return len(self.step)


class MemoryReport(ReportOutput):
    """Results of ``layerscope.memory``. Frozen; renderers only read it."""

    def __init__(self, *, model_name: str, options: dict, steps: tuple[StepMemory, ...],
                 static: dict, totals: dict, layers: tuple[MemoryLayer, ...], timeline: Timeline,
                 trace: Trace, measured: Measured | None = None, notes: tuple[str, ...] = (),
                 model=None) -> None:
        self.model_name = model_name
        self.options = dict(options)
        self.steps = steps
        self.static = dict(static)
        self.totals = dict(totals)
        self.layers = layers
        self.timeline = timeline
        self.trace = trace
        self.measured = measured
        self.notes = notes
        self._model = weakref.ref(model) if model is not None else None

    # ---- headline numbers ---------------------------------------------------------------------
    @property
    def peak_step(self) -> StepMemory:
        return max(self.steps, key=lambda s: s.peak_bytes)

    @property
    def peak_bytes(self) -> int:
        return self.peak_step.peak_bytes

    @property
    def breakdown(self) -> dict:
        """Live bytes per category at the peak."""
        return dict(self.peak_step.breakdown)

    def fits(self, limit_bytes: int) -> bool:
        return self.peak_bytes <= limit_bytes

    def find(self, path: str) -> list[MemoryLayer]:
        return [r for r in self.layers if r.path == path]

    # ---- rendering ----------------------------------------------------------------------------
    def table(self, depth: int | None = None, fold: bool = True) -> str:
        """The per-layer table as plain text (``fold``: runs of identical blocks as one row)."""
        from .render.memory import render_memory_text
        return render_memory_text(self, depth, fold)

    def rich_table(self, depth: int | None = None, fold: bool = True):
        from .render.memory import render_memory_rich
        return render_memory_rich(self, depth, fold)

    def print(self, depth: int | None = None, file: TextIO | None = None, fold: bool = True) -> None:
        """Print the table: a rich table on a terminal, plain text otherwise."""
        print_report(lambda: self.rich_table(depth, fold), lambda: self.table(depth, fold), file)

    def to_dict(self, timeline: bool = True) -> dict[str, Any]:
        from .render.memory import memory_dict
        return memory_dict(self, timeline)

    def to_json(self, path: str | None = None, indent: int | None = 2, timeline: bool = True) -> str:
        return write_text(json.dumps(self.to_dict(timeline), indent=indent), path)

    def to_csv(self, path: str | None = None) -> str:
        from .render.memory import render_memory_csv
        return write_text(render_memory_csv(self), path)

    _html_part = "memory"

    def _html_rows(self, depth):
        from .render.memory import memory_footer, memory_rows
        return (*memory_rows(self, depth), memory_footer(self))

    def to_dataframe(self):
        """The per-layer memory rows as a pandas DataFrame (needs the ``pandas`` extra)."""
        from .render.memory import memory_row
        return dataframe(memory_row(r) for r in self.layers)

    def __repr__(self) -> str:
        from .render.units import iec
        return (f"<MemoryReport {self.model_name}: peak {iec(self.peak_bytes)} "
                f"(step {self.peak_step.step + 1} of {len(self.steps)}, {self.peak_step.peak_phase})>")
