"""StagePlan: the chosen split, per stage cost and memory, rendered as a table, JSON or CSV."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, TextIO

from ..render.columns import _num
from ..render.csv import csv_text
from ..render.json import SCHEMA_VERSION
from ..render.output import ReportOutput, dataframe, print_report, write_text
from ..render.units import iec
from .units import SplitUnits

__all__ = ["Stage", "StagePlan"]


@dataclass(frozen=True, slots=True)
class Stage:
    index: int
    first: int                     # unit indices, inclusive
    last: int
    units: tuple[str, ...]
    cost: float                    # by the plan's cost measure
    flops: int                     # forward + backward
    macs: int
    params: int
    memory: dict                   # params, grads, optimizer, tied_dedup, state, held_microbatches,
    #                                peak_backward (the micro-batch whose backward is the peak), and at
    #                                that peak activations, outputs, grad_overlap, sends (tensors pending
    #                                sends keep alive); boundary, working, total (bytes)
    limit: int | None
    rank: int

    @property
    def memory_bytes(self) -> int:
        return int(self.memory["total"])


class StagePlan(ReportOutput):
    """Result of ``layerscope.partition``. Frozen; renderers only read it."""

    def __init__(self, *, units: SplitUnits, stages: tuple[Stage, ...], by: str, schedule: str,
                 microbatches: int, bottleneck: float, options: dict, notes: tuple[str, ...] = ()) -> None:
        self.units = units
        self.stages = stages
        self.by = by
        self.schedule = schedule
        self.microbatches = microbatches
        self.bottleneck = bottleneck
        self.total_cost = sum(s.cost for s in stages) if by != "memory" else None
        self.lower_bound = self.total_cost / len(stages) if self.total_cost is not None else None
        self.options = dict(options)
        self.notes = notes

    @property
    def model_name(self) -> str:
        return self.units.model_name

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def imbalance(self) -> float | None:
        """Bottleneck over the lower bound total/K (1.0 = perfectly balanced)."""
        if not self.lower_bound:
            return None
        return self.bottleneck / self.lower_bound

    @property
    def split_points(self) -> tuple[str, ...]:
        """Module path where each stage after the first begins (for SplitPoint.BEGINNING)."""
        return tuple(self.units.units[s.first].paths[0] for s in self.stages[1:])

    def stage_of(self, unit: int) -> int:
        for s in self.stages:
            if s.first <= unit <= s.last:
                return s.index
        raise IndexError(unit)

    # ---- rendering ------------------------------------------------------------------------------
    def _rows(self) -> tuple[list[str], list[list[str]]]:
        header = ["Stage", "Units", "#", "Params", "FLOPs fwd+bwd", f"Cost ({self._by_name()})", "Share",
                  "Memory", "State", "Activations", "Boundary", "Working", "Limit"]
        total = sum(s.cost for s in self.stages) or 1.0
        body = []
        for s in self.stages:
            names = s.units[0] if len(s.units) == 1 else f"{s.units[0]} .. {s.units[-1]}"
            m = s.memory
            body.append([str(s.index), names, str(len(s.units)), _num(s.params), _num(s.flops),
                         self._cost_str(s.cost), f"{100 * s.cost / total:.1f}%", iec(m["total"]),
                         iec(m["state"]),
                         f"{iec(m['activations'] + m['outputs'] + m['grad_overlap'] + m['sends'])} "
                         f"({m['held_microbatches']} mb)",
                         iec(m["boundary"]), iec(m["working"]), iec(s.limit) if s.limit else "--"])
        return header, body

    def _by_name(self) -> str:
        return self.by if isinstance(self.by, str) else "custom"

    def _cost_str(self, v: float) -> str:
        if self.by in ("memory",):
            return iec(int(v))
        if self.by == "latency":
            return f"{v * 1e3:.3f} ms"
        return _num(v)

    def _footer(self) -> list[tuple[str, str]]:
        lines = [("Split", f"{len(self.units)} units into {self.num_stages} stages by {self._by_name()}, "
                           f"schedule {self.schedule}, {self.microbatches} micro-batches"
                           + (f" of {self.units.micro_batch}" if self.units.micro_batch else "")),
                 ("Bottleneck", self._cost_str(self.bottleneck)
                  + (f" (lower bound total/K {self._cost_str(self.lower_bound)}, "
                     f"ratio {self.imbalance:.3f})" if self.imbalance else ""))]
        if self.split_points:
            lines.append(("Split points", ", ".join(self.split_points)))
        for t in self.units.ties:
            st = sorted({self.stage_of(u) for u in t.units})
            if len(st) > 1:
                lines.append(("Tied weights", f"{', '.join(t.names)} in stages {st} (gradients summed "
                                              "across them each step)"))
        for n in self.notes:
            lines.append(("Note", n))
        return lines

    def table(self, **_: Any) -> str:
        from ..render.text import text_table
        header, body = self._rows()
        return text_table(header, body, self._footer())

    def rich_table(self):
        from ..render.table import rich_table
        header, body = self._rows()
        return rich_table(f"{self.model_name}: pipeline plan", header, body, self._footer())

    def print(self, file: TextIO | None = None, **_: Any) -> None:
        print_report(self.rich_table, self.table, file)

    def __repr__(self) -> str:
        return (f"StagePlan({self.model_name}, {self.num_stages} stages by {self._by_name()}, "
                f"bottleneck {self._cost_str(self.bottleneck)})")

    def stage_row(self, s: Stage) -> dict[str, Any]:
        return {"stage": s.index, "rank": s.rank, "first_unit": s.units[0], "last_unit": s.units[-1],
                "units": len(s.units), "params": s.params, "flops": s.flops, "macs": s.macs,
                "cost": s.cost, **{f"memory_{k}": v for k, v in s.memory.items()},
                "limit_bytes": s.limit}

    def to_dict(self) -> dict[str, Any]:
        return {"schema_version": SCHEMA_VERSION, "kind": "stage_plan", "model": self.model_name,
                "by": self._by_name(), "schedule": self.schedule, "microbatches": self.microbatches,
                "micro_batch_size": self.units.micro_batch, "bottleneck": self.bottleneck,
                "lower_bound": self.lower_bound, "imbalance": self.imbalance,
                "split_points": list(self.split_points), "options": self.options, "notes": list(self.notes),
                "stages": [{**self.stage_row(s), "unit_names": list(s.units)} for s in self.stages],
                "units": [_unit_dict(u) for u in self.units.units],
                "ties": [{"names": list(t.names), "units": list(t.units), "state_bytes": t.state_bytes}
                         for t in self.units.ties]}

    def to_csv(self, path: str | None = None) -> str:
        rows = [self.stage_row(s) for s in self.stages]
        return write_text(csv_text(list(rows[0]), rows), path)

    def to_dataframe(self):
        return dataframe(self.stage_row(s) for s in self.stages)

    _html_part = "plan"

    def _html_rows(self, depth):
        return (*self._rows(), self._footer())


def _unit_dict(u) -> dict[str, Any]:
    d = asdict(u)
    d["forward"] = asdict(u.forward)
    d["backward"] = asdict(u.backward)
    d["paths"] = list(u.paths)
    return d
