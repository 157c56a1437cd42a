"""StagePlan: the chosen split, per stage cost and memory; its columns, header and footer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TextIO

from ..errors import InputError
from ..planning.config import SCHEDULES
from ..planning.split.plan import StageIndex
from .base import ReportRecord
from .notes import NotesField
from .table import OMIT, Column, Fact, Table, flat_table, select_columns

if TYPE_CHECKING:
    from ..planning.steptime.schedule import Timeline
    from ..planning.split.units import SplitUnits

__all__ = ["Stage", "StagePlan", "plan_columns"]


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
    #                                sends keep alive), kept_outputs (step(return_outputs=True));
    #                                boundary, working, inputs and targets (of the step), total (bytes)
    limit: int | None
    rank: int
    forward_time: float | None = None     # seconds per micro-batch (measured or predicted units' sums)
    backward_time: float | None = None
    send_time: float | None = None        # seconds to send one micro-batch's output to the next stage
    optimizer_time: float | None = None   # seconds of this stage's optimizer step
    weight_time: float | None = None      # zero bubble: of backward_time, the weights' gradients (W)

    @property
    def memory_bytes(self) -> int:
        return int(self.memory["total"])

    @property
    def label(self) -> str:
        """``3: h.4 .. h.7``: the stage first, then its first and last units."""
        names = self.units[0] if len(self.units) == 1 else f"{self.units[0]} .. {self.units[-1]}"
        return f"{self.index}: {names}"

    @property
    def activation_bytes(self) -> int:
        m = self.memory
        return int(m["activations"] + m["outputs"] + m["grad_overlap"] + m["sends"] + m.get("kept_outputs", 0)
                   + m.get("deferred", 0))


_COST_UNIT = {"memory": "bytes", "latency": "seconds", "roofline": "seconds"}
_TIME_COSTS = ("latency", "roofline")    # shown as the forward and backward time columns


def plan_columns(plan: "StagePlan") -> tuple[Column, ...]:
    """Every column of a plan. The cost column is left out when it is the FLOPs column again."""
    m = lambda key: (lambda s, p: s.memory[key])  # noqa: E731
    # a narrow terminal keeps what the plan is about longest: each stage's cost, its share, its
    # memory against the limit, then its params; the memory's parts and the unit count go first
    cols = [
        Column("rank", "Rank", "index", lambda s, p: s.rank, drop=5, default=False),
        Column("first_unit", "First unit", "text", lambda s, p: s.units[0], drop=6, default=False),
        Column("last_unit", "Last unit", "text", lambda s, p: s.units[-1], drop=6, default=False),
        Column("num_units", "#", "index", lambda s, p: len(s.units), drop=5),
        Column("params", "Params", "params", lambda s, p: s.params, drop=2),
        Column("flops", "FLOPs fwd+bwd", "count", lambda s, p: s.flops),
        Column("macs", "MACs fwd+bwd", "count", lambda s, p: s.macs, drop=5, default=False),
    ]
    if plan.by != "flops" and plan.by_name not in _TIME_COSTS:
        cols.append(Column("cost", f"Cost ({plan.by_name})", _COST_UNIT.get(plan.by_name, "count"),
                           lambda s, p: s.cost))
    if plan.timeline is not None:
        busy = plan.timeline.busy
        cols += [Column("forward_time", "Fwd time", "seconds", lambda s, p: s.forward_time, drop=4),
                 Column("backward_time", "Bwd time", "seconds", lambda s, p: s.backward_time, drop=4),
                 Column("send_time", "Send", "seconds", lambda s, p: s.send_time, drop=6, default=False),
                 Column("optimizer_time", "Optimizer", "seconds", lambda s, p: s.optimizer_time, drop=6,
                        default=False),
                 Column("busy", "Rank busy", "seconds", lambda s, p: busy[s.rank], drop=3)]
    total = sum(s.cost for s in plan.stages) or 1.0
    cols += [
        Column("share", "Share", "percent", lambda s, p: s.cost / total, drop=1),
        Column("memory", "Memory", "bytes", lambda s, p: s.memory_bytes),
        Column("state", "State", "bytes", m("state"), drop=3),
        Column("activations", "Activations", "bytes", lambda s, p: s.activation_bytes,
               suffix=lambda s, p: f" ({s.memory['held_microbatches']} mb)", drop=3),
        Column("boundary", "Boundary", "bytes", m("boundary"), drop=4),
        Column("working", "Working", "bytes", m("working"), drop=4),
        Column("limit", "Limit", "bytes", lambda s, p: s.limit,      # without a limit: "--", first to go
               drop=1 if any(s.limit is not None for s in plan.stages) else 6),
    ]
    keys = {c.key for c in cols}
    extra = sorted({k for s in plan.stages for k in s.memory} - keys - {"total", "held_microbatches", "peak_backward"})
    cols += [Column(f"memory_{k}", k.replace("_", " ").capitalize(), "bytes", m(k), drop=6, default=False)
             for k in extra]
    cols.append(Column("held_microbatches", "Held mb", "index", m("held_microbatches"), drop=6, default=False))
    return tuple(cols)


def plan_context(plan: "StagePlan") -> tuple[Fact, ...]:
    o = plan.options
    run = [f"schedule {plan.schedule}", f"{plan.microbatches} micro-batches"
           + (f" of {plan.units.micro_batch}" if plan.units.micro_batch else ""),
           f"optimizer {o['optimizer']}" if o.get("optimizer") else "no optimizer state",
           f"autocast {o['autocast']}" if o.get("autocast") else None,
           f"device {o['device']}" if o.get("device") else None]
    return (Fact("Run", ", ".join(x for x in run if x)),)


_AIM = {"step_time": "smallest predicted step time", "bottleneck": "smallest largest stage",
        "uniform": "equal repeated blocks per stage (torchtitan's default)", "given": "the cuts given"}


def plan_footer(plan: "StagePlan") -> tuple[Fact, ...]:
    unit = _COST_UNIT.get(plan.by_name, "count")
    lines = [Fact("Split", f"{len(plan.units)} units into {plan.num_stages} stages by {plan.by_name}: "
                           f"{_AIM[plan.objective]}"),
             Fact("Bottleneck", ((plan.bottleneck, unit),) + (
                 (" (lower bound total/K ", (plan.lower_bound, unit), ", ratio ", (plan.imbalance, "ratio3"), ")")
                 if plan.imbalance else ()))]
    t = plan.timeline
    if t is not None:
        lines.append(Fact("Step time", ((t.step_time, "seconds"), " predicted (pipeline ",
                                        (t.pipeline_time, "seconds"), ", bubble ", (t.bubble, "percent1"), ")")))
    if plan.split_points:
        lines.append(Fact("Split points", ", ".join(plan.split_points)))
    if plan.rank_bytes:
        lines.append(Fact("Rank memory", tuple(x for r, b in enumerate(plan.rank_bytes)
                                               for x in ((", " if r else "") + f"rank {r} ", (b, "bytes")))))
    for t in plan.units.ties:
        st = sorted({plan.stage_of(u) for u in t.units})
        if len(st) > 1:
            lines.append(Fact("Tied weights", f"{', '.join(t.names)} in stages {st} (gradients summed across "
                                              "them each step)"))
    lines += [Fact("Note", n) for n in plan.notes]
    return tuple(lines)


_STAGE_JSON = (
    ("stage", "index"), "rank", ("first_unit", lambda s, p: s.units[0]), ("last_unit", lambda s, p: s.units[-1]),
    ("units", lambda s, p: len(s.units)), "params", "flops", "macs", "cost",
    (None, lambda s, p: {f"memory_{k}": v for k, v in s.memory.items()}), ("limit_bytes", "limit"),
    "forward_time", "backward_time", "send_time", "optimizer_time",
    ("weight_time", lambda s, p: OMIT if s.weight_time is None else s.weight_time), ("unit_names", "units"),
)
PLAN_JSON = (
    ("model", "model_name"), ("by", "by_name"), "objective", "schedule", "microbatches", "stages_per_rank",
    ("micro_batch_size", lambda p, _: p.units.micro_batch), "step_time", "bubble",
    ("timeline", lambda p, _: p.timeline.to_dict() if p.timeline is not None else None), "bottleneck",
    "lower_bound", "imbalance", "split_points", "options", "notes", ("stages", "stages", _STAGE_JSON),
    ("units", lambda p, _: p.units.units), ("ties", lambda p, _: p.units.ties, ("names", "units", "state_bytes")),
)


class StagePlan(NotesField, ReportRecord, StageIndex):
    """Result of ``layerscope.partition``. Frozen; renderers only read it."""

    kind = "stage_plan"
    _html_part = "plan"
    json_rows = "stages"

    def __init__(self, *, units: "SplitUnits", stages: tuple[Stage, ...], by: str, schedule: str,
                 microbatches: int, bottleneck: float, options: dict, notes: tuple = (),
                 objective: str = "bottleneck", timeline: "Timeline | None" = None,
                 stages_per_rank: int = 2, rank_bytes: tuple[int, ...] | None = None) -> None:
        self.objective = objective
        self.rank_bytes = rank_bytes        # interleaved: each rank's peak over its stages
        self.timeline = timeline            # the simulated step, when the units have times
        # the schedules with several stages per rank (options.SCHEDULES)
        self.stages_per_rank = stages_per_rank if getattr(SCHEDULES.get(schedule), "multi", False) else 1
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
    def by_name(self) -> str:
        return self.by if isinstance(self.by, str) else "custom"

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def step_time(self) -> float | None:
        """Predicted seconds of one training step under the schedule (None without unit times)."""
        return self.timeline.step_time if self.timeline is not None else None

    @property
    def bubble(self) -> float | None:
        return self.timeline.bubble if self.timeline is not None else None

    @property
    def imbalance(self) -> float | None:
        """Bottleneck over the lower bound total/K (1.0 = perfectly balanced)."""
        if not self.lower_bound:
            return None
        return self.bottleneck / self.lower_bound

    # ---- views ----------------------------------------------------------------------------------
    def json_fields(self, **_: Any) -> tuple:
        return PLAN_JSON

    def table_model(self, depth: int | None = None, columns=None, **_: Any) -> Table:
        cols = plan_columns(self)
        cols = cols if columns == "all" else select_columns(cols, columns, InputError)
        return flat_table("stage_plan", f"layerscope split: {self.model_name}", self, self.stages, cols,
                          name=lambda s: s.label, first_header="Stage: units",
                          meta={"index_key": "stage", "timeline": self.timeline},
                          context=plan_context(self), footer=plan_footer(self))

    def table(self, depth: int | None = None, columns=None, width: int | None = None, **_: Any) -> str:
        return self._text(None, columns, True, width)

    def rich_table(self, columns=None, width: int | None = None, **_: Any):
        return self._rich(None, columns, True, width)

    def print(self, file: TextIO | None = None, columns=None, **_: Any) -> None:
        self._print(file, None, columns, True)

    def __repr__(self) -> str:
        step = f", step {self.step_time:.4g} s" if self.timeline is not None else ""
        return (f"StagePlan({self.model_name}, {self.num_stages} stages by {self.by_name}, "
                f"bottleneck {self.bottleneck:g}{step})")
