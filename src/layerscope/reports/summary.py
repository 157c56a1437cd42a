"""The summary report's columns, header and footer: the one place they are defined.

Every view of ``layerscope.analyze``'s Report (terminal, text, CSV, JSON, pandas, notebook, HTML) reads
its layers through ``COLUMNS``.
"""

from __future__ import annotations

import dataclasses
import operator
import weakref
from typing import Any, TextIO

from torch import nn

from ..analyses.flops import coverage, layer_costs
from ..capture.shadow import live_module
from ..analyses.receptive_field import receptive_fields
from ..errors import InputError
from ..trace import Costs, Coverage, LayerRecord, Totals, Trace
from .base import ReportRecord
from .table import OMIT, Column, Fact, Table, select_columns, tree_table

__all__ = ["Report", "COLUMNS", "DEFAULT_COLUMNS", "summary_table", "summary_context", "summary_footer",
           "input_facts"]


def _trainable(r: LayerRecord, rep) -> str | None:
    flags = {p.trainable for p in r.params}
    if not flags:
        return None
    return "True" if flags == {True} else ("False" if flags == {False} else "Partial")


def _rf_part(part: str):
    """The receptive field's ``size``, ``stride`` or ``padding`` per spatial dim: the value a tuple,
    the text one number where every dim agrees, else "7x5"."""
    def value(r: LayerRecord, rep) -> tuple | None:
        return None if r.receptive_field is None else tuple(getattr(r.receptive_field, part))

    def text(r: LayerRecord, rep) -> str | None:
        vals = value(r, rep)
        if vals is None:
            return "--"
        num = [str(int(s)) if float(s).is_integer() else f"{s:.2f}" for s in vals]
        return num[0] if len(set(num)) == 1 else "x".join(num)
    return value, text


_RF, _RF_STRIDE, _RF_PADDING = _rf_part("size"), _rf_part("stride"), _rf_part("padding")


def _reused(r: LayerRecord, rep) -> str | None:
    return "(reused)" if r.call_index > 0 else None


# key, header, unit, value; drop: the order in which a narrow terminal leaves a column out
COLUMNS: tuple[Column, ...] = (
    Column("input_shape", "Input shape", "shape", lambda r, rep: tuple(s.shape for s in r.inputs),
           drop=3, default=False, aliases=("input_size",), description="shape of the first input (+N more)"),
    Column("output_shape", "Output shape", "shape", lambda r, rep: tuple(s.shape for s in r.outputs),
           drop=2, aliases=("output_size",), description="shape of the first output (+N more)"),
    Column("params", "Params", "params", lambda r, rep: r.subtree_params, text=_reused,
           suffix=lambda r, rep: " *" if r.call_index == 0 and any(p.shared for p in r.params) else "",
           aliases=("num_params",), description="unique parameters of the subtree (* shared)"),
    Column("params_percent", "Params %", "percent",
           lambda r, rep: r.subtree_params / rep.totals.params if r.call_index == 0 and rep.totals.params else None,
           drop=4, default=False),
    Column("kernel", "Kernel", "text",
           lambda r, rep: "x".join(str(k) for k in r.kernel_size) if r.kernel_size else None,
           drop=5, default=False, aliases=("kernel_size",)),
    Column("macs", "MACs", "count", lambda r, rep: r.forward_total.macs, aliases=("mult_adds",),
           description="forward multiply-accumulates of the subtree"),
    Column("flops", "FLOPs", "count", lambda r, rep: r.forward_total.flops,
           description="forward FLOPs of the subtree"),
    Column("bytes_read", "Read", "bytes", lambda r, rep: r.forward_total.bytes_read, drop=1, default=False),
    Column("bytes_written", "Written", "bytes", lambda r, rep: r.forward_total.bytes_written, drop=1,
           default=False),
    Column("backward_macs", "Bwd MACs", "count", lambda r, rep: r.backward_total.macs, default=False),
    Column("backward_flops", "Bwd FLOPs", "count", lambda r, rep: r.backward_total.flops, default=False),
    Column("trainable", "Trainable", "text", _trainable, drop=6, default=False),
    Column("own_params", "Own params", "params", lambda r, rep: r.num_params, drop=6, default=False,
           description="parameters held by this module itself (first call of the first holder)"),
    Column("trainable_params", "Trainable params", "params", lambda r, rep: r.trainable_params, drop=6,
           default=False),
    Column("self_macs", "Self MACs", "count", lambda r, rep: r.forward.macs, drop=6, default=False,
           description="MACs of the ops that ran in this call itself, not in a child"),
    Column("self_flops", "Self FLOPs", "count", lambda r, rep: r.forward.flops, drop=6, default=False),
    Column("uncounted_ops", "Uncounted ops", "ratio", lambda r, rep: r.uncounted_ops, drop=6, default=False,
           description="ops in the subtree with no cost formula"),
    Column("receptive_field", "RF", "ratio", *_RF, drop=6, default=False,
           description="receptive field size in input pixels, per spatial dim"),
    Column("rf_stride", "RF stride", "ratio", *_RF_STRIDE, drop=6, default=False,
           description="effective stride of the receptive field (input pixels per output step)"),
    Column("rf_padding", "RF pad", "ratio", *_RF_PADDING, drop=6, default=False,
           description="effective padding of the receptive field in input pixels"),
)
DEFAULT_COLUMNS = tuple(c.key for c in COLUMNS if c.default)


