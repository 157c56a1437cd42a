"""The search's space: every configuration it tries (``space``), how a candidate is named, what it costs
the search's limit, and what became of it (``Candidate``, ``SearchResult``). How the search walks the space
and why: planning/search/space.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ...errors import InputError
from ..config import SCHEDULES, ParallelConfig, default_schedule
from ..simulate.results import ParallelPlan

__all__ = ["BLOCKS", "AC_SEARCHED", "SCHEDULES_SEARCHED", "Candidate", "SearchResult", "family_of", "label",
           "space", "WHOLE_BLOCKS"]


BLOCKS = (3, 4)                          # blocks per stage of the two simulated copies
AC_SEARCHED = ("none", "selective-op", "full")
SCHEDULES_SEARCHED = tuple(name for name, s in SCHEDULES.items() if s.searched)   # the table's, at import
_AC_MEMORY = {"full": 0, "selective-layer": 1, "selective-op": 1, "none": 2}   # more: more activations held


@dataclass(frozen=True)
class Candidate:
    """One configuration of the space and what became of it. ``status``: "fits"; "oom" (simulated, over
    the limit by ``over_bytes``); "oom-bound" (its sharded state alone is over: ``over_bytes`` at
    least); "dominated" (holds at least what ``by`` held, which did not fit); "slower" (cannot be faster
    than ``by``, which fits); "error" (the configuration cannot be built: ``why``)."""

    config: ParallelConfig
    status: str
    why: str
    plan: ParallelPlan | None = None      # simulated: per-rank memory and predicted step time
    over_bytes: int | None = None
    by: str | None = None                 # the candidate that proved a bound, by its label
    bound: float | None = None            # not simulated: its step is no shorter (seconds; planning/search/bounds.py)

    @property
    def step_time(self) -> float | None:
        return self.plan.step_time if self.plan is not None else None

    @property
    def peak_bytes(self) -> int | None:
        return self.plan.peak_bytes if self.plan is not None else None


@dataclass(frozen=True)
class SearchResult:
    candidates: tuple[Candidate, ...]     # fitting by step time, then the misses by excess, then the rest
    families: tuple[tuple[str, str], ...]  # (family, one line why it lost) for each family but the best's
    simulated: int                        # candidates simulated
    seconds: float
    global_batch: int
    limit_bytes: int
    for_bounds: int = 0                   # configurations simulated on two blocks for the bounds alone
    passes: int = 0                       # the limit's work done (_passes of the candidates simulated)
    max_passes: int | None = None         # the limit (None: none)

    @property
    def best(self) -> Candidate | None:
        return next((c for c in self.candidates if c.status == "fits"), None)

    @property
    def unsearched(self) -> tuple[Candidate, ...]:
        """The candidates the limit left that might be faster than the best (each not ruled out by a
        bound; with its step's lower bound where one was made)."""
        return tuple(c for c in self.candidates if c.status == "unsearched")

    @property
    def proven(self) -> bool:
        """The answer is the best of every configuration of the space: each other one was simulated, or
        ruled out by a bound or a dominance (what could not be built aside)."""
        return not self.unsearched and self.best is not None

    @property
    def least_bound(self) -> float | None:
        """The least step lower bound among the unsearched (seconds); None where none has one."""
        return min((c.bound for c in self.unsearched if c.bound is not None), default=None)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def family_of(c: ParallelConfig) -> str:
    """The family a candidate belongs to: its degrees, data-parallel layout and schedule."""
    dp = f"fsdp {c.fsdp}" + (f" x replicate {c.replicate}" if c.replicate > 1 else "")
    return f"tp {c.tp}, {dp}, pp {c.pp}" + (f" {c.schedule}" if c.pp > 1 else "")


def label(c: ParallelConfig) -> str:
    """A candidate's configuration in one line (its family, checkpointing, batches, resharding)."""
    batches = f"mbs {_mbs(c)}" + (f" x {c.microbatches} micro" if c.pp > 1 else f" x {c.accumulation} acc")
    return f"{family_of(c)}, ac {c.ac}, {batches}" + ("" if c.reshard_after_forward else ", no reshard")


def space(gpus: int, blocks: int, global_batch: int, *, gpus_per_node: int = 8, fixed: Mapping[str, Any] | None = None,
          base: Mapping[str, Any] | None = None) -> list[ParallelConfig]:
    """Every configuration of the space (module docstring), with ``fixed`` fields held; ``base``: the
    other fields every candidate takes (precision, dtypes, offload). A combination ParallelConfig
    refuses is left out."""
    fixed = dict(fixed or {})
    base = dict(base or {})
    out = []
    tps = [fixed["tp"]] if "tp" in fixed else [t for t in _divisors(gpus_per_node) if gpus % t == 0]
    for tp in tps:
        pps = [fixed["pp"]] if "pp" in fixed else [p for p in _divisors(gpus // tp) if p <= blocks]
        for pp in pps:
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            if global_batch % dp:
                continue
            local = global_batch // dp
            node = max(1, gpus_per_node // tp)
            layouts = [1] if dp <= node or dp % node else [1, dp // node]
            if "replicate" in fixed:
                layouts = [fixed["replicate"]]
            if "fsdp" in fixed:
                layouts = [r for r in layouts if dp // r == fixed["fsdp"]] or \
                    ([dp // fixed["fsdp"]] if dp % fixed["fsdp"] == 0 else [])
            schedules = [fixed.get("schedule", default_schedule())] if pp == 1 or "schedule" in fixed else \
                [name for name, s in SCHEDULES.items() if s.searched]
            for rep in layouts:
                for sched in schedules:
                    for reshard in ([fixed["reshard_after_forward"]] if "reshard_after_forward" in fixed
                                    else [False, True]):
                        for ac in [fixed["ac"]] if "ac" in fixed else list(AC_SEARCHED):
                            for mbs in sorted(_divisors(local), reverse=True):
                                m = local // mbs
                                if pp > 1:
                                    if m < pp or fixed.get("microbatches", m) != m:
                                        continue
                                    acc = 1
                                else:
                                    m, acc = 1, local // mbs
                                    if fixed.get("accumulation", acc) != acc:
                                        continue
                                try:
                                    cfg = ParallelConfig(gpus=gpus, gpus_per_node=gpus_per_node, tp=tp, pp=pp,
                                                         replicate=rep, fsdp=dp // rep, schedule=sched, ac=ac,
                                                         microbatches=m, accumulation=acc,
                                                         local_batch=mbs * m, global_batch=global_batch,
                                                         reshard_after_forward=reshard, **base)
                                except InputError:
                                    continue
                                if pp > 1 and not _simulable(cfg.stages, blocks):
                                    continue
                                out.append(cfg)
    return out


WHOLE_BLOCKS = 8       # a model of at most this many blocks is simulated whole in any pipeline


def _simulable(stages: int, blocks: int) -> bool:
    """A pipeline whose every stage holds more than the copies' blocks (so its figures can be extended
    from them), or a small model (simulated whole): a deep pipeline of a large model with a block or two
    per stage would be simulated whole, stage by stage and micro-batch by micro-batch (minutes each)."""
    return stages <= blocks and (stages * BLOCKS[1] < blocks or blocks <= WHOLE_BLOCKS)


def _passes(c: ParallelConfig) -> int:
    """What simulating ``c`` costs in the search's limit: passes of one micro-batch through one stage
    (an accumulation is simulated with two micro-steps, _Evaluator). Each pass runs on the copies with
    ``BLOCKS`` blocks a stage, so its seconds vary within a few times with the configuration: on the 70B
    Llama on a loaded 2-core machine, 15-35 s a pass without a pipeline, 21-29 s with one (interleaved,
    8 passes), 4-15 s a two-block copy for the bounds."""
    return c.stages * max(c.microbatches, min(c.accumulation, 2))


def _mbs(c: ParallelConfig) -> int:
    return (c.local_batch or 0) // c.microbatches
