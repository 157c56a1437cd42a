"""MemoryReport: what a training step (or an inference forward) keeps in memory, when and where;
its columns, header and footer.

All byte counts are storage sizes as the target device's allocator hands them out (CUDA: 512-byte
blocks; elsewhere the exact size), each storage counted once however many tensors view it.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import Any, TextIO

from ..analyses.memory import CallMemory, Marker, MemoryLayer, PhaseSpan, StepMemory, Timeline
from ..capture.measure import Measured
from ..capture.shadow import live_module
from ..capture.storage import CATEGORIES
from ..errors import InputError
from ..trace import Trace
from .base import ReportRecord, Totals, rendered, write_text
from .notes import NotesField
from .summary import input_facts
from .table import Column, Fact, Table, select_columns, tree_table

__all__ = ["MemoryReport", "MemoryTotals", "MemoryLayer", "CallMemory", "StepMemory", "PhaseSpan", "Timeline", "Marker",
           "Measured", "CATEGORIES", "COLUMNS"]


def _peak(phase: str):
    return lambda r, rep: getattr(r, phase).peak if getattr(r, phase) else None


def _call(phase: str, key: str):
    return lambda r, rep: getattr(getattr(r, phase), key) if getattr(r, phase) else None


COLUMNS: tuple[Column, ...] = (
    Column("input_bytes", "Input", "bytes", lambda r, rep: r.input_bytes, drop=3,
           description="bytes of the tensors handed to the call"),
    Column("saved_total", "Saved for bwd", "bytes", lambda r, rep: r.saved_total,
           description="activations the subtree saved for backward"),
    Column("param_total", "Params", "bytes", lambda r, rep: r.param_total, drop=1),
    Column("grad_total", "Grads", "bytes", lambda r, rep: r.grad_total, drop=1),
    Column("optimizer_total", "Optimizer", "bytes", lambda r, rep: r.optimizer_total, drop=1),
    Column("total", "Total", "bytes", lambda r, rep: r.total,
           description="saved activations, parameters, gradients and optimizer state of the subtree"),
    # the peaks depend on when a call ran (what earlier blocks left alive), not on the block
    Column("forward_peak", "Fwd peak", "bytes", _peak("forward"), fold=False, drop=2),
    Column("backward_peak", "Bwd peak", "bytes", _peak("backward"), fold=False, drop=2),
    Column("saved_bytes", "Own saved", "bytes", lambda r, rep: r.saved_bytes, drop=4, default=False),
    Column("param_bytes", "Own params", "bytes", lambda r, rep: r.param_bytes, drop=4, default=False),
    Column("grad_bytes", "Own grads", "bytes", lambda r, rep: r.grad_bytes, drop=4, default=False),
    Column("optimizer_bytes", "Own optimizer", "bytes", lambda r, rep: r.optimizer_bytes, drop=4, default=False),
    Column("forward_entry", "Fwd entry", "bytes", _call("forward", "entry"), fold=False, drop=4, default=False),
    Column("forward_exit", "Fwd exit", "bytes", _call("forward", "exit"), fold=False, drop=4, default=False),
    Column("backward_entry", "Bwd entry", "bytes", _call("backward", "entry"), fold=False, drop=4,
           default=False),
    Column("backward_exit", "Bwd exit", "bytes", _call("backward", "exit"), fold=False, drop=4, default=False),
)


def memory_context(rep: "MemoryReport") -> tuple[Fact, ...]:
    o = rep.options
    facts = list(input_facts(rep.trace.layers[0].inputs if rep.trace.layers else ()))
    if rep.trace.options.get("model_dtype"):
        facts.append(Fact("Model dtype", rep.trace.options["model_dtype"]))
    what = "training step" if o["training"] else "inference forward (no grad)"
    extras = [f"optimizer {o['optimizer']}" if o.get("optimizer") else None,
              f"autocast {o['autocast']}" if o.get("autocast") else None,
              f"accumulation x{o['accumulation']}" if o.get("accumulation", 1) > 1 else None,
              f"batch {o['batch_size']}" if o.get("batch_size") else None]
    facts.append(Fact("Run", ", ".join([what] + [e for e in extras if e]) + f" on {o['device']}"
                      + (" (simulated)" if o.get("simulated") else " (real tensors)")))
    return tuple(facts)


def memory_footer(rep: "MemoryReport") -> tuple[Fact, ...]:
    o, t = rep.options, rep.totals
    lines = []
    for s in rep.steps:
        where = s.peak_layer if s.peak_layer else ("(root)" if s.peak_layer == "" else "outside the model")
        label = f"Peak, step {s.step + 1}" if len(rep.steps) > 1 else "Peak"
        at = ", outside the model" if s.peak_layer is None else f" at {where}"
        lines.append(Fact(label, ((s.peak_bytes, "bytes"), f" in {s.peak_phase}{at}")))
    parts: list = []
    for k, v in rep.breakdown.items():
        if v:
            parts += [", " if parts else "", f"{k.replace('_', ' ')} ", (v, "bytes")]
    lines.append(Fact("At the peak", tuple(parts) or "nothing"))
    lines += [Fact("Parameters", t["parameter_bytes"], "bytes"), Fact("Gradients", t["gradient_bytes"], "bytes"),
              Fact("Optimizer state", t["optimizer_bytes"], "bytes"),
              Fact("Saved for backward", t["saved_activation_bytes"], "bytes")]
    root_total = max((r.total for r in rep.layers if r.depth == 0), default=0)
    if root_total > rep.peak_bytes:
        # issue 34: a root Total above the peak reads as a contradiction unless the footer says what it sums
        lines.append(Fact("Total column", "saved for backward + params + grads + optimizer state of each "
                          "layer: a sum over the step, not a peak (saved activations are freed in backward "
                          "before the optimizer runs), so the root's can exceed the peak"))
    if o.get("allocation_block", 1) > 1:
        lines.append(Fact("Allocator", f"sizes rounded to {o['allocation_block']}-byte blocks"))
    m = rep.measured
    if m is not None:
        diff = (rep.peak_bytes - m.peak_bytes) / m.peak_bytes * 100 if m.peak_bytes else 0.0
        lines.append(Fact("Measured peak", ((m.peak_bytes, "bytes"), f" ({m.method}); predicted {diff:+.2f}%")))
        if m.reserved_bytes is not None:
            lines.append(Fact("Allocator reserved", ((m.reserved_bytes, "bytes"), " (",
                                                     (m.reserved_bytes - m.peak_bytes, "bytes"),
                                                     " reserved but unused at most)")))
        if m.context_bytes is not None:
            lines.append(Fact("Outside the allocator", ((m.context_bytes, "bytes"), " (CUDA context and other)")))
    limit = o.get("limit")
    if limit:
        fits = rep.peak_bytes <= limit
        lines.append(Fact("Limit", ((limit, "bytes"), ": " + ("fits" if fits else "DOES NOT FIT")), alert=not fits))
    lines += [Fact("Note", n) for n in rep.notes]
    return tuple(lines)


_LAYER_JSON = ("index", "path", "type", "depth", "call_index", "parent", "children", "input_bytes", "saved_bytes",
               "param_bytes", "grad_bytes", "optimizer_bytes", "saved_total", "param_total", "grad_total",
               "optimizer_total", "total", "forward", "backward")
_STEP_JSON = ("step", "peak_bytes", "peak_op", "peak_phase", "peak_layer", "breakdown", "start_bytes", "end_bytes",
              ("phases", "phases", ("phase", "first_op", "last_op", "peak_bytes")))
_TIMELINE_JSON = ("categories", ("bytes", lambda tl, rep: dict(zip(tl.categories, tl.bytes))), "step", "phase",
                  "markers")
MEMORY_JSON = (
    ("model", lambda rep, _: {"name": rep.model_name, "options": dict(rep.options)}),
    "peak_bytes", "breakdown", "static", "totals", ("steps", "steps", _STEP_JSON), ("layers", "layers", _LAYER_JSON),
    "measured", "notes",
)


@dataclass(frozen=True, slots=True)
class MemoryTotals(Totals):
    """Bytes of one report's step: the peak, and what the model's state and activations take."""

    peak_bytes: int
    parameter_bytes: int
    buffer_bytes: int
    input_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    optimizer_unowned_bytes: int       # optimizer state no parameter owns (a step counter, ...)
    saved_activation_bytes: int
    output_bytes: int                  # the last pass's model output
    loss_saved_bytes: int              # what the loss saved for its backward (in no layer's activations)


class MemoryReport(NotesField, ReportRecord):
    """Results of ``layerscope.memory``. Frozen; renderers only read it."""

    kind = "memory"
    _html_part = "memory"

    def __init__(self, *, model_name: str, options: dict, steps: tuple[StepMemory, ...],
                 static: dict, totals: dict, layers: tuple[MemoryLayer, ...], timeline: Timeline,
                 trace: Trace, measured: Measured | None = None, notes: tuple = (),
                 model=None) -> None:
        self.model_name = model_name
        self.options = dict(options)
        self.steps = steps
        self.static = dict(static)
        self.totals = totals if isinstance(totals, MemoryTotals) else MemoryTotals(**totals)
        self.layers = layers
        self.timeline = timeline
        self.trace = trace
        self.measured = measured
        self.notes = notes
        self._model = weakref.ref(live_module(model)) if model is not None else None

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

    # ---- views --------------------------------------------------------------------------------
    def table_model(self, depth: int | None = None, columns=None, **_: Any) -> Table:
        cols = COLUMNS if columns == "all" else select_columns(COLUMNS, columns, InputError)
        return tree_table("memory", f"layerscope memory: {self.model_name}", self, self.layers, cols, depth,
                          context=memory_context(self), footer=memory_footer(self))

    def json_fields(self, timeline: bool = True, **_: Any) -> tuple:
        """``timeline``: with the live bytes per category after every op (long for a big model)."""
        return MEMORY_JSON + ((("timeline", "timeline", _TIMELINE_JSON),) if timeline else ())

    def table(self, depth: int | None = None, fold: bool = True, columns=None, width: int | None = None) -> str:
        """The per-layer table as plain text (``fold``: runs of identical blocks as one row)."""
        return self._text(depth, columns, fold, width)

    def rich_table(self, depth: int | None = None, fold: bool = True, columns=None, width: int | None = None):
        return self._rich(depth, columns, fold, width)

    def print(self, depth: int | None = None, file: TextIO | None = None, fold: bool = True, columns=None) -> None:
        """Print the table: a rich table fitted to the terminal, plain text otherwise."""
        self._print(file, depth, columns, fold)

    def to_dict(self, timeline: bool = True) -> dict[str, Any]:
        return rendered("json")(self, timeline=timeline)

    def to_json(self, path: str | None = None, indent: int | None = 2, timeline: bool = True) -> str:
        return write_text(json.dumps(self.to_dict(timeline), indent=indent), path)

    def __repr__(self) -> str:
        return (f"<MemoryReport {self.model_name}: peak {self.peak_bytes:,} B "
                f"(step {self.peak_step.step + 1} of {len(self.steps)}, {self.peak_step.peak_phase})>")