def input_facts(specs) -> tuple[Fact, ...]:
    """What the model was given: each input tensor's shape and dtype."""
    if not specs:
        return ()
    parts = ", ".join(f"[{', '.join(map(str, s.shape))}] {s.dtype.removeprefix('torch.')}" for s in specs[:4])
    more = f" +{len(specs) - 4} more" if len(specs) > 4 else ""
    return (Fact("Inputs", parts + more),)


def summary_context(rep: "Report") -> tuple[Fact, ...]:
    o = rep.trace.options
    facts = list(input_facts(rep.layers[0].inputs if rep.layers else ()))
    if o.get("model_dtype"):
        facts.append(Fact("Model dtype", o["model_dtype"]))
    run = [f"{o['mode']} mode" if o.get("mode") in ("eval", "train") else None,
           "forward and backward" if rep.trace.backward else "forward",
           f"on {o['device']}" if o.get("device") else None,
           f"from {o['format']}" if o.get("format") else None]
    facts.append(Fact("Run", ", ".join(x for x in run if x)))
    return tuple(facts)


def summary_footer(rep: "Report") -> tuple[Fact, ...]:
    t, cov = rep.totals, rep.coverage
    lines = [Fact("Total params", t.params, "params"), Fact("Trainable params", t.trainable_params, "params"),
             Fact("Non-trainable params", t.frozen_params, "params")]
    if t.shared_params:
        lines.append(Fact("Shared params (* counted once)", t.shared_params, "params"))
    lines += [Fact("Forward MACs", t.forward.macs, "count"), Fact("Forward FLOPs", t.forward.flops, "count")]
    if rep.trace.backward:
        lines += [Fact("Backward MACs", t.backward.macs, "count"), Fact("Backward FLOPs", t.backward.flops, "count")]
    lines += [Fact("Input size", t.input_bytes, "bytes"), Fact("Params size", t.param_bytes, "bytes"),
              Fact("Forward bytes read / written",
                   ((t.forward.bytes_read, "bytes"), " / ", (t.forward.bytes_written, "bytes")))]
    if cov.complete:
        lines.append(Fact("Coverage", "complete: every op has a cost formula"))
    else:
        ops = ", ".join(f"{u.op} x{u.count}" for u in cov.uncounted[:4])
        more = f" and {len(cov.uncounted) - 4} more" if len(cov.uncounted) > 4 else ""
        lines.append(Fact("Coverage", f"INCOMPLETE: no formula for {ops}{more}", alert=True))
    if cov.uncalled_modules:
        lines.append(Fact("Modules never called", len(cov.uncalled_modules), "ratio"))
    lines += [Fact("Note", n) for n in rep.notes]
    return tuple(lines)


def summary_table(rep: "Report", depth: int | None = None, columns=None) -> Table:
    """The report's layers through the chosen columns (``"all"``: every column)."""
    cols = COLUMNS if columns == "all" else select_columns(COLUMNS, columns, InputError)
    return tree_table("summary", f"layerscope: {rep.model_name}", rep, rep.layers, cols, depth,
                      context=summary_context(rep), footer=summary_footer(rep))


# the JSON (docs/json.md): the model, its totals, each layer record and the coverage
_LAYER_JSON = ("index", "path", "type", "depth", "call_index", "parent", "children", "inputs", "outputs", "params",
               "buffers", "num_params", "trainable_params", "subtree_params",
               ("kernel_size", lambda r, rep: r.kernel_size or None), "forward", "backward", "forward_total",
               "backward_total", "uncounted_ops", "receptive_field")
_TOTALS_JSON = ("params", "trainable_params", "frozen_params", "shared_params", "param_bytes", "buffers",
                "buffer_bytes", "input_bytes", "output_bytes", ("macs", lambda t, rep: t.forward.macs),
                ("flops", lambda t, rep: t.forward.flops), ("bytes_read", lambda t, rep: t.forward.bytes_read),
                ("bytes_written", lambda t, rep: t.forward.bytes_written),
                ("backward", lambda t, rep: t.backward if rep.trace.backward else None), "complete")
SUMMARY_JSON = (
    ("model", lambda rep, _: {"name": rep.model_name, "options": dict(rep.trace.options)}),
    ("totals", "totals", _TOTALS_JSON),
    ("layers", "layers", _LAYER_JSON),
    ("coverage", "coverage", ("complete", "uncounted", "uncalled_modules")),
    ("graph", lambda rep, _: OMIT if getattr(rep, "graph", None) is None else rep.graph.to_dict()),
)


