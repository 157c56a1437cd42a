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
    than ``by``, which fits); "error" (the configuration cannot be built: ``why``); "refused" (a
    dimension it uses, context or expert parallel, is not applied by this build, or the simulation refuses
    the combination on these inputs, context parallel with a pipeline, say: ``why``, parallelize's or the
    simulation's own line; planning/search/refusals.py)."""

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
    # how the candidates simulated were evaluated (copies.py ``_Evaluator.used``): (("composed", n),
    # ("copies", n), ("whole", n)); empty where nothing was simulated
    used: tuple[tuple[str, int], ...] = ()

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
    more = "".join(f", {k} {v}" for k, v in (("cp", c.cp), ("ep", c.ep)) if v > 1)
    return f"tp {c.tp}, {dp}, pp {c.pp}" + (f" {c.schedule}" if c.pp > 1 else "") + more


def label(c: ParallelConfig) -> str:
    """A candidate's configuration in one line (its family, checkpointing, batches, resharding)."""
    batches = f"mbs {_mbs(c)}" + (f" x {c.microbatches} micro" if c.pp > 1 else f" x {c.accumulation} acc")
    return f"{family_of(c)}, ac {c.ac}, {batches}" + ("" if c.reshard_after_forward else ", no reshard")


def _cps(gpus: int, tp: int, seq: int | None) -> list[int]:
    """Context-parallel degrees: 1, and each ``cp`` > 1 dividing the ranks left by ``tp`` whose ``2 x cp``
    divides the sequence (torch's load balancing cuts each sequence into 2 x cp chunks, a rank taking the
    i-th and the (2 cp - 1 - i)-th: both must be whole); none but 1 where the input has no sequence."""
    if not seq:
        return [1]
    return [c for c in _divisors(gpus // tp) if c == 1 or seq % (2 * c) == 0]


def _eps(sparse: int, experts: int | None) -> list[int]:
    """Expert-parallel degrees: 1, and for a model with routed experts each divisor of the sparse region
    ``fsdp x cp x tp`` (the ranks EP borrows, torchtitan b5bcd76's mesh) that also divides the routed-expert
    count (each rank holds a whole number of experts, as torchtitan's expert sharding takes)."""
    if not experts:
        return [1]
    return [e for e in _divisors(sparse) if experts % e == 0]


def _batches(local: int, pp: int, fixed: Mapping[str, Any]) -> list[tuple[int, int, int]]:
    """(micro-batch size, micro-batches, accumulation) of the local batch, largest micro-batch first."""
    out = []
    for mbs in sorted(_divisors(local), reverse=True):
        m = local // mbs
        if pp > 1:
            if m < pp or fixed.get("microbatches", m) != m:
                continue
            out.append((mbs, m, 1))
        else:
            if fixed.get("accumulation", m) != m:
                continue
            out.append((mbs, 1, m))
    return out


def _held(fixed: Mapping[str, Any], key: str, values: list) -> list:
    return [fixed[key]] if key in fixed else values


def space(gpus: int, blocks: int, global_batch: int, *, gpus_per_node: int = 8, fixed: Mapping[str, Any] | None = None,
          base: Mapping[str, Any] | None = None, experts: int | None = None, seq: int | None = None
          ) -> list[ParallelConfig]:
    """Every configuration of the space (module docstring), with ``fixed`` fields held; ``base``: the
    other fields every candidate takes (precision, dtypes, offload); ``experts``: the model's routed
    experts (planning/moe.py; None: dense, no expert dimension); ``seq``: the input's sequence length
    (None: no context dimension). A combination ParallelConfig refuses is left out."""
    fixed = dict(fixed or {})
    base = dict(base or {})
    out = []
    for tp in _held(fixed, "tp", [t for t in _divisors(gpus_per_node) if gpus % t == 0]):
        for cp in _held(fixed, "cp", _cps(gpus, tp, seq)):
            pps = _held(fixed, "pp", [p for p in _divisors(gpus // (tp * cp)) if p <= blocks]
                        if gpus % (tp * cp) == 0 else [])
            for pp in pps:
                if gpus % (tp * pp * cp):
                    continue
                dp = gpus // (tp * pp * cp)
                if global_batch % dp:
                    continue
                out += _family_members(gpus, blocks, global_batch, (tp, cp, pp, dp), gpus_per_node, fixed, base,
                                       experts)
    return out


def _family_members(gpus: int, blocks: int, global_batch: int, degrees: tuple[int, int, int, int],
                    gpus_per_node: int, fixed: dict, base: dict, experts: int | None) -> list[ParallelConfig]:
    """The candidates of tensor, context and pipeline degrees ``(tp, cp, pp)`` over ``dp`` data-parallel
    ranks: each data-parallel layout, expert degree, schedule, resharding, checkpointing and batch split."""
    tp, cp, pp, dp = degrees
    out = []
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
        for ep in _held(fixed, "ep", _eps((dp // rep) * cp * tp, experts)):
            for sched in schedules:
                for reshard in _held(fixed, "reshard_after_forward", [False, True]):
                    for ac in _held(fixed, "ac", list(AC_SEARCHED)):
                        for mbs, m, acc in _batches(local, pp, fixed):
                            try:
                                cfg = ParallelConfig(gpus=gpus, gpus_per_node=gpus_per_node, tp=tp, pp=pp, cp=cp,
                                                     ep=ep, replicate=rep, fsdp=dp // rep, schedule=sched, ac=ac,
                                                     microbatches=m, accumulation=acc, local_batch=mbs * m,
                                                     global_batch=global_batch, reshard_after_forward=reshard,
                                                     **base)
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
