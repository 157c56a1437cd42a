"""The tables that are not about one model's layers, as report kinds: the presets ``hf:NAME`` builds
(``layerscope list-presets``) and a pipeline run's per-rank results (``layerscope split --run``).

Like every kind: records of plain numbers and words, their columns and footer here, and the views
every kind has (render draws them), so they print, export and fit a terminal the way the other
reports do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .base import ReportRecord
from .table import Column, Fact, Table, flat_table

__all__ = ["Preset", "PresetList", "PRESET_COLUMNS", "RankRun", "RunTable", "run_columns"]


@dataclass(frozen=True, slots=True)
class Preset:
    index: int
    name: str                      # hf:NAME
    model: str
    params: int
    default_inputs: str            # input_ids=1x128, ...
    description: str


PRESET_COLUMNS: tuple[Column, ...] = (
    Column("model", "Model", "text", lambda p, rep: p.model),
    Column("params", "Params", "count", lambda p, rep: p.params),
    # a narrow terminal leaves out the default inputs first, then the description
    Column("default_inputs", "Default inputs", "text", lambda p, rep: p.default_inputs, drop=2),
    Column("description", "Description", "text", lambda p, rep: p.description, drop=1),
)


class _Flat(ReportRecord):
    """A table without a tree: no depth, no folding."""

    def table(self, columns=None, width: int | None = None, **_: Any) -> str:
        return self._text(None, columns, False, width)

    def rich_table(self, columns=None, width: int | None = None, **_: Any):
        return self._rich(None, columns, False, width)

    def print(self, file=None, columns=None, **_: Any) -> None:
        self._print(file, None, columns, False)


class PresetList(_Flat):
    """The architectures shipped as configs (``specs.presets()``: name -> model, params, inputs,
    description)."""

    kind = "presets"
    json_rows = "presets"

    def __init__(self, presets: dict[str, dict]) -> None:
        self.presets = tuple(
            Preset(i, f"hf:{k}", v["model"], v["params"],
                   ", ".join(f"{n}={'x'.join(map(str, s))}" for n, s in v["inputs"].items()), v["description"])
            for i, (k, v) in enumerate(presets.items()))

    def table_model(self, depth: int | None = None, columns=None, **_: Any) -> Table:
        footer = (Fact("Presets", f"{len(self.presets)}, built on meta by default (nothing allocated); --set "
                                  "changes any config field, --input-ids the sequence"),)
        return flat_table("presets", "layerscope presets", self, self.presets, PRESET_COLUMNS, name=lambda p: p.name,
                          first_header="Spec", footer=footer)

    def json_fields(self, **_: Any) -> tuple:
        return (("presets", "presets", ("name", "model", "params", "default_inputs", "description")),)


@dataclass(frozen=True, slots=True)
class RankRun:
    """One rank of a pipeline run: the steady step and busy times it measured (seconds), the plan's
    busy time for it, its peak bytes measured and predicted."""

    index: int
    rank: int
    stages: tuple[int, ...]
    step_time: float
    busy: float | None
    busy_predicted: float | None
    peak_bytes: int
    predicted_bytes: int

    @property
    def error(self) -> float:
        """Predicted over measured peak, minus one."""
        return (self.predicted_bytes - self.peak_bytes) / self.peak_bytes if self.peak_bytes else 0.0


def run_columns(run: "RunTable") -> tuple[Column, ...]:
    """A run's columns: the times say what they are (the first step, or a median over steps); the
    plan's busy time when it has unit times."""
    w = run.when
    cols = [Column("stages", "Stages", "text", lambda r, t: ", ".join(str(s) for s in r.stages)),
            Column("step_time", f"Step time ({w})", "milliseconds", lambda r, t: r.step_time),
            Column("busy", f"Busy ({w})", "milliseconds", lambda r, t: r.busy)]
    if run.predicted:
        cols.append(Column("busy_predicted", "Busy predicted", "milliseconds", lambda r, t: r.busy_predicted))
    return tuple(cols) + (
        Column("peak_bytes", "Peak measured", "bytes", lambda r, t: r.peak_bytes),
        Column("predicted_bytes", "Peak predicted", "bytes", lambda r, t: r.predicted_bytes),
        Column("error", "Error", "change", lambda r, t: r.error))


class RunTable(_Flat):
    """A pipeline run's table (``torchrun.RunResult``): a row per rank; ``when``: "first step" or
    "median"; ``predicted``: the plan has unit times (a busy-predicted column); ``notes``: the
    footer's (label, text) lines, which the run works out."""

    kind = "run"
    json_rows = "ranks"

    def __init__(self, ranks: tuple[RankRun, ...], when: str, predicted: bool,
                 notes: tuple[tuple[str, str], ...] = ()) -> None:
        self.ranks, self.when, self.predicted, self.notes = tuple(ranks), when, predicted, tuple(notes)

    def table_model(self, depth: int | None = None, columns=None, **_: Any) -> Table:
        return flat_table("run", "layerscope run", self, self.ranks, run_columns(self), name=lambda r: str(r.rank),
                          first_header="Rank", footer=tuple(Fact(k, v) for k, v in self.notes))

    def json_fields(self, **_: Any) -> tuple:
        return ("when", "predicted", ("ranks", "ranks", ("rank", "stages", "step_time", "busy", "busy_predicted",
                                                        "peak_bytes", "predicted_bytes", "error")),
                ("notes", lambda t, _: [{"label": k, "text": v} for k, v in t.notes]))