_COST_FIELDS = ("forward", "backward", "forward_total", "backward_total", "uncounted_ops", "receptive_field")
_LAYER_FIELDS = tuple(f.name for f in dataclasses.fields(LayerRecord))
# the fields a layer record keeps from the capture, read in one C call: dataclasses.replace was half
# of building a report of a deep model
_kept = operator.attrgetter(*_LAYER_FIELDS[:-len(_COST_FIELDS)]) \
    if _LAYER_FIELDS[-len(_COST_FIELDS):] == _COST_FIELDS else None


def _with_costs(r: LayerRecord, *costs) -> LayerRecord:
    """``r`` with its costs and receptive field (the _COST_FIELDS, in that order)."""
    if _kept is None:   # LayerRecord's fields moved: the slow, general way
        return dataclasses.replace(r, **dict(zip(_COST_FIELDS, costs)))
    return LayerRecord(*_kept(r), *costs)


def _sum(costs: list[Costs]) -> Costs:
    """The sum of ``costs`` (the first one itself when there is one)."""
    if len(costs) == 1:
        return costs[0]
    return Costs(sum(c.macs for c in costs), sum(c.flops for c in costs), sum(c.bytes_read for c in costs),
                 sum(c.bytes_written for c in costs))


class Report(ReportRecord):
    """Results of ``layerscope.analyze``. Everything in it is frozen; renderers only read it."""

    kind = "summary"
    _html_part = "summary"

    def __init__(self, trace: Trace, model: nn.Module | None = None, graph=None) -> None:
        fwd, bwd, fwd_t, bwd_t, unc = layer_costs(trace)
        rfs = receptive_fields(trace)
        self.trace = trace
        # the capture's records with their costs: built whole here, once
        self.layers: tuple[LayerRecord, ...] = tuple(
            _with_costs(r, fwd[i], bwd[i], fwd_t[i], bwd_t[i], unc[i], rfs[i]) for i, r in enumerate(trace.layers))
        self.coverage: Coverage = coverage(trace)
        f_sum, b_sum = _sum(fwd), _sum(bwd)
        self.totals = Totals(
            params=trace.param_numel, trainable_params=trace.trainable_numel,
            frozen_params=trace.param_numel - trace.trainable_numel, shared_params=trace.shared_numel,
            param_bytes=trace.param_bytes, buffers=trace.buffer_numel, buffer_bytes=trace.buffer_bytes,
            input_bytes=trace.input_bytes, output_bytes=trace.output_bytes, forward=f_sum, backward=b_sum,
            complete=self.coverage.complete)
        self._model = weakref.ref(live_module(model)) if model is not None else None
        # an exported model's own view (formats.onnx.OnnxGraph: nodes, op histogram, peak activations)
        self.graph = graph

    # ---- access ---------------------------------------------------------------------------------
    @property
    def notes(self) -> tuple[str, ...]:
        """What the analysis says about how it ran (e.g. a torch.compile'd model's original module)."""
        from .onnx import onnx_notes
        return tuple(self.trace.options.get("notes", ())) + onnx_notes(self.trace.options)

    @property
    def model_name(self) -> str:
        return self.trace.model_name

    def module(self, path: str) -> nn.Module:
        """The live submodule at ``path`` (the layers handed back as variables, e.g. to split by hand)."""
        model = self._model() if self._model is not None else None
        if model is None:
            raise InputError("the model this report describes is gone (or the report came from an export)")
        try:
            return model.get_submodule(path)
        except AttributeError as e:
            raise InputError(f"no submodule {path!r} in {self.model_name}") from e

    def find(self, path: str) -> list[LayerRecord]:
        """Every call record of the module at ``path`` (one per call)."""
        return [r for r in self.layers if r.path == path]

    # ---- views ----------------------------------------------------------------------------------
    def table_model(self, depth: int | None = None, columns=None, **_: Any) -> Table:
        return summary_table(self, depth, columns)

    def table(self, depth: int | None = None, columns=None, fold: bool = True, width: int | None = None) -> str:
        """The layer table as plain text. ``fold``: runs of 3 or more identical blocks show as one
        row, ``layers.0-79: LlamaDecoderLayer x80 (each)`` (``fold=False`` shows every block);
        ``width``: fit to that many characters (names shrink, then low-priority columns drop)."""
        return self._text(depth, columns, fold, width)

    def rich_table(self, depth: int | None = None, columns=None, fold: bool = True, width: int | None = None):
        return self._rich(depth, columns, fold, width)

    def print(self, depth: int | None = None, columns=None, file: TextIO | None = None, fold: bool = True) -> None:
        """Print the table: a rich table fitted to the terminal, plain text otherwise."""
        self._print(file, depth, columns, fold)

    def json_fields(self, **_: Any) -> tuple:
        return SUMMARY_JSON

    def __repr__(self) -> str:
        t = self.totals
        return (f"<Report {self.model_name}: {len(self.layers)} layer calls, {t.params:,} params, "
                f"{t.forward.macs:,} MACs, complete={t.complete}>")
