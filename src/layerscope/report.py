"""The Report: frozen per-layer results, totals and coverage of one analysis."""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any, TextIO

from torch import nn

from .analyses.flops import coverage, layer_costs
from .analyses.receptive_field import receptive_fields
from .errors import InputError
from .render.output import ReportOutput, dataframe, print_report, write_text
from .trace import Coverage, LayerRecord, Totals, Trace

__all__ = ["Report"]


class Report(ReportOutput):
    """Results of ``layerscope.analyze``. Everything in it is frozen; renderers only read it."""

    def __init__(self, trace: Trace, model: nn.Module | None = None, graph=None) -> None:
        fwd, bwd, fwd_t, bwd_t, unc = layer_costs(trace)
        rfs = receptive_fields(trace)
        self.trace = trace
        self.layers: tuple[LayerRecord, ...] = tuple(
            dataclasses.replace(r, forward=fwd[i], backward=bwd[i], forward_total=fwd_t[i],
                                backward_total=bwd_t[i], uncounted_ops=unc[i], receptive_field=rfs[i])
            for i, r in enumerate(trace.layers))
        self.coverage: Coverage = coverage(trace)
        f_sum, b_sum = fwd[0], bwd[0]
        for c in fwd[1:]:
            f_sum = f_sum + c
        for c in bwd[1:]:
            b_sum = b_sum + c
        self.totals = Totals(
            params=trace.param_numel, trainable_params=trace.trainable_numel,
            frozen_params=trace.param_numel - trace.trainable_numel, shared_params=trace.shared_numel,
            param_bytes=trace.param_bytes, buffers=trace.buffer_numel, buffer_bytes=trace.buffer_bytes,
            input_bytes=trace.input_bytes, output_bytes=trace.output_bytes, forward=f_sum, backward=b_sum,
            complete=self.coverage.complete)
        self._model = weakref.ref(model) if model is not None else None
        # an exported model's own view (formats.onnx.OnnxGraph: nodes, op histogram, peak activations)
        self.graph = graph

    # ---- access ---------------------------------------------------------------------------------
    @property
    def notes(self) -> tuple[str, ...]:
        """What the analysis says about how it ran (e.g. a torch.compile'd model's original module)."""
        return tuple(self.trace.options.get("notes", ()))

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

    # ---- rendering ------------------------------------------------------------------------------
    def table(self, depth: int | None = None, columns=None, fold: bool = True) -> str:
        """The layer table as plain text. ``fold``: runs of 3 or more identical blocks show as one
        row, ``layers.0-79: LlamaDecoderLayer x80 (each)`` (``fold=False`` shows every block)."""
        from .render import render_text
        return render_text(self, depth, columns, fold)

    def rich_table(self, depth: int | None = None, columns=None, fold: bool = True):
        from .render import render_rich
        return render_rich(self, depth, columns, fold)

    def print(self, depth: int | None = None, columns=None, file: TextIO | None = None, fold: bool = True) -> None:
        """Print the table: a rich table on a terminal, plain text otherwise."""
        print_report(lambda: self.rich_table(depth, columns, fold), lambda: self.table(depth, columns, fold), file)

    def to_dict(self) -> dict[str, Any]:
        from .render.json import report_dict
        return report_dict(self)

    def to_csv(self, path: str | None = None) -> str:
        from .render import render_csv
        return write_text(render_csv(self), path)

    def _html_rows(self, depth):
        from .render.columns import build_rows, footer_lines
        return (*build_rows(self, depth, None), footer_lines(self))

    def to_dataframe(self):
        """The layer rows as a pandas DataFrame (needs the ``pandas`` extra)."""
        from .render.csv import layer_row
        return dataframe(layer_row(r) for r in self.layers)

    def __repr__(self) -> str:
        t = self.totals
        return (f"<Report {self.model_name}: {len(self.layers)} layer calls, {t.params:,} params, "
                f"{t.forward.macs:,} MACs, complete={t.complete}>")
